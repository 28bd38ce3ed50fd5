"""The ablation's spread within arms and the seeds a test would need: each run's frames to
reward_100 -15, the standard deviation within each arm whose runs to 400k all reached it, pooled,
and, in a normal approximation (two-sided, power 0.8), the seeds an arm needed to tell a gap of
30k, 60k and 125k frames between two arms at p 0.05 and 0.005. Run from the repository root:
python results/cpu-intel-xeon-amx-2c-sweep-08-ablation/spread.py
"""

import glob
import os
import statistics
import sys

sys.path.insert(0, os.getcwd())
from lib.analysis import reference, run_folders  # noqa: E402

RUNS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "runs")
Z_POWER = 0.8416  # the normal quantile of power 0.8


def main() -> None:
    arms: dict[str, list[int | None]] = {}
    for folder in sorted(glob.glob(os.path.join(RUNS, "*", ""))):
        arm = os.path.basename(folder.rstrip("/")).split("-")[0].split("+")[1]
        frames, minutes, values = run_folders.load_curve(folder)
        played = run_folders.played_frames(folder) or (frames[-1] if frames else 0)
        (reached,), _ = reference.marks(frames, minutes, values, [-15.0], played)
        arms.setdefault(arm, []).append(reached[0] if reached else None)
    squares, dof = 0.0, 0
    for arm, runs in arms.items():
        print(f"{arm}: frames to -15 by seed {runs}")
        if None in runs or len(runs) < 2:
            continue
        mean = statistics.mean(runs)
        squares += sum((r - mean) ** 2 for r in runs)
        dof += len(runs) - 1
    sd = (squares / dof) ** 0.5
    print(f"pooled standard deviation within arms: {sd:.0f} frames ({dof} degrees of freedom)")
    for alpha, z in (("0.05", 1.96), ("0.005", 2.807)):
        for gap in (30_000, 60_000, 125_000):
            print(f"p {alpha}, power 0.8, a gap of {gap}: {2 * (z + Z_POWER) ** 2 * (sd / gap) ** 2:.1f} seeds an arm")


if __name__ == "__main__":
    main()

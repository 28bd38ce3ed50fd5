"""For each run folder given: the first frame after the first train steps at which the logged
TD loss fell below LEVEL (default 0.015), the loss's mean up to 15k frames, and the run's last
logged frame. Reads TensorBoard event files only.

    python results/investigations/cpu-amd-epyc-avx512bf16-2c-01-loss/first_loss_drop.py RUN_DIR ... [--level 0.015]
"""

import argparse

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

p = argparse.ArgumentParser()
p.add_argument("runs", nargs="+")
p.add_argument("--level", type=float, default=0.015)
args = p.parse_args()
print(f"| run | last frame | loss, mean to 15k | first frame with loss < {args.level:g} |")
print("|---|---:|---:|---:|")
for run in args.runs:
    acc = EventAccumulator(run, size_guidance={"scalars": 0})
    acc.Reload()
    points = acc.Scalars("loss")
    # The first point holds the first train step or few alone: it is left out.
    later = points[1:]
    first = next((e.step for e in later if e.value < args.level), None)
    early = [e.value for e in points if e.step <= 15000]
    mean = sum(early) / len(early) if early else float("nan")
    print(f"| {run} | {points[-1].step} | {mean:.4f} | {first if first is not None else 'never'} |")

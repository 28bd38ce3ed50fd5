"""Learning curves of finished or running training runs, and when each reached a level.

``python -m lib.curves RUN_DIR [RUN_DIR ...] --out PNG [--levels -15 0 18] [--labels ...]``

Reads the TensorBoard event files of each run folder and draws ``reward_100`` (the mean
score of the last 100 games) against frames (agent steps, the scalars' step) and against
wall-clock minutes (event wall time minus the run's first event, i.e. the writer's start, so
that replay warm-up counts) in two side-by-side panels, one line per run. A folder without
event files of its own stands for its sub-folders that have some (a ``--run-dir`` root).

Lines are labelled by the run's stage from summary.json (written when a run ends), else by
the folder name; ``--labels`` overrides both, in the order the runs are listed.

It also writes, next to the PNG with the same stem and ``.md``, and prints, a Markdown
table of the frames and minutes at which ``reward_100`` first reached (>=) each level, "—"
where it never did. A resumed run's minutes include the time between its sessions.

Bad input (a missing folder, a folder with no runs, an output that cannot be written) ends
the program with one line on stderr and exit code 2. This module does not import torch.
"""

from __future__ import annotations

import glob
import json
import os
import sys

from lib import cli
from lib.cli import UsageError

TAG = "reward_100"
NEVER = "—"


def _has_events(folder: str) -> bool:
    return bool(glob.glob(os.path.join(folder, "events.out.tfevents.*")))


def find_runs(paths: list[str]) -> list[str]:
    """Run folders for the given paths: the path itself if it holds event files, else its
    sub-folders that do (sorted by name)."""
    runs = []
    for path in paths:
        if not os.path.isdir(path):
            raise UsageError(f"{path}: no such folder")
        if _has_events(path):
            runs.append(path)
            continue
        subs = sorted(os.path.join(path, d) for d in os.listdir(path))
        subs = [d for d in subs if os.path.isdir(d) and _has_events(d)]
        if not subs:
            raise UsageError(f"{path}: no TensorBoard event files in it or in its sub-folders")
        runs.extend(subs)
    return runs


def run_label(folder: str) -> str:
    """``stage NN`` from the run's summary.json, else the folder name."""
    try:
        with open(os.path.join(folder, "summary.json")) as f:
            stage = json.load(f).get("stage")
        if stage:
            return f"stage {stage}"
    except (OSError, ValueError, AttributeError):
        pass
    return os.path.basename(os.path.normpath(folder))


def load_curve(folder: str) -> tuple[list[int], list[float], list[float]]:
    """(frames, minutes, reward_100) of one run, in step order; empty lists if the run has
    not logged reward_100 yet."""
    from tensorboard.backend.event_processing import event_accumulator as ea

    acc = ea.EventAccumulator(folder, size_guidance={ea.SCALARS: 0})  # 0: keep every point
    acc.Reload()
    if TAG not in acc.Tags().get("scalars", []):
        return [], [], []
    events = sorted(acc.Scalars(TAG), key=lambda e: e.step)
    try:
        start = acc.FirstEventTimestamp()
    except ValueError:
        start = min(e.wall_time for e in events)
    frames = [int(e.step) for e in events]
    minutes = [(e.wall_time - start) / 60.0 for e in events]
    values = [float(e.value) for e in events]
    return frames, minutes, values


def first_reach(frames, minutes, values, level: float):
    """(frames, minutes) of the first point with reward_100 >= level, or None."""
    for f, m, v in zip(frames, minutes, values):
        if v >= level:
            return f, m
    return None


def markdown_table(rows: list[tuple[str, str, list]], levels: list[float]) -> str:
    """rows: (label, folder name, [first_reach result per level])."""
    head = ["run", "folder"]
    for level in levels:
        head += [f"frames to {level:g}", f"minutes to {level:g}"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] * 2 + ["---:"] * (2 * len(levels))) + "|"]
    for label, name, reached in rows:
        cells = [label, name]
        for hit in reached:
            cells += [NEVER, NEVER] if hit is None else [str(hit[0]), f"{hit[1]:.1f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(curves: list[tuple[str, list, list, list]], levels: list[float], out: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 4.5), layout="constrained")
    by_frames, by_minutes = fig.subplots(1, 2, sharey=True)
    for label, frames, minutes, values in curves:
        (line,) = by_frames.plot(frames, values, label=label)
        by_minutes.plot(minutes, values, label=label, color=line.get_color())
    for ax in (by_frames, by_minutes):
        for level in levels:
            ax.axhline(level, color="grey", linewidth=0.6, linestyle=":")
        ax.grid(alpha=0.3)
    by_frames.set_xlabel("frames (agent steps)")
    by_minutes.set_xlabel("wall-clock minutes")
    by_frames.set_ylabel("reward_100 (mean score of the last 100 games)")
    by_frames.legend(loc="best")
    fig.savefig(out, format="png", dpi=100)


def _check_output(out: str) -> None:
    """The PNG's folder must exist or be creatable, and be writable; nothing is created here."""
    target = os.path.abspath(out)
    if os.path.isdir(target):
        raise UsageError(f"--out {out}: is a folder")
    cli.check_writable_dir(os.path.dirname(target), "--out")


def _parse(argv):
    p = cli.Parser(prog="curves", description="reward_100 against frames and wall-clock minutes, per run")
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run folder, or a folder of run folders")
    p.add_argument("--out", required=True, metavar="PNG", help="the figure; the table goes next to it as .md")
    p.add_argument("--levels", nargs="+", type=float, default=[-15.0, 0.0, 18.0], help="reward_100 levels")
    p.add_argument("--labels", nargs="+", default=None, help="one label per run, in order")
    return p.parse_args(argv)


def _main(argv) -> int:
    args = _parse(argv)
    _check_output(args.out)
    runs = find_runs(args.runs)
    if args.labels is not None and len(args.labels) != len(runs):
        raise UsageError(f"--labels: {len(args.labels)} labels for {len(runs)} runs ({', '.join(runs)})")
    labels = args.labels or [run_label(r) for r in runs]

    curves, rows = [], []
    for folder, label in zip(runs, labels):
        frames, minutes, values = load_curve(folder)
        if not frames:
            print(f"curves: {folder}: no {TAG} points yet", file=sys.stderr)
        curves.append((label, frames, minutes, values))
        reached = [first_reach(frames, minutes, values, level) for level in args.levels]
        rows.append((label, os.path.basename(os.path.normpath(folder)), reached))

    table = markdown_table(rows, args.levels)
    md_path = os.path.splitext(args.out)[0] + ".md"
    try:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        plot(curves, args.levels, args.out)
        with open(md_path, "w") as f:
            f.write(table + "\n")
    except OSError as e:
        raise UsageError(f"--out {args.out}: cannot write ({e.strerror or e})")
    print(table)
    print(f"\nwrote {args.out} and {md_path}")
    return 0


def main(argv=None) -> int:
    try:
        return _main(argv)
    except UsageError as e:
        return cli.usage_exit("curves", e)


if __name__ == "__main__":
    sys.exit(main())

"""What a run leaves at its end: ``summary.json`` and its exit lines, TIME (time by part,
``lib.run.timing``) then RESULT, the line the bench and the sweep read."""

from __future__ import annotations

import dataclasses
import datetime
import sys
import time

import numpy as np
import torch

from lib.run.probes.weights_age import ONE_PROCESS_AGE
from lib.run.stages import STAGES
from lib.run.timing import flat


def summary(run, interrupted: str | None, error: str | None, times: dict) -> dict:
    """summary.json of ``run`` (a ``lib.run.runner.Run``); ``times``: its time by part (``RunClocks.figures``)."""
    mean = run.tracker.mean_reward
    total = run.run_seconds()
    return {
        "stage": run.stage,
        "game": run.game,
        "env": run.params.env_name,
        "seed": run.args.seed,
        "device": str(run.device),
        "frames": run.frame_idx,
        "start_frame": run.start_frame,
        "train_frames": run.speed.frames(run.frame_idx),
        "seconds": round(time.perf_counter() - run._started, 3),
        "run_seconds": None if total is None else round(total, 3),
        "fps": round(run.speed.fps(run.frame_idx), 2),
        "solved": run.solved_flag,
        "mean_reward": None if np.isnan(mean) else round(mean, 3),
        "games": len(run.tracker.rewards),
        "units": run.probes["dead_units"].check.summary(),  # the net's active units at the last check
        "weights_age": run.probes["weights_age"].summary() if "weights_age" in run.probes else ONE_PROCESS_AGE,
        "interrupted": interrupted,
        "error": error,
        "stdout_dropped": run.stdout.dropped if run.stdout is not None else 0,  # lines: a full pipe, a reader gone
        "params": dataclasses.asdict(run.params),
        "knobs": {name: getattr(run.args, name) for name in STAGES[run.stage].knobs},  # as this process ran
        "resumed": run.ckpt is not None,  # this process went on from a checkpoint (at start_frame), or started afresh
        "changed": {name: list(pair) for name, pair in run.changed.items()},  # on resume: [saved, given again]
        "resumes": run.resumes,  # every resume so far, in order: {frame, changed, ring, date}
        "settings": run.settings.record(),  # what the run ran with, decided once (``lib.run.settings``)
        "argv": sys.argv,
        "commit": run.commit,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "time": times,
    }


def exit_lines(run, summary: dict, interrupted: str | None, failed: bool) -> list[str]:
    """The TIME line, then the RESULT line (the run's last)."""
    mean = run.tracker.mean_reward
    line = (
        f"RESULT stage={run.stage} game={run.game} frames={run.frame_idx} seconds={summary['seconds']:.1f} "
        f"fps={summary['fps']:.1f} solved={'yes' if run.solved_flag else 'no'} mean_reward={mean:.3f}"
    )
    units = run.probes["dead_units"].check
    if units.ended:
        line += f" dead={units.dead['layer']}"
    if interrupted:
        line += f" interrupted={interrupted}"
    if failed:
        line += " error=yes"
    return [time_line(run.stage, summary["time"]), line]


def time_line(stage: str, figures: dict) -> str:
    """The exit line: ``TIME stage=03 bound=trainer:step play.env=1.23 ... trainer.wall=4.56``
    (seconds per 1,000 frames; a process's parts, ``other`` included, add up to its ``wall``)."""
    if figures["frames"] <= 0:
        return f"TIME stage={stage} bound=none frames=0"
    parts = " ".join(f"{name}={value:.2f}" for name, value in flat(figures).items())
    return f"TIME stage={stage} bound={figures['bound']} {parts}"

"""What a run leaves at its end: ``summary.json`` and its exit lines, TIME (time by part,
``lib.run.timing``) then RESULT, the line the bench and the sweep read."""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import sys
import time

import numpy as np
import torch

from lib.run.checkpoint import atomic_write
from lib.run.cli import DeviceError, RunError, WriteError, say
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


def close(run, interrupted: str | None = None, error: str | None = None) -> tuple[dict, str | None]:
    """End the children, take the last checkpoint (unless the run failed), flush TensorBoard
    and write the summary and the TIME and RESULT lines. Returns (the summary, the first write failure)."""
    times = run.probes["time_by_part"].figures(run.frame_idx)  # before the play process stops
    run.stop_children()
    failed = None
    try:
        run.best.write()  # the newest best is never lost at the end
        if run.solved_flag and "net" in run.saveables:
            run.save_model("model.pt")  # the net the run ends with, as its checkpoint holds it
    except (WriteError, DeviceError) as e:
        failed = _failed(run, e)
    if run.args.save_every and not (error or run.fault) and run.saveables and run.frame_idx > run._last_save:
        try:
            run.save_checkpoint()  # the end of a run, or the last complete frame before a signal
        except (WriteError, DeviceError) as e:
            failed = failed or _failed(run, e)
    try:
        run.tracker.flush_loss()  # a failed device loses its last loss point, not the summary
    except (WriteError, DeviceError) as e:
        failed = failed or _failed(run, e)
    try:
        for probe in run.probes.values():
            probe.end(run.frame_idx)
        run.writer.close()
    except WriteError as e:
        failed = failed or str(e)
    error = error or failed
    record = summary(run, interrupted, error, times)
    written = _write_summary(run, record)
    failed = failed or written
    for line in exit_lines(run, record, interrupted, bool(error or failed)):
        say(line)
    if written is None and run.stdout is not None and run.stdout.dropped > record["stdout_dropped"]:
        record["stdout_dropped"] = run.stdout.dropped  # the exit lines too: the summary says so
        failed = failed or _write_summary(run, record)
    return record, failed


def _failed(run, error: RunError) -> str:
    """What ``close`` says of a failure; a device's is kept as ``fault`` (the exit code is 1, not 74)."""
    if isinstance(error, DeviceError):
        run.fault = run.fault or str(error)
    return str(error)


def _write_summary(run, summary: dict) -> str | None:
    """Write summary.json; the failure, if it could not be written."""
    try:
        data = json.dumps(summary, indent=2).encode()
        atomic_write(os.path.join(run.folder, "summary.json"), lambda f: f.write(data))
    except WriteError as e:
        return str(e)
    return None

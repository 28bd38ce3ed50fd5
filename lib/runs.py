"""Run folders as the curves read them: which folders hold runs, what a run is (stage, game,
seed, from its summary.json or its folder name), and its ``reward_100`` curve from its
TensorBoard event files, against frames and against minutes.

Frames are agent steps (the scalars' step); minutes are event wall time minus the run's first
event (the writer's start, so that replay warm-up counts), with or without the time between a
resumed run's sessions. An event file that cannot be read to its end (random bytes, a record
that fails its checksum; TensorBoard's reader stops there without a word) is named
(``unreadable``), and the points read before it are used. This module does not import torch.
"""

from __future__ import annotations

import glob
import json
import os
import re

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


def event_file_problem(path: str) -> str | None:
    """Why TensorBoard's reader stops short in the event file ``path`` (it says nothing), or
    None. A last record cut short is no problem: a run still going is writing it."""
    from tensorboard.compat.tensorflow_stub import errors
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import PyRecordReader_New

    try:
        reader = PyRecordReader_New(path)
    except Exception as e:
        return f"cannot be opened ({type(e).__name__})"
    records = 0
    try:
        while True:
            reader.GetNext()
            records += 1
    except errors.OutOfRangeError:
        return None
    except errors.DataLossError as e:
        if "truncated" in str(e) and records:
            return None
        why = str(e).replace(path, "").strip()
        return f"is not an event file ({why})" if not records else f"cannot be read past record {records} ({why})"
    finally:
        reader.file_handle.close()


def unreadable(runs: list[str]) -> list[tuple[str, str]]:
    """(path, why) of each event file of ``runs`` that cannot be read to its end; ``why`` goes
    after the path ("is not an event file (...)")."""
    out = []
    for folder in runs:
        for path in sorted(glob.glob(os.path.join(folder, "events.out.tfevents.*"))):
            why = event_file_problem(path)
            if why:
                out.append((path, why))
    return out


def unreadable_lines(bad: list[tuple[str, str]]) -> list[str]:
    """One line per unreadable event file, for stderr and the Markdown."""
    return [f"Not read: {path} {why}." for path, why in bad]


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


def _session_gaps(folder: str) -> list[tuple[float, float]]:
    """(start, seconds idle before it) of each session of a run after its first: the time from
    the last event the earlier sessions wrote to the first event of this one."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    spans = []
    for path in glob.glob(os.path.join(folder, "events.out.tfevents.*")):
        first = last = None
        for event in EventFileLoader(path).Load():
            first = event.wall_time if first is None else first
            last = event.wall_time
        if first is not None:
            spans.append((first, last))
    spans.sort()
    gaps, end = [], spans[0][1] if spans else 0.0
    for first, last in spans[1:]:
        if first > end:
            gaps.append((first, first - end))
        end = max(end, last)
    return gaps


def load_curve(folder: str, between_sessions: bool = True) -> tuple[list[int], list[float], list[float]]:
    """(frames, minutes, reward_100) of one run, in step order; empty lists if the run has
    not logged reward_100 yet. ``between_sessions=False``: minutes leave out the time between
    a resumed run's sessions."""
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
    gaps = [] if between_sessions else _session_gaps(folder)
    minutes = [(e.wall_time - start - sum(g for s, g in gaps if s <= e.wall_time)) / 60.0 for e in events]
    values = [float(e.value) for e in events]
    return frames, minutes, values


def first_reach(frames, minutes, values, level: float):
    """(frames, minutes) of the first point with reward_100 >= level, or None."""
    for f, m, v in zip(frames, minutes, values):
        if v >= level:
            return f, m
    return None


_RUN_NAME = re.compile(r"^(\d\d)-([a-z0-9]+)-seed(\d+)(?:-|$)")


def run_identity(folder: str) -> dict | None:
    """{stage, game, seed, solved} from the run's summary.json, else from its folder name
    (``<stage>-<game>-seed<N>...``, solved unknown: False); None when neither tells."""
    try:
        with open(os.path.join(folder, "summary.json")) as f:
            s = json.load(f)
        if s.get("stage") and s.get("game") and s.get("seed") is not None:
            return {
                "stage": str(s["stage"]),
                "game": str(s["game"]),
                "seed": int(s["seed"]),
                "solved": bool(s.get("solved")),
            }
    except (OSError, ValueError, AttributeError, TypeError):
        pass
    m = _RUN_NAME.match(os.path.basename(os.path.normpath(folder)))
    if m:
        return {"stage": m.group(1), "game": m.group(2), "seed": int(m.group(3)), "solved": False}
    return None

"""Run folders as the curves read them: which folders hold runs, what a run is (stage, game,
seed, from its summary.json or its folder name), and its ``reward_100`` curve from its
TensorBoard event files, against frames and against minutes.

Frames are agent steps (the scalars' step); minutes are training minutes: event wall time
minus the writer's start (so that replay warm-up counts), a resumed sitting starting where the
sittings before it reached its resume frame, as the run's ``run_seconds`` counts them; the time
between sittings is left out. An event file that cannot be read to its end (random bytes, a record
that fails its checksum; TensorBoard's reader stops there without a word) is named
(``unreadable``), and the points read before it are used. This module does not import torch.
"""

from __future__ import annotations

import glob
import json
import os
import re

from lib.run.cli import UsageError

TAG = "reward_100"
NEVER = "—"
# Logged once by each resumed sitting at its resume frame (``lib.run.checkpoint.restore``): 1 where
# the checkpoint's replay ring came back, 0 where the buffer is refilled before training goes on.
RESUME_TAG = "resume_ring"
# The line a resumed stage prints (``lib.run.runner``), which a sweep's run.log keeps: how the ring
# of a sitting whose event file predates RESUME_TAG is known.
_RESUME_LINE = re.compile(r"^resuming \S+ \S+ at frame (\d+): (with its replay buffer|the replay buffer is refilled)")


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
    """``stage NN`` from the run's summary.json (``stage NN+ARM`` in a sweep's arm), else the folder name."""
    try:
        with open(os.path.join(folder, "summary.json")) as f:
            stage = json.load(f).get("stage")
        if stage:
            m = _RUN_NAME.match(os.path.basename(os.path.normpath(folder)))
            return f"stage {stage}{(m.group(2) or '') if m else ''}"
    except (OSError, ValueError, AttributeError):
        pass
    return os.path.basename(os.path.normpath(folder))


def _scalar(value) -> float:
    """A scalar summary value, written as ``simple_value`` or as a one-element tensor."""
    if value.WhichOneof("value") == "tensor":
        from tensorboard.util.tensor_util import make_ndarray

        return float(make_ndarray(value.tensor).reshape(-1)[0])
    return float(value.simple_value)


def _sessions(folder: str) -> list[dict]:
    """The sittings of a run, one per event file, in the order they began: for each, its
    first event's wall time (the writer's start), the frame it resumed from (None for a first
    sitting, or where the file does not say), its (step, wall time) of every event, and its
    ``reward_100``, ``speed`` and ``resume_ring`` points as (step, wall time, value).

    A resumed sitting's writer is made with ``purge_step`` = resume frame + 1 (``lib.run.runner``),
    which writes a session-log START at that step: that is how a file tells where it resumed."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.compat.proto.event_pb2 import SessionLog

    sessions = []
    for path in glob.glob(os.path.join(folder, "events.out.tfevents.*")):
        s = {"start": None, "resumed": None, "times": [], TAG: [], "speed": [], RESUME_TAG: []}
        for event in EventFileLoader(path).Load():
            s["start"] = event.wall_time if s["start"] is None else s["start"]
            kind = event.WhichOneof("what")
            if kind == "session_log" and event.session_log.status == SessionLog.START and event.step > 0:
                s["resumed"] = int(event.step) - 1
            elif kind == "summary":
                s["times"].append((int(event.step), event.wall_time))
                for value in event.summary.value:
                    if value.tag in (TAG, "speed", RESUME_TAG):
                        s[value.tag].append((int(event.step), event.wall_time, _scalar(value)))
        if s["start"] is not None:
            sessions.append(s)
    return sorted(sessions, key=lambda s: s["start"])


def _seconds_to(session: dict, frame: int) -> float:
    """Seconds from a sitting's start until it reached ``frame``: interpolated between its events
    on either side, its last event's time where it logged nothing past the frame."""
    times = sorted(session["times"])
    before = [(f, t) for f, t in times if f <= frame]
    after = [(f, t) for f, t in times if f > frame]
    if not after:
        return (times[-1][1] if times else session["start"]) - session["start"]
    f1, t1 = after[0]
    f0, t0 = before[-1] if before else (frame, session["start"])
    t = t0 if f1 == f0 else t0 + (t1 - t0) * (frame - f0) / (f1 - f0)
    return t - session["start"]


def _stitched(folder: str, tag: str) -> list[tuple[int, float, float, int]]:
    """``stitched``'s points, each with the frame its sitting began at (0 for the first)."""
    points: list[tuple[int, float, float, int]] = []
    offset, previous, end = 0.0, None, None
    for session in _sessions(folder):
        began = 0
        if previous is not None:
            if session["resumed"] is None:
                offset += end - previous["start"]
                began = max((p[0] for p in points), default=0)
            else:
                points = [p for p in points if p[0] <= session["resumed"]]
                offset += _seconds_to(previous, session["resumed"])
                began = session["resumed"]
        points += [(f, offset + t - session["start"], v, began) for f, t, v in session[tag]]
        previous = session
        end = max([t for _, t in session["times"]] + [session["start"]])
    return sorted(points, key=lambda p: p[0])


def stitched(folder: str, tag: str = TAG) -> list[tuple[int, float, float]]:
    """(frame, seconds of training, value) of ``tag`` over all the run's sittings, in step order.

    Seconds count as the run's ``run_seconds`` does: a sitting that resumed from frame r starts
    at the time the sittings before it had taken to reach frame r, and their points past r (the
    frames played again) are dropped, as TensorBoard drops them. The time between sittings is
    not counted. A sitting whose file does not say where it resumed continues from the last
    event the sittings before it wrote."""
    return [p[:3] for p in _stitched(folder, tag)]


def load_curve(folder: str) -> tuple[list[int], list[float], list[float]]:
    """(frames, minutes, reward_100) of one run, in step order; empty lists if the run has
    not logged reward_100 yet. Minutes are training minutes over all its sittings (``stitched``)."""
    points = stitched(folder)
    return [p[0] for p in points], [p[1] / 60.0 for p in points], [p[2] for p in points]


def phase_fps(folder: str, spans: list[tuple[int, int | None]], warmup: int = 0) -> list[float | None]:
    """Agent steps per second of training in each span (start, end): over the games that ended
    past frame ``start`` and at or before ``end`` (None: no end), over all sittings, from the
    ``speed`` each game logged (the frames since the game before it over the seconds since then).
    A game counts when the game before it ended in the same sitting, ``warmup`` frames or more
    after the sitting began (a resumed sitting refills its replay buffer without training first).
    None for a span where no game counts. The event files are read once for all the spans."""
    totals = [[0.0, 0.0] for _ in spans]  # frames, seconds
    last = None
    for frame, _, speed, began in _stitched(folder, "speed"):
        if speed > 0 and last is not None and last >= began + warmup:
            for (start, end), total in zip(spans, totals):
                if frame > start and (end is None or frame <= end):
                    total[0] += frame - last
                    total[1] += (frame - last) / speed
        last = frame
    return [frames / seconds if seconds > 0 else None for frames, seconds in totals]


def _logged_rings(folder: str) -> dict[int, bool]:
    """Resume frame -> whether the ring came back, from the stage's resume lines in the folder's
    run.log (a sweep's; the last line for a frame wins); empty where there is none."""
    rings = {}
    try:
        with open(os.path.join(folder, "run.log"), errors="replace") as f:
            for line in f:
                m = _RESUME_LINE.match(line)
                if m:
                    rings[int(m.group(1))] = m.group(2) == "with its replay buffer"
    except OSError:
        pass
    return rings


def resumes(folder: str) -> list[tuple[int, bool | None]]:
    """(frame, ring) of each resume the run's record keeps, in frame order: the sittings that
    went on from a checkpoint, less those a later sitting resumed at or before (their frames
    were played again). ``ring``: True where the checkpoint's replay ring came back, False where
    the buffer was refilled, from the sitting's ``resume_ring`` scalar, else from the run.log
    line of that frame; None where neither says (a sitting stopped before it restored its
    checkpoint says nothing)."""
    logged, kept = None, []
    for session in _sessions(folder):
        frame = session["resumed"]
        if frame is None:
            continue
        kept = [r for r in kept if r[0] < frame]
        if session[RESUME_TAG]:
            ring = session[RESUME_TAG][-1][2] > 0
        else:
            logged = _logged_rings(folder) if logged is None else logged
            ring = logged.get(frame)
        kept.append((frame, ring))
    return kept


def untrained_frames(resumed: list[tuple[int, bool | None]], replay_initial: int, last_frame: int) -> int | None:
    """Frames a run played untrained after its resumes (``resumes``): after one without its
    ring, ``replay_initial`` (the refill), or fewer where the next resume or the run's
    ``last_frame`` came first; after one with its ring, none. None where a resume that played
    frames does not say whether its ring came back."""
    total = 0
    for i, (frame, ring) in enumerate(resumed):
        end = resumed[i + 1][0] if i + 1 < len(resumed) else last_frame
        played = max(0, min(replay_initial, end - frame))
        if ring is None and played:
            return None
        total += 0 if ring else played
    return total


def first_reach(frames, minutes, values, level: float):
    """(frames, minutes) of the first point with reward_100 >= level that follows a point below
    it, or None. A curve's first points are the means of a game or two, not of 100: a run that
    starts at or above a level (a first game of -19, say) has not reached it until it has been
    below it and risen again, so that a run that collapsed at once does not read as a success."""
    below = False
    for f, m, v in zip(frames, minutes, values):
        if v >= level and below:
            return f, m
        below = below or v < level
    return None


def played_frames(folder: str) -> int | None:
    """The frames the run played, from its summary.json (None without one): a run stopped at
    400,000 frames logs its last game somewhat before that."""
    try:
        with open(os.path.join(folder, "summary.json")) as f:
            frames = json.load(f).get("frames")
        return int(frames) if frames is not None else None
    except (OSError, ValueError, AttributeError, TypeError):
        return None


_RUN_NAME = re.compile(r"^(\d\d)(\+[a-z0-9]+)?-([a-z0-9]+)-seed(\d+)(?:-|$)")


def run_identity(folder: str) -> dict | None:
    """{stage, game, seed, solved} from the run's summary.json, else from its folder name
    (``<stage>-<game>-seed<N>...``, solved unknown: False); None when neither tells. A sweep's
    arm (a folder named ``<stage>+<arm>-...``, ``lib.sweep --arm``) is part of the stage: "08+steps1"."""
    m = _RUN_NAME.match(os.path.basename(os.path.normpath(folder)))
    arm = (m.group(2) or "") if m else ""
    try:
        with open(os.path.join(folder, "summary.json")) as f:
            s = json.load(f)
        if s.get("stage") and s.get("game") and s.get("seed") is not None:
            return {
                "stage": str(s["stage"]) + arm,
                "game": str(s["game"]),
                "seed": int(s["seed"]),
                "solved": bool(s.get("solved")),
            }
    except (OSError, ValueError, AttributeError, TypeError):
        pass
    if m:
        return {"stage": m.group(1) + arm, "game": m.group(3), "seed": int(m.group(4)), "solved": False}
    return None


_SITTING_LINE = re.compile(r"^== attempt \d+, ")
_STAGE_LINE = re.compile(r"^stage \d\d: \S+(?: x(\d+))? on .*?(?:, learner (\w+))?$")
_STEPS_FLAG = re.compile(r"(?:^|\s)--steps[ =](\d+)(?:\s|$)")


def settings(folder: str, default_steps: int = 4, default_precision: str = NEVER) -> list[tuple[int, str]]:
    """(from frame, "precision, N, K") of each stretch of the run that played with one setting,
    from its run.log (a sweep's): each sitting's command line (``--steps``, else
    ``default_steps``: the stage's default), its resume frame and its stage line (``xK``: K games,
    else 1; ``learner P``, else ``default_precision``: fp32 for stages 01-05, unknown for a run
    of 06-08 older than that word). A sitting that resumed at frame F replaces what the ones
    before it played from F on. Empty where run.log is missing or names no stage line."""
    stretches: list[tuple[int, str]] = []
    steps, start = default_steps, 0
    try:
        with open(os.path.join(folder, "run.log"), errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    for i, line in enumerate(lines):
        if _SITTING_LINE.match(line):
            command = lines[i + 1] if i + 1 < len(lines) else ""
            m = _STEPS_FLAG.search(command)
            steps, start = (int(m.group(1)) if m else default_steps), 0
        elif m := _RESUME_LINE.match(line):
            start = int(m.group(1))
        elif m := _STAGE_LINE.match(line):
            what = f"{m.group(2) or default_precision}, {steps}, {m.group(1) or 1}"
            stretches = [s for s in stretches if s[0] < start]
            if not stretches or stretches[-1][1] != what:
                stretches.append((start, what))
    return stretches


def settings_text(stretches: list[tuple[int, str]]) -> str:
    """``settings`` in words: "bf16, 4, 4", or "bf16, 4, 4 to 542604, then fp32, 4, 4"; "—" where
    there are none."""
    parts = [
        what + (f" to {stretches[i + 1][0]}" if i + 1 < len(stretches) else "") for i, (_, what) in enumerate(stretches)
    ]
    return ", then ".join(parts) or NEVER

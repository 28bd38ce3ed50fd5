"""Runs that survive a full disk and a lost machine: every file a run writes fails cleanly,
and a run stopped and resumed from a --save-replay checkpoint is the run that went through.

A failing disk is simulated in-process: the one place a run opens its files for writing
(``checkpoint._open``) hands out files that raise ENOSPC at a chosen write; TensorBoard's event
file fails the same way one level down, in its record writer.
"""

import errno
import json
import os
import pathlib
import signal
import subprocess
import threading
import time

import numpy as np
import pytest
import torch

from lib import parallel, schedules
from lib.run import checkpoint, cli, lifecycle, procs, runner, signals
from lib.run.cli import EXIT_WRITE
from lib.run.stages import STAGES
from lib.schedules import epsilon_at
from tests.conftest import (
    ROOT,
    StageProcess,
    assert_group_gone,
    result_fields,
    run_folder,
    run_inprocess,
    stage_cmd,
)
from tests.support.signal_at import SignalAt


class FullDisk:
    """Files whose write raises ENOSPC once ``after`` writes to the temporary files of ``name``
    (``name.<pid>.<random>.tmp``) have gone through (a write that fills the disk fails; later
    ones too)."""

    def __init__(self, name: str, after: int):
        self.name, self.after, self.writes = name, after, 0

    def open(self, path, mode="r", *args, **kwargs):
        f = open(path, mode, *args, **kwargs)
        base = pathlib.Path(path).name
        if not (base.startswith(self.name + ".") and base.endswith(".tmp")):
            return f
        disk = self
        write = f.write

        def failing_write(data):
            disk.writes += 1
            if disk.writes > disk.after:
                raise OSError(errno.ENOSPC, "No space left on device")
            return write(data)

        f.write = failing_write
        return f


def _assert_stopped_cleanly(res, folder, name):
    assert res.code == EXIT_WRITE, (res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].endswith(f"{name}: No space left on device") and "cannot write" in lines[0]
    assert "Traceback" not in res.stderr
    assert result_fields(res.stdout)["error"] == "yes"  # the RESULT line is still printed
    assert not list(pathlib.Path(folder).glob("*.tmp")), "a temporary file was left behind"


def _disk_full_after_the_first_checkpoint(monkeypatch):
    """The run's first checkpoint goes through; from then on every write to a checkpoint.pt fails
    part way (torch.save writes it in many pieces)."""
    disk = FullDisk("checkpoint.pt", after=10**9)
    monkeypatch.setattr(checkpoint, "_open", disk.open)
    save = runner.Run.save_checkpoint

    def first_then_full(self):
        path = save(self)
        disk.after = disk.writes
        return path

    monkeypatch.setattr(runner.Run, "save_checkpoint", first_then_full)


def test_full_disk_at_a_checkpoint_keeps_the_last_good_one(runs, monkeypatch):
    # The first checkpoint (frame 100) goes through; the disk is full from then on, so the
    # second (frame 200), which torch.save writes in many pieces, fails part way.
    _disk_full_after_the_first_checkpoint(monkeypatch)
    res = run_inprocess("01", "--run-dir", runs, "--save-every", 100, "--max-frames", 400, "--replay-initial", 380,
                        "--quiet")  # fmt: skip
    folder = run_folder(runs)
    _assert_stopped_cleanly(res, folder, "checkpoint.pt")
    assert torch.load(folder / "checkpoint.pt", weights_only=True)["frame_idx"] == 100  # the last good one, whole
    assert res.run.frame_idx == 200  # training stopped at the failed save, not at --max-frames
    summary = res.outcome.summary
    assert summary["error"].startswith("cannot write") and summary["frames"] == 200


def test_full_disk_at_the_summary(runs, monkeypatch):
    monkeypatch.setattr(checkpoint, "_open", FullDisk("summary.json", after=0).open)
    res = run_inprocess("02", "--run-dir", runs, "--max-frames", 400, "--replay-initial", 380, "--quiet")
    folder = run_folder(runs)
    _assert_stopped_cleanly(res, folder, "summary.json")
    assert not (folder / "summary.json").exists()


def test_full_disk_at_the_best_model_keeps_the_last_good_one(runs, monkeypatch):
    from lib.params import GAMES
    from tests.support.sidetarget import PARAMS

    monkeypatch.setitem(GAMES, "synthetic", PARAMS)  # games of 30 agent steps: best.pt after 10 games
    monkeypatch.setattr(schedules, "BEST_SECONDS", 0.0)  # every new best is written at once
    saved = []
    save_model = runner.Run.save_model

    def second_fails(self, name):
        if saved:
            monkeypatch.setattr(checkpoint, "_open", FullDisk(name, after=0).open)
        path = save_model(self, name)
        saved.append(torch.load(path, weights_only=True)["frame_idx"])
        return path

    monkeypatch.setattr(runner.Run, "save_model", second_fails)
    res = run_inprocess("01", "--game", "synthetic", "--run-dir", runs, "--max-frames", 2000, "--quiet")
    folder = run_folder(runs)
    _assert_stopped_cleanly(res, folder, "best.pt")
    assert len(saved) == 1
    assert torch.load(folder / "best.pt", weights_only=True)["frame_idx"] == saved[0]
    assert res.run.frame_idx < 2000


def test_best_model_is_written_at_most_every_minute_and_the_newest_at_the_end(runs, monkeypatch):
    # Games of 30 agent steps for 900 frames: about 30 games, new bests again and again. With a
    # minimum interval longer than any run (so that the machine's speed does not matter),
    # best.pt is written twice: at the first best (after 10 games), then at the end with the
    # newest best, which the file must then hold.
    from lib.params import GAMES
    from tests.support.sidetarget import PARAMS

    monkeypatch.setitem(GAMES, "synthetic", PARAMS)
    monkeypatch.setattr(schedules, "BEST_SECONDS", 1e9)
    bests, written = [], []
    new_best = runner.RewardTracker.new_best

    def spy_best(self):
        found = new_best(self)
        if found:
            bests.append(self.best_mean)
        return found

    save_model = runner.Run.save_model

    def spy_save(self, name):
        if name == "best.pt":
            written.append(self.tracker.best_mean)
        return save_model(self, name)

    monkeypatch.setattr(runner.RewardTracker, "new_best", spy_best)
    monkeypatch.setattr(runner.Run, "save_model", spy_save)
    res = run_inprocess("01", "--game", "synthetic", "--run-dir", runs, "--max-frames", 900, "--quiet")
    assert res.code == 0, res.stderr
    assert len(bests) >= 3, bests  # several new bests, so that the throttle has something to hold back
    assert written == [bests[0], bests[-1]]
    best = torch.load(run_folder(runs) / "best.pt", weights_only=True)
    assert best["mean_reward"] == pytest.approx(bests[-1])


def test_full_disk_at_the_event_file(runs, monkeypatch):
    from tensorboard.summary.writer import record_writer

    from lib.params import GAMES
    from tests.support.sidetarget import PARAMS

    monkeypatch.setitem(GAMES, "synthetic", PARAMS)  # four scalars per game of 30 agent steps
    writes = []
    write = record_writer.RecordWriter.write

    def failing(self, data):
        writes.append(len(data))
        if len(writes) > 20:  # the header, then a few scalars
            raise OSError(errno.ENOSPC, "No space left on device")
        return write(self, data)

    monkeypatch.setattr(record_writer.RecordWriter, "write", failing)
    res = run_inprocess("01", "--game", "synthetic", "--run-dir", runs, "--max-frames", 3000, "--quiet")
    folder = run_folder(runs)
    assert res.code == EXIT_WRITE, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "events.out.tfevents" in lines[0] and lines[0].endswith("No space left on device")
    assert result_fields(res.stdout)["error"] == "yes"
    assert (folder / "summary.json").exists() and res.run.frame_idx < 600


def test_a_first_ring_the_disk_cannot_hold_leaves_a_checkpoint_without_it(runs, monkeypatch):
    """The disk's room is checked before a ring is written, for the ring and the checkpoint
    written after it; where the first pair does not fit (10 MiB free: the ring's 7 MiB would, and
    used to be written), the run stops (74) with a checkpoint that resumes, refilling its buffer."""
    import shutil

    from lib.run import disk

    usage = shutil.disk_usage(runs.parent)
    monkeypatch.setattr(disk.shutil, "disk_usage", lambda path: usage._replace(free=10 * 2**20))
    res = run_inprocess("01", "--run-dir", runs, "--save-every", 100, "--save-replay", "--max-frames", 300,
                        "--replay-size", 1000, "--replay-initial", 300, "--quiet")  # fmt: skip
    folder = run_folder(runs)
    assert res.code == EXIT_WRITE and res.run.frame_idx == 100, res.stderr
    (line,) = res.stderr.strip().splitlines()
    assert (
        f"cannot write {folder / 'replay-100.pt'}: No space left on device (20 MiB needed for the ring and its "
        "checkpoint, 10 MiB free)"
    ) in line
    assert not list(folder.glob("replay-*")) and not list(folder.glob("*.tmp"))
    ckpt = torch.load(folder / "checkpoint.pt", weights_only=True)
    assert ckpt["frame_idx"] == 100 and "replay" not in ckpt
    monkeypatch.undo()
    res = run_inprocess("01", "--resume", folder / "checkpoint.pt", "--max-frames", 120, "--quiet")
    assert res.code == 0 and "the replay buffer is refilled" in res.stdout, res.stderr


def _pair(folder):
    """The frame of the folder's checkpoint, the ring it names, and the rings in the folder."""
    ckpt = torch.load(folder / "checkpoint.pt", weights_only=True)
    return ckpt["frame_idx"], ckpt.get("replay", {}).get("file"), sorted(p.name for p in folder.glob("replay-*.pt"))


def test_a_checkpoint_the_disk_cannot_hold_takes_its_new_ring_with_it(runs, monkeypatch):
    """The disk fills between a ring and its checkpoint (frame 200): the run stops (74) with the
    last good pair (frame 100) and no ring that no checkpoint names, which used to stay and keep
    the disk full (0.7 GB at 100k slots); resumed, the run goes on with its ring."""
    _disk_full_after_the_first_checkpoint(monkeypatch)
    res = run_inprocess("01", "--run-dir", runs, "--save-every", 100, "--save-replay", "--max-frames", 300,
                        "--replay-size", 1000, "--replay-initial", 300, "--quiet")  # fmt: skip
    folder = run_folder(runs)
    _assert_stopped_cleanly(res, folder, "checkpoint.pt")
    assert res.run.frame_idx == 200 and _pair(folder) == (100, "replay-100.pt", ["replay-100.pt"])
    monkeypatch.undo()
    res = run_inprocess("01", "--resume", folder / "checkpoint.pt", "--max-frames", 300, "--quiet")
    assert res.code == 0 and "with its replay buffer of" in res.stdout, res.stderr
    assert _pair(folder) == (300, "replay-300.pt", ["replay-300.pt"])


def test_a_resume_clears_what_dead_writers_left_and_uses_its_room(runs, monkeypatch):
    """A ring no checkpoint names (replay-200.pt, as a crash between a ring and its checkpoint
    leaves) fills a small disk, beside a temporary file of a writer that died: the resume removes
    both, so that its save at frame 200, which replaces the orphan, has the room; a temporary
    file of a live process stays. The resume used to fail at its first save, the orphan's bytes
    not counted ("... MiB needed, ... MiB free"), and the temporary file stayed for good."""
    import shutil

    from lib.run import disk

    res = run_inprocess("01", "--run-dir", runs, "--save-every", 100, "--save-replay", "--max-frames", 100,
                        "--replay-size", 1000, "--replay-initial", 300, "--quiet")  # fmt: skip
    assert res.code == 0, res.stderr
    folder = run_folder(runs)
    shutil.copyfile(folder / "replay-100.pt", folder / "replay-200.pt")  # the orphan
    dead = subprocess.Popen(["true"])  # a process that has exited
    dead.wait()
    (folder / f"checkpoint.pt.{dead.pid}.0123abcd.tmp").write_bytes(b"cut short")
    live = folder / f"best.pt.{os.getppid()}.0123abcd.tmp"
    live.write_bytes(b"being written")

    def used():
        return sum(p.stat().st_size for p in folder.iterdir() if p.is_file())

    pair = (folder / "replay-100.pt").stat().st_size + (folder / "checkpoint.pt").stat().st_size
    capacity = used() - (folder / "replay-200.pt").stat().st_size + pair + 2**20  # room for a pair, not with the orphan
    usage = shutil.disk_usage(runs.parent)
    monkeypatch.setattr(disk.shutil, "disk_usage", lambda path: usage._replace(free=capacity - used()))
    res = run_inprocess("01", "--resume", folder / "checkpoint.pt", "--max-frames", 200, "--quiet")
    assert res.code == 0, res.stderr
    assert f"checkpoint.pt.{dead.pid}.0123abcd.tmp, replay-200.pt" in res.stdout
    assert _pair(folder) == (200, "replay-200.pt", ["replay-200.pt"])
    assert [p.name for p in folder.glob("*.tmp")] == [live.name]


def test_save_replay_needs_save_every(runs):
    res = run_inprocess("01", "--run-dir", runs, "--save-replay")
    assert res.code == 2 and res.stderr.strip().endswith(
        "--save-replay needs --save-every N (the checkpoints it goes into)"
    )
    assert not runs.exists()


# -- exact resume ------------------------------------------------------------------------------


def _losses(folder):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars("loss")]


@pytest.mark.parametrize("stage, extra", [("01", []), ("02", ["--steps", 2])])
def test_stop_and_resume_equals_run_through(stage, extra, tmp_path, monkeypatch):
    """Stopped at frame 250 and resumed, the run computes exactly what it computes going
    through: the same losses in TensorBoard and the same weights, bit for bit. The game in
    progress at the stop (Pong's first game lasts longer) goes on from where it was."""

    monkeypatch.setattr(schedules, "LOSS_FRAMES", 20)
    common = ("--seed", 2, "--replay-initial", 200, "--replay-size", 1000, "--save-every", 125, "--save-replay",
              "--quiet", *extra)  # fmt: skip
    through = run_inprocess(stage, "--max-frames", 300, "--run-dir", tmp_path / "through", *common)
    assert through.code == 0, through.stderr
    first = run_inprocess(stage, "--max-frames", 250, "--run-dir", tmp_path / "stopped", *common)
    assert first.code == 0, first.stderr
    folder = run_folder(tmp_path / "stopped")
    assert [p.name for p in folder.glob("replay-*.pt")] == ["replay-250.pt"]  # the older one went with its pair
    # Given no --steps, the resumed run goes on with the checkpoint's.
    second = run_inprocess(stage, "--resume", folder / "checkpoint.pt", "--max-frames", 300, "--quiet")
    assert second.code == 0, second.stderr
    assert "with its replay buffer of" in second.stdout
    want = through.run.saveables["net"].state_dict()
    got = second.run.saveables["net"].state_dict()
    for name in want:
        assert torch.equal(got[name], want[name]), name
    assert _losses(folder) == _losses(run_folder(tmp_path / "through"))
    assert [step for step, _ in _losses(folder)] == [200, 220, 240, 260, 280, 300]


@pytest.mark.parametrize("stage", ["03", "04", "05", "06", "07", "08"])
def test_resume_restores_the_saved_ring(stage, runs, monkeypatch):
    res = run_inprocess(stage, "--run-dir", runs, "--max-frames", 240, "--replay-initial", 100, "--replay-size", 1000,
                        "--save-every", 240, "--save-replay", "--quiet")  # fmt: skip
    assert res.code == 0, res.stderr
    folder = run_folder(runs)
    ckpt = torch.load(folder / "checkpoint.pt", weights_only=True)
    saved = torch.load(folder / ckpt["replay"]["file"], weights_only=True)
    seen = {}
    attach = runner.Run.attach

    def spy(self, buffer=None, **objects):
        attach(self, buffer=buffer, **objects)
        seen["ring"] = {k: (v.clone() if hasattr(v, "clone") else v) for k, v in _flat(buffer.state_dict()).items()}
        seen["rng"] = np.random.get_state()[1].copy()
        seen["epsilon"], seen["frame"] = epsilon_at(self.frame_idx, self.params), self.frame_idx

    monkeypatch.setattr(runner.Run, "attach", spy)
    res = run_inprocess(stage, "--resume", folder / "checkpoint.pt", "--max-frames", 248, "--quiet")
    assert res.code == 0, res.stderr
    assert saved.pop("belongs")["stage"] == stage  # what the file belongs to, beside the ring's state
    want = _flat(saved)
    assert seen["ring"].keys() == want.keys()
    for key, value in want.items():
        if hasattr(value, "shape"):
            assert torch.equal(seen["ring"][key], value), key
        else:
            assert seen["ring"][key] == value, key
    assert seen["frame"] == ckpt["frame_idx"] and seen["epsilon"] == ckpt["epsilon"]
    assert seen["rng"].tolist() == ckpt["rng"]["numpy"][1]


def _flat(state, prefix=""):
    out = {}
    for key, value in state.items() if isinstance(state, dict) else enumerate(state):
        name = f"{prefix}{key}"
        if isinstance(value, (dict, list)) and key != "rng":
            out.update(_flat(value, name + "."))
        else:
            out[name] = value
    return out


# -- signals during a save, a second writer, a closed stdout, a full disk at the start --------


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_during_the_first_checkpoint_stops_the_run_with_its_checkpoint(sig, code, runs, monkeypatch):
    """The stop is the signal's (not a failed write), and the checkpoint of the frame it landed
    on is whole: on a run's first save there used to be no checkpoint at all."""
    monkeypatch.setattr(checkpoint, "_open", SignalAt(sig, at=5, name="checkpoint.pt").open)
    res = run_inprocess("01", "--run-dir", runs, "--save-every", 100, "--max-frames", 400, "--replay-initial", 380,
                        "--quiet")  # fmt: skip
    folder = run_folder(runs)
    name = signal.Signals(sig).name
    assert res.code == code, res.stderr
    assert res.stderr == "" and result_fields(res.stdout)["interrupted"] == name
    assert res.outcome.summary["interrupted"] == name and res.outcome.summary["error"] is None
    assert torch.load(folder / "checkpoint.pt", weights_only=True)["frame_idx"] == 100 == res.run.frame_idx
    assert not list(folder.glob("*.tmp"))


def test_signals_during_saves_of_a_run_leave_each_file_whole(runs, monkeypatch):
    """20 saves of the checkpoint (with its replay ring) and 20 of the best model, a stop signal
    landing at another of their writes each time: each save ends with its files whole, then the
    stop; no temporary file is left."""
    res = run_inprocess("01", "--run-dir", runs, "--max-frames", 400, "--replay-size", 500, "--replay-initial", 400,
                        "--save-every", 400, "--save-replay", "--quiet")  # fmt: skip
    assert res.code == 0, res.stderr
    run, folder = res.run, run_folder(runs)
    restore = signals.stop_on_signals()
    try:
        for i in range(40):
            sig = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)[i % 3]
            if i < 20:  # the signal lands in the ring's file or in the checkpoint's
                landing, name, save = ("replay-", "checkpoint.pt")[i % 2], "checkpoint.pt", checkpoint.write_checkpoint
            else:
                landing, name, save = "best.pt", "best.pt", lambda run: checkpoint.write_model(run, "best.pt")
            opener = SignalAt(sig, at=1 + i % 20, name=landing)
            monkeypatch.setattr(checkpoint, "_open", opener.open)
            run.frame_idx = 1000 + i
            with pytest.raises((KeyboardInterrupt, cli.Terminated)):
                save(run)
            assert opener.writes > opener.at
            assert torch.load(folder / name, weights_only=True)["frame_idx"] == 1000 + i
            assert not list(folder.glob("*.tmp"))
        assert [p.name for p in folder.glob("replay-*.pt")] == ["replay-1019.pt"]
    finally:
        restore()


def test_a_signal_during_the_best_model_write_leaves_the_best_model(runs, monkeypatch):
    from lib.params import GAMES
    from tests.support.sidetarget import PARAMS

    monkeypatch.setitem(GAMES, "synthetic", PARAMS)  # games of 30 agent steps: best.pt after 10 games
    monkeypatch.setattr(checkpoint, "_open", SignalAt(signal.SIGINT, at=3, name="best.pt").open)
    res = run_inprocess("01", "--game", "synthetic", "--run-dir", runs, "--max-frames", 2000, "--quiet")
    folder = run_folder(runs)
    assert res.code == 130 and res.outcome.summary["interrupted"] == "SIGINT", res.stderr
    best = torch.load(folder / "best.pt", weights_only=True)
    assert best["mean_reward"] == pytest.approx(res.run.tracker.best_mean)
    assert not list(folder.glob("*.tmp")) and res.run.frame_idx < 2000


def test_a_second_resume_of_a_live_run_is_refused(runs, monkeypatch):
    """While a run resumes from its checkpoint, a second resume of it is refused (exit 2, one
    line naming the process that holds the folder) and writes nothing; the checkpoint stays
    whole and the first run goes on. Once the first has ended, the folder can be resumed again."""
    res = run_inprocess("01", "--run-dir", runs, "--save-every", 100, "--max-frames", 100, "--replay-initial", 100,
                        "--quiet")  # fmt: skip
    assert res.code == 0, res.stderr
    folder = run_folder(runs)
    ckpt = folder / "checkpoint.pt"
    second = []
    save = runner.Run.save_checkpoint

    def resume_again(self):
        if not second:
            before = sorted(p.name for p in folder.iterdir())
            second.append(run_inprocess("01", "--resume", ckpt, "--max-frames", 300, "--quiet"))
            assert sorted(p.name for p in folder.iterdir()) == before
        return save(self)

    monkeypatch.setattr(runner.Run, "save_checkpoint", resume_again)
    first = run_inprocess("01", "--resume", ckpt, "--save-every", 50, "--max-frames", 200, "--replay-initial", 40,
                          "--quiet")  # fmt: skip
    assert first.code == 0, first.stderr
    (other,) = second
    assert other.code == 2 and other.stdout == "", other.stderr
    (line,) = other.stderr.strip().splitlines()
    assert line.startswith("01_dqn_basic.py: error: --resume") and f"is in use by process {os.getpid()}" in line
    assert torch.load(ckpt, weights_only=True)["frame_idx"] == 200
    monkeypatch.undo()
    again = run_inprocess("01", "--resume", ckpt, "--max-frames", 220, "--replay-initial", 10, "--quiet")
    assert again.code == 0, again.stderr


def test_two_runs_started_in_the_same_second_get_two_folders(runs, monkeypatch):
    """The second run's check for an existing folder is answered as if the first had not made
    its folder yet (they started together): still, each run makes a folder of its own."""
    import datetime

    now = datetime.datetime(2026, 1, 2, 3, 4, 5)
    monkeypatch.setattr(runner.datetime, "datetime", type("Frozen", (datetime.datetime,), {"now": lambda: now}))
    exists = os.path.exists
    monkeypatch.setattr(os.path, "exists", lambda p: False if str(p).startswith(str(runs)) else exists(p))
    for _ in range(2):
        res = run_inprocess("01", "--run-dir", runs, "--max-frames", 20, "--replay-initial", 20, "--quiet")
        assert res.code == 0, res.stderr
    assert sorted(p.name for p in runs.iterdir()) == [
        "01-pong-seed0-20260102-030405",
        "01-pong-seed0-20260102-030405-2",
    ]


def test_a_full_disk_at_the_start_names_the_event_file_and_leaves_none(runs, monkeypatch):
    """The event file is created, then its first write fails (as on a full disk): exit 74 with
    the file named, the RESULT line, and no empty event file left."""
    from tensorboard.compat.tensorflow_stub.io import gfile

    def full(self, filename, file_content, binary_mode=False):
        open(filename, "ab").close()
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(gfile.LocalFileSystem, "write", full)
    monkeypatch.setattr(gfile.LocalFileSystem, "append", full)
    res = run_inprocess("01", "--run-dir", runs, "--max-frames", 100, "--quiet")
    folder = run_folder(runs)
    assert res.code == EXIT_WRITE, (res.stdout, res.stderr)
    (line,) = res.stderr.strip().splitlines()
    assert f"cannot write {folder}/events.out.tfevents." in line and line.endswith("No space left on device")
    assert result_fields(res.stdout)["error"] == "yes"
    assert not list(folder.glob("events.out.tfevents.*"))


def test_a_stop_in_the_first_train_step_counts_no_negative_frames(runs, monkeypatch):
    """Ctrl-C lands right after the speed clock started, before the run's frame count has moved
    to the frame the loop handed to it: no train frames yet, not minus one."""
    start = runner.SpeedMeter.start

    def start_then_stop(self, frame_idx):
        start(self, frame_idx)
        raise KeyboardInterrupt

    monkeypatch.setattr(runner.SpeedMeter, "start", start_then_stop)
    res = run_inprocess("01", "--run-dir", runs, "--max-frames", 200, "--replay-initial", 50, "--quiet")
    assert res.code == 130, res.stderr
    summary = res.outcome.summary
    assert summary["train_frames"] == 0 and summary["fps"] == 0.0
    assert float(result_fields(res.stdout)["fps"]) == 0.0


# -- what only a process shows: a reader gone, SIGHUP, repeated Ctrl-C, a long TMPDIR ----------

FILL_ONLY = ("--max-frames", 1500, "--replay-initial", 1500, "--replay-size", 1500, "--progress", 0.1)


def _summary_of(runs):
    return json.loads((run_folder(runs) / "summary.json").read_text())


def test_a_reader_that_goes_away_does_not_stop_the_run(runs):
    """``01_dqn_basic.py ... | head -n 1``: the lines after the first are dropped, and the run
    goes on to its summary and exit code 0, without a traceback."""
    proc = subprocess.Popen(stage_cmd("01", "--run-dir", runs, *FILL_ONLY), cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    first = proc.stdout.readline()
    proc.stdout.close()  # what head does after its line
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 0, err
    assert first.startswith("stage 01:") and err == ""
    assert _summary_of(runs)["frames"] == 1500


def _pipe_full(fd):
    """Whether the pipe of write end ``fd`` is full: a poll says it has no room."""
    import select

    poll = select.poll()
    poll.register(fd, select.POLLOUT)
    return not poll.poll(0)


@pytest.mark.parametrize("end", ["last frame", "SIGTERM"])
def test_a_pipe_nobody_reads_stops_neither_the_run_nor_a_stop(end, runs):
    """``01_dqn_basic.py --progress 0.001 | sleep 600``, the pipe of two pages (8 KiB): once it is
    full, the lines that cannot be written without blocking are dropped, whole, and counted in
    the summary (the RESULT line's too), and the run goes on to its last frame or, sent SIGTERM,
    ends within seconds. It used to block in the write, and after SIGTERM again in the RESULT
    line's, with the stop signals then ignored."""
    import fcntl

    read, write = os.pipe()
    fcntl.fcntl(write, fcntl.F_SETPIPE_SZ, 8192)
    frames = 1500 if end == "last frame" else 100_000
    try:
        proc = subprocess.Popen(stage_cmd("01", "--run-dir", runs, "--max-frames", frames, "--replay-initial",
                                          frames, "--replay-size", frames, "--progress", 0.001),
                                cwd=ROOT, stdout=write, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)  # fmt: skip
        if end == "SIGTERM":
            deadline = time.monotonic() + 60
            while not _pipe_full(write) and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(1.0)  # a second of lines that cannot be written
            sent = time.monotonic()
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            err = proc.communicate(timeout=60)[1]
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            raise AssertionError("the run blocked on its stdout") from None
        if end == "SIGTERM":
            assert proc.returncode == 143 and time.monotonic() - sent < 10.0, err
        else:
            assert proc.returncode == 0, err
        os.close(write)
        write = None
        with os.fdopen(read, closefd=False) as pipe:
            lines = pipe.read().splitlines(keepends=True)
    finally:
        os.close(read)
        if write is not None:
            os.close(write)
    assert err == ""
    summary = _summary_of(runs)
    assert summary["frames"] == 1500 if end == "last frame" else summary["interrupted"] == "SIGTERM"
    assert lines[0].startswith("stage 01:") and all(line.endswith("\n") for line in lines)  # whole lines
    written = [int(line.split()[2].removeprefix("frame=")) for line in lines if line.startswith("PROGRESS")]
    assert summary["frames"] > written[-1] + 100  # the run went on past the lines that were written
    assert not any(line.startswith("RESULT") for line in lines) and summary["stdout_dropped"] > 100


def test_the_summary_counts_every_line_dropped_the_result_line_too(tmp_path, monkeypatch):
    """A stdout that never has room: every line is dropped, and the summary counts as many as
    the same run prints to a stdout that has (its TIME and RESULT lines, printed after the summary
    is first written, included)."""
    args = ("--max-frames", 100, "--replay-initial", 100, "--seed", 1)
    printed = run_inprocess("01", "--run-dir", tmp_path / "a", *args)
    assert printed.code == 0 and printed.outcome.summary["stdout_dropped"] == 0, printed.stderr
    monkeypatch.setattr(lifecycle, "_pipe_room", lambda stream: lambda: False)
    dropped = run_inprocess("01", "--run-dir", tmp_path / "b", *args)
    assert dropped.code == 0 and dropped.stdout == "", dropped.stderr
    lines = len(printed.stdout.splitlines())
    assert lines >= 3 and _summary_of(tmp_path / "b")["stdout_dropped"] == lines


def test_a_full_stdout_does_not_stop_the_run(runs):
    with open("/dev/full", "w") as full:
        proc = subprocess.run(stage_cmd("01", "--run-dir", runs, *FILL_ONLY), cwd=ROOT, stdout=full,
                              stderr=subprocess.PIPE, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert _summary_of(runs)["frames"] == 1500


def _semaphores(pid):
    """The inodes of the multiprocessing semaphores (the Queue's, in /dev/shm) that process
    ``pid`` has mapped. glibc makes each under a temporary name, maps it, and links it as
    ``sem.mp-...``: the mapping names the temporary file, the inode is the semaphore's."""
    with open(f"/proc/{pid}/maps") as f:
        return {int(line.split()[4]) for line in f if " /dev/shm/sem." in line}


def _hangup_reaches(pid):
    """Whether SIGHUP would reach process ``pid``: neither blocked nor ignored (its status)."""
    with open(f"/proc/{pid}/status") as f:
        masks = dict(line.split(":\t", 1) for line in f if line.startswith(("SigBlk", "SigIgn")))
    return not (int(masks["SigBlk"], 16) | int(masks["SigIgn"], 16)) & (1 << (signal.SIGHUP - 1))


def _resource_tracker(pid):
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        children = [int(p) for p in f.read().split()]
    for child in children:
        with open(f"/proc/{child}/cmdline", "rb") as f:
            if b"resource_tracker" in f.read():
                return child
    return None


def _left_in_shm(inodes):
    return [e.name for e in os.scandir("/dev/shm") if e.inode() in inodes]


@pytest.mark.parametrize("stage", ["01", "03", "07"])
def test_sighup_stops_the_run_cleanly(stage, runs):
    """A closed terminal hangs up the whole process group: the run stops as for SIGTERM, with
    its RESULT line and summary (exit 129), stderr empty and no semaphore left in /dev/shm. 01
    used to die at once, with neither; 03 and 07, whose resource tracker SIGHUP killed, printed
    its relaunch warning and a traceback for each semaphore the trainer then unlinked."""
    proc = StageProcess(stage, "--run-dir", runs, "--replay-initial", 1000, "--replay-size", 1000, "--progress", 0.2,
                        "--quiet")  # fmt: skip
    proc.wait_for("PROGRESS")
    semaphores = _semaphores(proc.proc.pid)
    assert len(_left_in_shm(semaphores)) == len(semaphores) == (0 if stage == "01" else 3)  # the play Queue's
    tracker = _resource_tracker(proc.proc.pid)
    assert (tracker is None) == (stage == "01")
    assert tracker is None or not _hangup_reaches(tracker)  # the hang-up used to kill it
    proc.signal_group(signal.SIGHUP)
    assert proc.finish(timeout=60) == 129, proc.stderr
    assert proc.stderr == ""
    assert result_fields(proc.stdout)["interrupted"] == "SIGHUP"
    assert _summary_of(runs)["interrupted"] == "SIGHUP"
    assert_group_gone(proc.pgid)
    assert _left_in_shm(semaphores) == []


def test_ctrl_c_again_and_again_still_exits_130(runs):
    """Ctrl-C pressed every 0.3 s until the run has ended: exit 130, never death by SIGINT
    (a Ctrl-C after the wrap-up, while the interpreter exits, used to kill it)."""
    proc = StageProcess("01", "--run-dir", runs, "--replay-initial", 100_000, "--replay-size", 100_000, "--progress",
                        0.2, "--quiet")  # fmt: skip
    proc.wait_for("PROGRESS")
    deadline = time.monotonic() + 60
    while proc.proc.poll() is None and time.monotonic() < deadline:
        proc.signal_group(signal.SIGINT)
        time.sleep(0.3)
    assert proc.finish(timeout=10) == 130, proc.stderr
    assert "Traceback" not in proc.stderr and result_fields(proc.stdout)["interrupted"] == "SIGINT"


def test_a_long_tmpdir_does_not_stop_a_play_process_from_starting(runs, tmp_path):
    """Stages 03-08 start their play process through multiprocessing's fork server, whose
    socket path (in TMPDIR) may not exceed 107 bytes: with a TMPDIR of 120 characters the run
    goes on, its socket in a short folder."""
    tmpdir = tmp_path / "t"
    tmpdir = tmpdir / ("d" * (120 - len(str(tmpdir)) - 1))
    tmpdir.mkdir(parents=True)
    env = dict(os.environ, TMPDIR=str(tmpdir))
    proc = subprocess.run(stage_cmd("03", "--run-dir", runs, "--max-frames", 60, "--replay-initial", 50,
                                    "--replay-size", 200, "--quiet"),
                          cwd=ROOT, capture_output=True, text=True, timeout=180, env=env)  # fmt: skip
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert _summary_of(runs)["frames"] == 60


@pytest.mark.parametrize("stage", ["03", "07"])
def test_a_play_process_that_sends_nothing_ends_the_run_in_one_line(stage, runs, monkeypatch):
    """A play process stopped with SIGSTOP (alive, silent) used to be waited on forever, the
    stop booked as its ``put``: now the run ends as for a dead one (exit 1) once it has sent
    nothing for SILENT_SECONDS, in one line naming it, and the silence is its ``stalled``."""
    monkeypatch.setattr(parallel, "SILENT_SECONDS", 3.0)
    started, start = [], parallel.start_player
    monkeypatch.setattr(parallel, "start_player", lambda *a, **k: started.append(start(*a, **k)) or started[-1])

    def stop_it():
        deadline = time.monotonic() + 120
        while not (started and getattr(started[0], "sent", False)) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)
        os.kill(started[0].pid, signal.SIGSTOP)

    threading.Thread(target=stop_it, daemon=True).start()
    res = run_inprocess(stage, "--run-dir", runs, "--replay-initial", 100, "--replay-size", 1000, "--max-frames",
                        10**6, "--quiet")  # fmt: skip
    assert res.code == 1, (res.stdout, res.stderr)
    pid = started[0].pid
    script = STAGES[stage].script
    assert res.stderr.splitlines() == [f"{script}: error: the play process {pid} (stopped) has sent nothing for 3 s"]
    assert procs.exited(pid) or not procs.alive(pid)  # ended with the run, stopped as it was
    times = _summary_of(runs)["time"]
    play = times["processes"]["play"]["seconds"]
    assert play["stalled"] >= 2.0, play  # the silence (it was the put's, or the act's, or no part's)
    assert not times["bound"].startswith("play:"), times  # a silence is a wait, not the play process's work


def _time_line(stdout: str) -> dict:
    """The TIME line's figures: {"bound": "trainer:step", "play.env": 1.23, ...}."""
    (line,) = [line for line in stdout.splitlines() if line.startswith("TIME ")]
    cells = dict(cell.split("=", 1) for cell in line.split()[1:])
    return {k: v if k in ("stage", "bound") else float(v) for k, v in cells.items()}


def test_a_play_process_stopped_for_a_while_is_booked_as_stalled(runs, monkeypatch):
    """A play process stopped (SIGSTOP) for 3 s and continued, the run going on: the silence past
    STALL_SECONDS used to be booked as the part open when it began (``play.put``, or ``env``);
    now it is ``play.stalled``, a wait, which the bound never names. A fill-only run of 03: its
    window is the whole sitting, so the stop falls in it."""
    monkeypatch.setattr(parallel, "STALL_SECONDS", 1.0)
    started, start = [], parallel.start_player
    monkeypatch.setattr(parallel, "start_player", lambda *a, **k: started.append(start(*a, **k)) or started[-1])

    def stop_it():
        deadline = time.monotonic() + 120
        while not (started and getattr(started[0], "sent", False)) and time.monotonic() < deadline:
            time.sleep(0.01)
        os.kill(started[0].pid, signal.SIGSTOP)
        time.sleep(3.0)
        os.kill(started[0].pid, signal.SIGCONT)

    threading.Thread(target=stop_it, daemon=True).start()
    res = run_inprocess("03", "--run-dir", runs, *FILL_ONLY, "--quiet")
    assert res.code == 0, (res.stdout, res.stderr)
    seconds = _summary_of(runs)["time"]["processes"]["play"]["seconds"]
    assert 2.0 <= seconds["stalled"] <= 4.5 and seconds["put"] < 1.5, seconds  # the stop, not the put's
    line = _time_line(res.stdout)
    assert line["play.stalled"] > line["play.put"] and not line["bound"].endswith((":stalled", ":put")), line


def test_a_zero_lag_wait_is_booked_as_lag_wait(runs):
    """At ``--lag zero`` the play process waits for the trainer before each action: that wait
    used to be ``play.env``, and the bound ``play:env`` while the trainer's step took the time;
    now it is ``play.lag_wait``, a wait, and the bound is the trainer's."""
    res = run_inprocess("03", "--run-dir", runs, "--max-frames", 300, "--replay-initial", 200, "--replay-size", 300,
                        "--lag", "zero", "--quiet")  # fmt: skip
    assert res.code == 0, (res.stdout, res.stderr)
    line = _time_line(res.stdout)
    assert line["play.lag_wait"] > line["play.env"] and line["bound"].startswith("trainer:"), line


class FailingDevice:
    """A device that fails, on the CPU: once ``dead`` (the run's ``close`` has begun), every read
    of a tensor back to the host (``Tensor.cpu``) and the wait on a loss point's copy raise
    CUDA's sticky error, as after an illegal address."""

    MESSAGE = "CUDA error: an illegal memory access was encountered\nCUDA kernel errors might be reported later"

    def __init__(self, monkeypatch):
        self.dead = False
        cpu = torch.Tensor.cpu

        def read(tensor, *args, **kwargs):
            if self.dead:
                raise RuntimeError(self.MESSAGE)
            return cpu(tensor, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, "cpu", read)
        from lib.run.probes import trackers

        monkeypatch.setattr(trackers, "_mean_in_flight", self.mean_in_flight)  # a loss point on its way, as on CUDA
        close = runner.Run.close

        def failing_close(run, *args, **kwargs):
            self.dead = True
            return close(run, *args, **kwargs)

        monkeypatch.setattr(runner.Run, "close", failing_close)

    def mean_in_flight(self, values):
        device = self

        class Copy:
            def synchronize(self):
                if device.dead:
                    raise RuntimeError(device.MESSAGE)

        return torch.tensor(float(np.mean([float(v) for v in values]))), Copy()


def test_a_device_error_at_the_end_still_leaves_the_summary_and_result(runs, monkeypatch):
    """The device fails as the run ends (a best model due, a loss point still on its way): the
    reads of the run's end raise CUDA's RuntimeError; the run still writes summary.json and its
    TIME and RESULT lines, names the error in one line on stderr and in the summary, exit 1."""
    from lib.params import GAMES
    from tests.support.sidetarget import PARAMS

    monkeypatch.setitem(GAMES, "synthetic", PARAMS)  # games of 30 agent steps: a best model due at the end
    monkeypatch.setattr(schedules, "BEST_SECONDS", 10.0**9)  # the first best is written, the newest waits
    FailingDevice(monkeypatch)
    res = run_inprocess(
        "01", "--game", "synthetic", "--run-dir", runs, "--max-frames", 1100, "--replay-initial", 980, "--quiet"
    )  # a loss point at frame 1000, still on its way at the end
    folder = run_folder(runs)
    assert res.code == cli.EXIT_FAILED, (res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    assert lines[0].endswith("error: device error: CUDA error: an illegal memory access was encountered")
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["error"] == "device error: CUDA error: an illegal memory access was encountered"
    assert summary["frames"] == 1100
    assert result_fields(res.stdout)["error"] == "yes"
    assert res.stdout.strip().splitlines()[-2].startswith("TIME stage=01")
    assert (folder / "best.pt").exists()  # the best written while the device worked stays

"""Runs that survive a full disk and a lost machine: every file a run writes fails cleanly,
and a run stopped and resumed from a --save-replay checkpoint is the run that went through.

A failing disk is simulated in-process: the one place a run opens its files for writing
(``checkpoint._open``) hands out files that raise ENOSPC at a chosen write; TensorBoard's event
file fails the same way one level down, in its record writer.
"""

import errno
import pathlib

import numpy as np
import pytest
import torch

from lib import checkpoint, runner
from lib.cli import EXIT_WRITE
from lib.tracking import epsilon_at
from tests.conftest import result_fields, run_folder, run_inprocess


class FullDisk:
    """Files whose write raises ENOSPC once ``after`` writes to files named ``*name.tmp`` have
    gone through (a write that fills the disk fails; later ones too)."""

    def __init__(self, name: str, after: int):
        self.name, self.after, self.writes = name, after, 0

    def open(self, path, mode="r", *args, **kwargs):
        f = open(path, mode, *args, **kwargs)
        if not str(path).endswith(self.name + ".tmp"):
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


def test_full_disk_at_a_checkpoint_keeps_the_last_good_one(runs, monkeypatch):
    # The first checkpoint (frame 100) goes through; the disk is full from then on, so the
    # second (frame 200), which torch.save writes in many pieces, fails part way.
    disk = FullDisk("checkpoint.pt", after=10**9)
    monkeypatch.setattr(checkpoint, "_open", disk.open)
    save = runner.Run.save_checkpoint

    def first_then_full(self):
        path = save(self)
        disk.after = disk.writes
        return path

    monkeypatch.setattr(runner.Run, "save_checkpoint", first_then_full)
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
    monkeypatch.setattr(runner.Run, "BEST_SECONDS", 0.0)  # every new best is written at once
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
    monkeypatch.setattr(runner.Run, "BEST_SECONDS", 1e9)
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
    """The disk's room is checked before a ring is written; where the first ring does not fit,
    the run stops (74) with a checkpoint that resumes, refilling its buffer."""
    import shutil

    from lib import compat

    usage = shutil.disk_usage(runs.parent)
    monkeypatch.setattr(compat.shutil, "disk_usage", lambda path: usage._replace(free=2**20))
    res = run_inprocess("01", "--run-dir", runs, "--save-every", 100, "--save-replay", "--max-frames", 300,
                        "--replay-size", 1000, "--replay-initial", 300, "--quiet")  # fmt: skip
    folder = run_folder(runs)
    assert res.code == EXIT_WRITE and res.run.frame_idx == 100, res.stderr
    (line,) = res.stderr.strip().splitlines()
    assert f"cannot write {folder / 'replay-100.pt'}: No space left on device (7 MiB needed, 1 MiB free)" in line
    assert not list(folder.glob("replay-*")) and not list(folder.glob("*.tmp"))
    ckpt = torch.load(folder / "checkpoint.pt", weights_only=True)
    assert ckpt["frame_idx"] == 100 and "replay" not in ckpt
    monkeypatch.undo()
    res = run_inprocess("01", "--resume", folder / "checkpoint.pt", "--max-frames", 120, "--quiet")
    assert res.code == 0 and "the replay buffer is refilled" in res.stdout, res.stderr


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
    from lib.tracking import RewardTracker

    monkeypatch.setattr(RewardTracker, "LOSS_FRAMES", 20)
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

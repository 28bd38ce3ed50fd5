"""lib.run.checkpoint: files written whole or not at all (a signal during the write waits for it,
two writers never share a temporary file), what a checkpoint must be to be resumed, and an
optimizer's state loaded without its implementation."""

import signal

import pytest
import torch

from lib.run import checkpoint, signals
from lib.run.checkpoint import CHECKPOINT_KIND, atomic_write, load_checkpoint, load_state
from lib.run.cli import Terminated, UsageError, WriteError
from tests.support.signal_at import SignalAt


def test_atomic_write_leaves_the_old_file_whole_and_no_tmp_on_failure(tmp_path):
    path = tmp_path / "f.bin"
    atomic_write(str(path), lambda f: f.write(b"first"))
    assert path.read_bytes() == b"first"

    def fail(f):
        f.write(b"half")
        raise OSError(28, "No space left on device")

    with pytest.raises(WriteError, match=f"cannot write {path}: No space left on device"):
        atomic_write(str(path), fail)
    assert path.read_bytes() == b"first" and sorted(p.name for p in tmp_path.iterdir()) == ["f.bin"]


STOPS = {signal.SIGINT: KeyboardInterrupt, signal.SIGTERM: Terminated, signal.SIGHUP: Terminated}


@pytest.mark.parametrize("sig", list(STOPS), ids=lambda s: signal.Signals(s).name)
def test_a_signal_during_a_write_stops_after_the_file_is_whole(sig, tmp_path, monkeypatch):
    """24 tries, the signal landing at the 1st to the 24th of torch.save's writes: each time
    the stop comes once the new file is whole under its real name, and nothing else is left
    (torch.save used to turn the KeyboardInterrupt into a failed write, and the file was lost)."""
    path = tmp_path / "checkpoint.pt"
    torch.save({"try": -1}, path)
    weights = torch.randn(256, 256)
    restore = signals.stop_on_signals()  # the handlers of a run
    try:
        for at in range(1, 25):
            opener = SignalAt(sig, at)
            monkeypatch.setattr(checkpoint, "_open", opener.open)
            with pytest.raises(STOPS[sig]) as stop:
                atomic_write(str(path), lambda f, at=at: torch.save({"try": at, "w": weights}, f))
            assert signals.stopped_by(stop.value) == (128 + sig, signal.Signals(sig).name)
            assert opener.writes > at  # the write went on past the signal
            assert torch.load(path, weights_only=True)["try"] == at
            assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]
    finally:
        restore()


def test_two_writers_of_one_file_never_share_a_temporary_file(tmp_path):
    """A second process writing the same checkpoint while the first is part way (two resumes of
    one run, before the run folder's lock): each writes its own temporary file, and the file
    is whole, whichever rename comes last."""
    path = tmp_path / "checkpoint.pt"

    def first(f):
        f.write(b"first, part 1;")
        atomic_write(str(path), lambda g: g.write(b"second"))  # the other writer, all at once
        f.write(b" part 2")

    atomic_write(str(path), first)
    assert path.read_bytes() == b"first, part 1; part 2"
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]


def test_no_temporary_file_outlives_its_write_however_it_ends(tmp_path):
    path = tmp_path / "f.bin"

    def fails(f):
        f.write(b"half")
        raise ValueError("not a write failure")

    with pytest.raises(ValueError):
        atomic_write(str(path), fails)
    assert list(tmp_path.iterdir()) == []


def test_only_a_whole_checkpoint_of_this_project_is_loaded(tmp_path):
    # A checkpoint that a run wrote loads (tests/test_runner.py resumes them); here, what is not one.
    partial, other = tmp_path / "partial.pt", tmp_path / "other.pt"
    torch.save({"kind": CHECKPOINT_KIND, "frame_idx": 3}, partial)
    torch.save({"kind": "something else"}, other)
    cases = ((partial, "the checkpoint lacks stage, game"), (other, "not a dqn-speedup checkpoint"),
             (tmp_path / "none.pt", "no such file"))  # fmt: skip
    for path, words in cases:
        with pytest.raises(UsageError, match=words):
            load_checkpoint(str(path))


def test_resumed_optimizer_keeps_its_own_implementation():
    """Loading an optimizer's state moves what it learned (moments, step counts, lr), never how
    it runs: stage 05 (plain Adam) resuming stage 07's checkpoint (fused Adam) stays plain."""
    torch.manual_seed(0)
    src = torch.nn.Linear(4, 3)
    fused = torch.optim.Adam(src.parameters(), lr=1e-4, fused=True)
    src(torch.randn(8, 4)).square().mean().backward()
    fused.step()
    dst = torch.nn.Linear(4, 3)
    dst.load_state_dict(src.state_dict())
    plain = torch.optim.Adam(dst.parameters(), lr=1e-3)
    load_state(plain, fused.state_dict())
    group = plain.param_groups[0]
    assert not group["fused"] and group["lr"] == 1e-4
    saved = fused.state_dict()["state"]
    for i, p in enumerate(dst.parameters()):
        assert torch.equal(plain.state[p]["exp_avg"], saved[i]["exp_avg"])
        assert float(plain.state[p]["step"]) == 1.0
    dst(torch.randn(8, 4)).square().mean().backward()
    plain.step()  # the plain implementation runs on the loaded state
    assert float(plain.state[next(dst.parameters())]["step"]) == 2.0

"""lib.checkpoint: files written whole or not at all, what a checkpoint must be to be resumed,
and an optimizer's state loaded without its implementation."""

import pytest
import torch

from lib.checkpoint import CHECKPOINT_KIND, atomic_write, load_checkpoint, load_state
from lib.cli import UsageError, WriteError


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

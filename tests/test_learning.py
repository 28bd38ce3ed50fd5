"""The training loops learn: a small synthetic image task, solved within a minute on CPU.

The env (``tests/support/sidetarget.py``) quacks like an ALE game, so it goes through the
real wrapper sets and the real stage scripts, run as users run them: stage 01 (old wrappers,
one process) and stage 06 (new wrappers, play process, bf16 learner). A start-up hook on
PYTHONPATH registers the env and its "synthetic" hyperparameters in every process of the run,
the spawned play process included. Same task, same seed, same frames: 06 must learn it as 01
does, which is what "bf16 does not change learning" means at test scale.
"""

import os

import numpy as np
import pytest

from tests.conftest import ROOT, run_folder, run_stage


def _rewards(run_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_folder(run_dir)), size_guidance={"scalars": 0})
    acc.Reload()
    return [e.value for e in acc.Scalars("reward")]


@pytest.mark.parametrize("stage", ["01", "06"])
def test_stage_learns_synthetic_task(stage, tmp_path, monkeypatch):
    site = ROOT / "tests" / "support" / "site"
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), str(ROOT)]))
    runs = tmp_path / "runs"
    proc, code = run_stage(stage, "--game", "synthetic", "--max-frames", 1300, "--run-dir", runs, "--quiet")
    assert code == 0, proc.stderr
    rewards = _rewards(runs)
    # Early games (epsilon near 1) score about 0; the last ten must be close to the best of
    # 88-117 (runs of this test scored means of about 90 over their last ten games).
    assert abs(np.mean(rewards[:5])) < 30, rewards
    assert np.mean(rewards[-10:]) >= 70, rewards

"""The training loops learn: a small synthetic image task, solved within a minute on CPU.

The env (``tests/support/sidetarget.py``) quacks like an ALE game, so it goes through the
real wrapper sets and the real stage scripts, run in-process: stage 01 (old wrappers, one
process) and stage 06 (new wrappers, play process, bf16 learner). The env's id names its
module, so the play process imports it on ``gym.make``; this process gets the "synthetic"
hyperparameters directly. Same task, same seed: 06 must learn it as 01 does, which is what
"bf16 does not change learning" means at test scale. Stage 06 learns it with its default
``--precision auto`` (fp32 on a CPU that would emulate bf16) and, where the CPU computes bf16
natively, in bf16 too; where it does not, that run would take ten minutes of emulation, and
the bf16 arithmetic stays pinned by test_loss's and test_model's bf16-against-fp32 checks. (Stages 07 and 08 play ALE's native
vector env, which runs ROMs only; their learners are pinned to 06's by equal-update tests.)

Stage 01 learns it on the solve path, end to end, with a stop reward it reaches in seconds:
``solved=yes``, ``model.pt`` and ``best.pt`` written, then loaded and played by ``lib.analysis.watch``.
"""

import numpy as np
import pytest
import torch

from lib.precision import native_bf16
from tests.conftest import result_fields, run_folder, run_inprocess


@pytest.fixture
def synthetic(monkeypatch):
    from lib.params import GAMES
    from tests.support.sidetarget import PARAMS

    monkeypatch.setitem(GAMES, "synthetic", PARAMS)
    monkeypatch.setitem(GAMES, "synthetic-solvable", PARAMS.replace(stop_reward=SOLVED_AT))
    return "synthetic"


def _rewards(run_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_folder(run_dir)), size_guidance={"scalars": 0})
    acc.Reload()
    return [e.value for e in acc.Scalars("reward")]


NATIVE_BF16 = native_bf16("cpu")


@pytest.mark.parametrize(
    "stage, precision",
    [
        ("06", "auto"),
        pytest.param(
            "06", "bf16", marks=pytest.mark.skipif(not NATIVE_BF16, reason="bf16 is emulated on this CPU (oneDNN)")
        ),
    ],
)
def test_stage_learns_synthetic_task(stage, precision, tmp_path, synthetic):
    runs = tmp_path / "runs"
    res = run_inprocess(
        stage, "--game", synthetic, "--precision", precision, "--max-frames", 1300, "--run-dir", runs, "--quiet"
    )
    assert res.code == 0, res.stderr
    rewards = _rewards(runs)
    # Early games (epsilon near 1) score about 0; the last ten must be close to the best of
    # 88-117 (runs of this test scored means of about 90 over their last ten games).
    assert abs(np.mean(rewards[:5])) < 30, rewards
    assert np.mean(rewards[-10:]) >= 70, rewards


# The mean of the last 100 games (of all, while fewer) must pass this: far above what random
# play scores (about 0), reached once the net has learned the task.
SOLVED_AT = 40.0


def test_solve_path_end_to_end(tmp_path, synthetic, capsys):
    from lib.analysis import watch

    runs = tmp_path / "runs"
    res = run_inprocess("01", "--game", "synthetic-solvable", "--max-frames", 4000, "--run-dir", runs)
    assert res.code == 0, res.stderr
    rewards = _rewards(runs)
    assert abs(np.mean(rewards[:5])) < 30, rewards  # random play first, as in the learning test
    fields = result_fields(res.stdout)
    assert fields["solved"] == "yes" and float(fields["mean_reward"]) > SOLVED_AT
    assert int(fields["frames"]) < 4000, "the run went on after it was solved"
    assert f"Solved in {fields['frames']} frames!" in res.stdout
    assert res.outcome.summary["solved"] is True
    folder = run_folder(runs)
    model = torch.load(folder / "model.pt", weights_only=True)
    assert model["kind"] == "dqn-speedup-model" and model["frame_idx"] == int(fields["frames"])
    best = torch.load(folder / "best.pt", weights_only=True)
    assert best["mean_reward"] <= model["mean_reward"]
    # The saved weights are the trained net's, and lib.analysis.watch plays them greedily and well.
    net = res.run.saveables["net"].state_dict()
    assert all(torch.equal(model["net"][k], net[k]) for k in net)
    capsys.readouterr()
    assert watch.main([str(folder / "model.pt"), "--episodes", "2", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    scores = [float(line.split("reward ")[1].split()[0]) for line in out.splitlines() if line.startswith("episode")]
    assert len(scores) == 2 and min(scores) > SOLVED_AT, out
    assert watch.main([str(folder / "best.pt"), "--episodes", "1", "--device", "cpu"]) == 0


@pytest.mark.parametrize("stage", ["01", "02", "03", "04", "05", "06", "07", "08"])
def test_a_solve_ends_every_stage_at_the_solving_game(stage, tmp_path, monkeypatch):
    """Each stage ends at the game that solves, the same way (``Run.game_over`` raises ``Solved``):
    no train step runs after it, and model.pt is the net of the solving frame. 03-06 once left
    only their play loop and ran one more train step. A stop reward below any score makes the
    first finished game the solving one: the synthetic task's 30-step games for 01-06 (training
    from frame 16), one game of Pong for 07-08 (training from frame 400)."""
    from lib.params import GAMES
    from lib.run.runner import Run
    from tests.support.sidetarget import PARAMS

    vector = stage in ("07", "08")
    game = "pong-first" if vector else "synthetic-first"
    monkeypatch.setitem(GAMES, game, (GAMES["pong"] if vector else PARAMS).replace(stop_reward=-1e9))
    learned = []  # at each train step: had the run been solved?
    parts = Run.parts

    class Counted:  # the stage's learn, as the run measures it, noting each call
        def __init__(self, run, learn):
            self.run, self.learn = run, learn

        def __call__(self, *args, **kwargs):
            learned.append(self.run.solved_flag)
            return self.learn(*args, **kwargs)

        def __getattr__(self, name):  # 08's ``learn.ready``
            return getattr(self.learn, name)

    def watched_parts(run, **given):
        if "learn" in given:
            given["learn"] = Counted(run, given["learn"])
        return parts(run, **given)

    monkeypatch.setattr(Run, "parts", watched_parts)
    fill = ["--replay-initial", 400, "--envs", 1] if vector else ["--replay-initial", 16]
    runs = tmp_path / "runs"
    res = run_inprocess(stage, "--game", game, *fill, "--max-frames", 3000, "--run-dir", runs, "--quiet")
    assert res.code == 0, res.stderr
    frames = int(result_fields(res.stdout)["frames"])
    assert f"Solved in {frames} frames!" in res.stdout and res.outcome.summary["solved"] is True
    assert learned and not any(learned), "a train step ran after the solving game"
    model = torch.load(run_folder(runs) / "model.pt", weights_only=True)
    assert model["frame_idx"] == frames
    net = res.run.saveables["net"].state_dict()
    assert all(torch.equal(model["net"][k], net[k]) for k in net)

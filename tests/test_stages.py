"""Each numbered script runs end to end on CPU with a tiny budget, on the real emulator."""


import pytest
import torch

from tests.conftest import STAGES, assert_group_gone, result_fields, run_folder, run_stage, summary


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_stage_smoke(stage, runs):
    proc, code = run_stage(stage, "--max-frames", 320, "--replay-initial", 200, "--run-dir", runs, "--quiet")
    assert code == 0, proc.stderr
    assert_group_gone(proc.pgid)
    fields = result_fields(proc.stdout)
    assert fields["stage"] == stage and fields["game"] == "pong"
    assert int(fields["frames"]) >= 320
    assert float(fields["fps"]) > 0  # training ran after the buffer filled
    assert fields["solved"] == "no"
    data = summary(runs)
    assert data["stage"] == stage and data["frames"] == int(fields["frames"])
    assert data["train_frames"] > 0 and data["interrupted"] is None
    folder = run_folder(runs)
    assert folder.name.startswith(f"{stage}-pong-seed0-")
    assert list(folder.glob("events.out.tfevents.*")), "no TensorBoard event file"
    assert proc.stderr.strip() == "", proc.stderr


def test_stage_08_capture_graph_needs_cuda(runs):
    """--capture graph on a CPU run is bad input: one line, exit code 2, no run folder."""
    proc, code = run_stage("08", "--capture", "graph", "--run-dir", runs)
    assert code == 2
    assert proc.stderr.count("\n") == 1 and "--capture graph needs CUDA" in proc.stderr, proc.stderr
    assert not runs.exists()


def _checkpoint_net(run_dir):
    ckpt = torch.load(run_folder(run_dir) / "checkpoint.pt", weights_only=True)
    return ckpt["frame_idx"], ckpt["net"], ckpt["optimizer"]


def test_play_steps_1_equals_basic(tmp_path):
    """02 with --steps 1 does exactly 01's computation for the same seed on CPU: same env
    steps, same samples, same train steps, so the weights are bit-identical after training."""
    nets = []
    for stage, extra in (("01", []), ("02", ["--steps", 1])):
        run_dir = tmp_path / stage
        proc, code = run_stage(
            stage, "--max-frames", 400, "--replay-initial", 250, "--save-every", 400, "--run-dir", run_dir,
            "--quiet", "--seed", 3, *extra,
        )
        assert code == 0, proc.stderr
        nets.append(_checkpoint_net(run_dir))
    (f1, net1, opt1), (f2, net2, opt2) = nets
    assert f1 == f2 == 400
    # The buffer reaches 250 transitions at frame 250 + its 3 pad slots: 151 train steps.
    assert opt1["state"][0]["step"] == opt2["state"][0]["step"] == 151
    for name in net1:
        assert torch.equal(net1[name], net2[name]), name

"""Runs that survive real use: bad input refused, signals, dead processes, checkpoints.

Every test drives a real stage script in its own process group, as a shell would.
"""

import signal
import time

import pytest
import torch

from tests.conftest import (
    StageProcess,
    assert_group_gone,
    result_fields,
    run_folder,
    run_stage,
    summary,
)

TINY = ("--max-frames", 400, "--replay-initial", 200, "--quiet")


def _assert_usage_error(proc, code, runs):
    assert code == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "error:" in lines[0] and "Traceback" not in proc.stderr
    assert not runs.exists(), "bad input created the run folder"


@pytest.mark.parametrize(
    "stage, args, words",
    [
        ("01", ["--game", "tetris"], "unknown game"),
        ("01", ["--env", "NoSuchGameNoFrameskip-v4"], "does not exist"),
        ("02", ["--steps", "0"], "--steps"),
        ("01", ["--max-frames", "-5"], "--max-frames"),
        ("01", ["--replay-size", "abc"], "--replay-size"),
        ("01", ["--device", "tpu"], "--device"),
        ("07", ["--envs", "0"], "--envs"),
        ("03", ["--resume", "no/such/checkpoint.pt"], "no such file"),
    ],
)
def test_bad_input_one_line_exit_2(stage, args, words, runs):
    proc, code = run_stage(stage, "--run-dir", runs, *args)
    _assert_usage_error(proc, code, runs)
    assert words in proc.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_cuda_refused(runs):
    # stage_cmd passes --device cpu first; the later --cuda asks for CUDA all the same.
    proc, code = run_stage("04", "--run-dir", runs, "--cuda")
    _assert_usage_error(proc, code, runs)
    assert "CUDA" in proc.stderr


def test_unwritable_run_dir_refused(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    runs = blocker / "runs"
    proc, code = run_stage("01", "--run-dir", runs)
    assert code == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "not a writable folder" in proc.stderr


def test_corrupt_checkpoint_refused(tmp_path, runs):
    bad = tmp_path / "checkpoint.pt"
    bad.write_bytes(b"\x80\x02 this is not a checkpoint")
    proc, code = run_stage("05", "--run-dir", runs, "--resume", bad)
    _assert_usage_error(proc, code, runs)
    assert "not a readable checkpoint" in proc.stderr


def _interrupt(stage, sig, wait_prefix, *args, sigint_ignored=False):
    proc = StageProcess(stage, *args, sigint_ignored=sigint_ignored)
    proc.wait_for(wait_prefix)
    time.sleep(0.5)
    sent = time.monotonic()
    proc.signal_group(sig)  # like Ctrl-C in a terminal: the whole job gets it
    code = proc.finish(timeout=30)
    took = time.monotonic() - sent
    assert_group_gone(proc.pgid)
    return proc, code, took


@pytest.mark.parametrize(
    "stage, sig, code_wanted, phase, sigint_ignored",
    [
        ("01", signal.SIGINT, 130, "train", False),
        ("03", signal.SIGINT, 130, "fill", False),
        ("05", signal.SIGTERM, 143, "train", False),
        ("07", signal.SIGINT, 130, "train", True),  # started as a background job would be
    ],
)
def test_signal_stops_every_process_cleanly(stage, sig, code_wanted, phase, sigint_ignored, runs):
    replay_initial = 100_000 if phase == "fill" else 100
    proc, code, took = _interrupt(
        stage, sig, "PROGRESS", "--run-dir", runs, "--replay-initial", replay_initial,
        "--replay-size", 100_000, "--progress", 1, "--quiet", sigint_ignored=sigint_ignored,
    )
    assert code == code_wanted, proc.stderr
    assert took < 5.0
    assert "Traceback" not in proc.stderr, proc.stderr
    name = signal.Signals(sig).name
    fields = result_fields(proc.stdout)
    assert fields["solved"] == "no" and fields["interrupted"] == name
    data = summary(runs)
    assert data["interrupted"] == name and data["solved"] is False
    assert list(run_folder(runs).glob("events.out.tfevents.*"))


def test_sigterm_to_trainer_alone_ends_play_process(runs):
    proc = StageProcess("04", "--run-dir", runs, "--replay-initial", 100, "--progress", 1, "--quiet")
    proc.wait_for("PROGRESS")
    proc.proc.send_signal(signal.SIGTERM)
    assert proc.finish(timeout=30) == 143
    assert_group_gone(proc.pgid)


def _children(pid):
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(p) for p in f.read().split()]


def _play_pid(trainer_pid):
    # The trainer's children: the play process and multiprocessing's resource tracker.
    for pid in _children(trainer_pid):
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if b"spawn_main" in f.read():
                return pid
    raise AssertionError("no play process found")


def test_killed_play_process_is_noticed(runs):
    proc = StageProcess("03", "--run-dir", runs, "--replay-initial", 100, "--progress", 1, "--quiet")
    proc.wait_for("PROGRESS")
    import os

    os.kill(_play_pid(proc.proc.pid), signal.SIGKILL)
    killed = time.monotonic()
    code = proc.finish(timeout=30)
    assert time.monotonic() - killed < 5.0
    assert code == 1
    assert "play process died (killed by signal SIGKILL)" in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].count("\n") == 0
    assert_group_gone(proc.pgid)
    assert summary(runs)["error"]


def test_crashing_play_process_names_the_cause(runs):
    # The emulator raises after 2,000 raw frames (500 agent steps), while the buffer fills.
    proc, code = run_stage(
        "05", "--run-dir", runs, "--env", "tests.support.crashenv:CrashingPong-v0", "--replay-initial", 5_000,
        "--quiet",
    )
    assert code == 1
    assert "the play process failed: RuntimeError: scripted emulator crash" in proc.stderr
    assert_group_gone(proc.pgid)


def test_killed_trainer_takes_play_process_with_it(runs):
    proc = StageProcess("06", "--run-dir", runs, "--replay-initial", 100, "--progress", 1, "--quiet")
    proc.wait_for("PROGRESS")
    play = _play_pid(proc.proc.pid)
    proc.proc.kill()
    proc.finish(timeout=30)
    deadline = time.monotonic() + 5.0
    import os

    while time.monotonic() < deadline:
        try:
            os.kill(play, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    os.killpg(proc.pgid, signal.SIGKILL)
    raise AssertionError("the play process outlived its trainer by 5 s")


def test_checkpoint_resume_and_refusal(runs):
    proc, code = run_stage("02", "--run-dir", runs, "--save-every", 200, *TINY)
    assert code == 0, proc.stderr
    folder = run_folder(runs)
    ckpt_path = folder / "checkpoint.pt"
    ckpt = torch.load(ckpt_path, weights_only=True)
    assert ckpt["frame_idx"] == 400 and ckpt["game"] == "pong"
    for key in ("net", "tgt_net", "optimizer", "rng", "params", "rewards", "epsilon"):
        assert key in ckpt
    assert not list(folder.glob("*.tmp")), "a temporary checkpoint was left behind"

    proc, code = run_stage("02", "--resume", ckpt_path, "--max-frames", 600, "--replay-initial", 100, "--quiet")
    assert code == 0, proc.stderr
    assert "resuming 02 pong at frame 400" in proc.stdout and "refilled" in proc.stdout
    fields = result_fields(proc.stdout)
    assert fields["frames"] == "600"
    data = summary(runs)  # the same run folder goes on
    assert data["start_frame"] == 400 and data["frames"] == 600
    assert torch.load(ckpt_path, weights_only=True)["frame_idx"] == 600
    # The optimizer went on from where it stopped: its step count kept growing.
    assert torch.load(ckpt_path, weights_only=True)["optimizer"]["state"][0]["step"] > ckpt["optimizer"]["state"][0]["step"]

    proc, code = run_stage("02", "--resume", ckpt_path, "--game", "breakout", "--max-frames", 800)
    assert code == 2 and "checkpoint is for game 'pong', not 'breakout'" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_flush_denormals_makes_subnormals_zero():
    # Late in a run, Adam moments decay into the subnormal range, which x86 CPUs handle slowly.
    from lib.runner import flush_denormals

    tiny = torch.tensor([1e-39], dtype=torch.float32)
    flush_denormals()
    assert (tiny * 1.0).item() == 0.0


def test_resumed_optimizer_keeps_its_own_implementation():
    """Loading an optimizer's state moves what it learned (moments, step counts, lr), never how
    it runs: stage 05 (plain Adam) resuming stage 07's checkpoint (fused Adam) stays plain."""
    from lib.runner import load_state

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

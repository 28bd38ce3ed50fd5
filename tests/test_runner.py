"""Runs that survive real use: bad input refused, signals, dead processes, checkpoints.

Bad input, checkpoints and a crashing play process are tried in-process (``runner.main``
returns the exit code); signals, process groups and a killed play process with real
subprocesses in their own process group, as a shell would run them.
"""

import contextlib
import io
import os
import signal
import subprocess
import time

import numpy as np
import pytest
import torch

from lib.analysis import run_folders as runs_module
from lib.run.scripts import load_script
from tests.conftest import (
    StageProcess,
    assert_group_gone,
    result_fields,
    run_folder,
    run_inprocess,
    run_stage,
    summary,
)

TINY = ("--max-frames", 400, "--replay-initial", 200, "--quiet")


def _assert_usage_error(res, runs):
    assert res.code == 2, (res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert "error:" in lines[0] and "Traceback" not in res.stderr
    assert res.stdout == ""
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
        # Knobs against each other and against memory, before anything starts.
        ("07", ["--steps", "1000000", "--max-frames", "100"], "larger than the replay size"),
        ("02", ["--steps", "8", "--replay-size", "200", "--replay-initial", "100"], "32*8 = 256"),
        ("05", ["--progress", "0"], "--progress"),
        ("05", ["--progress", "-1"], "--progress"),
        # 100,000 games need about 390 GiB whatever the machine (5,000 fitted a 24 GiB one).
        ("07", ["--envs", "100000", "--replay-size", "1000000"], "GiB available"),
        ("07", ["--envs", "20", "--replay-size", "100", "--replay-initial", "50", "--steps", "1"], "slots per game"),
        ("01", ["--replay-size", "10000000000"], "GiB available"),
    ],
)
def test_bad_input_one_line_exit_2(stage, args, words, runs):
    res = run_inprocess(stage, "--run-dir", runs, *args)
    _assert_usage_error(res, runs)
    assert words in res.stderr


def test_bad_input_from_the_shell_one_line_exit_2(runs):
    proc, code = run_stage("06", "--run-dir", runs, "--game", "tetris")
    assert code == 2 and proc.stdout == "", proc.stdout
    assert proc.stderr.strip().splitlines() == [
        "06_bf16_learner.py: error: unknown game 'tetris' (known: pong, breakout, spaceinvaders, seaquest, riverraid)"
    ]
    assert not runs.exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_cuda_refused(runs):
    # run_inprocess passes --device cpu first; the later --cuda asks for CUDA all the same.
    res = run_inprocess("04", "--run-dir", runs, "--cuda")
    _assert_usage_error(res, runs)
    assert "CUDA" in res.stderr


def test_unwritable_run_dir_refused(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    runs = blocker / "runs"
    res = run_inprocess("01", "--run-dir", runs)
    assert res.code == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "not a writable folder" in res.stderr


def test_corrupt_checkpoint_refused(tmp_path, runs):
    bad = tmp_path / "checkpoint.pt"
    bad.write_bytes(b"\x80\x02 this is not a checkpoint")
    res = run_inprocess("05", "--run-dir", runs, "--resume", bad)
    _assert_usage_error(res, runs)
    assert "not a readable checkpoint" in res.stderr


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
        ("08", signal.SIGTERM, 143, "train", False),
    ],
)
def test_signal_stops_every_process_cleanly(stage, sig, code_wanted, phase, sigint_ignored, runs):
    replay_initial = 100_000 if phase == "fill" else 100
    proc, code, took = _interrupt(
        stage,
        sig,
        "PROGRESS",
        "--run-dir",
        runs,
        "--replay-initial",
        replay_initial,
        "--replay-size",
        100_000,
        "--progress",
        1,
        "--quiet",
        sigint_ignored=sigint_ignored,
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
    # The trainer's children: its fork server, whose one child is the play process, and
    # multiprocessing's resource tracker.
    for pid in _children(trainer_pid):
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if b"forkserver" in f.read() and len(_children(pid)) == 1:
                return _children(pid)[0]
    raise AssertionError("no play process found")


def test_killed_play_process_is_noticed(runs):
    proc = StageProcess("03", "--run-dir", runs, "--replay-initial", 100, "--progress", 1, "--quiet")
    proc.wait_for("PROGRESS")
    os.kill(_play_pid(proc.proc.pid), signal.SIGKILL)
    killed = time.monotonic()
    code = proc.finish(timeout=30)
    assert time.monotonic() - killed < 5.0
    assert code == 1
    assert proc.stderr.strip().splitlines() == [
        "03_parallel.py: error: the play process died (killed by signal SIGKILL)"
    ]
    assert_group_gone(proc.pgid)
    assert summary(runs)["error"]
    assert result_fields(proc.stdout)["error"] == "yes"


def test_crashing_play_process_names_the_cause(runs):
    # The emulator raises after 2,000 raw frames (500 agent steps), while the buffer fills.
    res = run_inprocess(
        "05",
        "--run-dir",
        runs,
        "--env",
        "tests.support.crashenv:CrashingPong-v0",
        "--replay-initial",
        5_000,
        "--quiet",
    )
    assert res.code == 1
    # The play process prints its traceback to the terminal; the trainer says it in one line.
    assert res.stderr.strip().splitlines() == [
        "05_new_wrapper.py: error: the play process failed: RuntimeError: scripted emulator crash"
    ]
    assert not any(p.is_alive() for p in res.run.children)
    assert res.outcome.summary["error"].startswith("the play process failed")


def test_killed_trainer_takes_play_process_with_it(runs):
    proc = StageProcess("06", "--run-dir", runs, "--replay-initial", 100, "--progress", 1, "--quiet")
    proc.wait_for("PROGRESS")
    play = _play_pid(proc.proc.pid)
    proc.proc.kill()
    # finish() reads the pipes to their end before it reaps the trainer: until then the trainer
    # is a zombie, and only the play process's pidfd watch (not its parent's death: the fork
    # server outlives the trainer while the play process holds it) ends the play process.
    proc.finish(timeout=30)
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        try:
            os.kill(play, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    os.killpg(proc.pgid, signal.SIGKILL)
    raise AssertionError("the play process outlived its trainer by 5 s")


class _Writes(io.StringIO):
    """A stdout that keeps each write apart."""

    def __init__(self):
        super().__init__()
        self.chunks = []

    def write(self, text):
        self.chunks.append(text)
        return super().write(text)


def test_progress_and_result_lines_are_written_whole(runs):
    # A signal's handler can raise between two writes of one print() (its text, then its newline):
    # a PROGRESS line cut there lost its newline, and the RESULT line after it joined it in the log.
    out = _Writes()
    with contextlib.redirect_stdout(out):
        outcome = load_script("01").main(
            ["--device", "cpu", "--run-dir", str(runs), *map(str, TINY), "--progress", "0.01"]
        )
    assert outcome.code == 0
    lines = [c for c in out.chunks if c.startswith(("PROGRESS", "RESULT"))]
    assert any(c.startswith("PROGRESS") for c in lines) and lines[-1].startswith("RESULT")
    assert all(c.endswith("\n") and c.count("\n") == 1 for c in lines), lines


def test_exited_counts_a_zombie_and_a_reaped_process_and_not_a_live_one():
    from lib.run import procs

    assert not procs.exited(os.getpid())
    child = subprocess.Popen(["sleep", "30"])
    try:
        assert not procs.exited(child.pid)
        child.kill()
        deadline = time.monotonic() + 10.0
        while not procs.leader_exited(child.pid):  # dead, not reaped: a zombie
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert procs.alive(child.pid) and procs.exited(child.pid)
    finally:
        child.kill()
        child.wait()
    assert procs.exited(child.pid)


@pytest.fixture
def synthetic(monkeypatch):
    """The synthetic side-target game (30 agent steps a game) in this process's game table."""
    from lib.params import GAMES
    from tests.support.sidetarget import PARAMS

    monkeypatch.setitem(GAMES, "synthetic", PARAMS)
    return "synthetic"


def _state_after_attach(monkeypatch):
    """Record, right after ``Run.attach`` of a resumed run, what the run goes on from."""
    import copy
    import random

    from lib.run import runner
    from lib.schedules import epsilon_at

    seen = {}
    attach = runner.Run.attach

    def spy(self, buffer=None, **objects):
        attach(self, buffer=buffer, **objects)
        seen.update(
            frame=self.frame_idx,
            net={k: v.clone() for k, v in objects["net"].state_dict().items()},
            tgt_net={k: v.clone() for k, v in objects["tgt_net"].state_dict().items()},
            optimizer=copy.deepcopy(objects["optimizer"].state_dict()),
            python=random.getstate(),
            numpy=np.random.get_state()[1].copy(),
            torch=torch.get_rng_state().clone(),
            rewards=list(self.tracker.rewards),
            best_mean=self.tracker.best_mean,
            epsilon=epsilon_at(self.frame_idx, self.params),
        )

    monkeypatch.setattr(runner.Run, "attach", spy)
    return seen


def test_checkpoint_resume_restores_everything_saved(runs, synthetic, monkeypatch):
    res = run_inprocess("02", "--game", synthetic, "--run-dir", runs, "--save-every", 200, *TINY)
    assert res.code == 0, res.stderr
    folder = run_folder(runs)
    ckpt_path = folder / "checkpoint.pt"
    ckpt = torch.load(ckpt_path, weights_only=True)
    assert ckpt["frame_idx"] == 400 and ckpt["game"] == "synthetic"
    assert len(ckpt["rewards"]) >= 10 and ckpt["best_mean"] is not None  # games of 30 agent steps
    assert not list(folder.glob("*.tmp")), "a temporary checkpoint was left behind"

    seen = _state_after_attach(monkeypatch)
    res = run_inprocess("02", "--resume", ckpt_path, "--max-frames", 480, "--replay-initial", 40, "--quiet")
    assert res.code == 0, res.stderr
    assert "resuming 02 synthetic at frame 400" in res.stdout and "refilled" in res.stdout
    # What the resumed run started from is what the checkpoint holds.
    assert seen["frame"] == 400
    for name in ("net", "tgt_net"):
        assert seen[name].keys() == ckpt[name].keys()
        for key, value in ckpt[name].items():
            assert torch.equal(seen[name][key], value), (name, key)
    saved_opt = ckpt["optimizer"]["state"]
    for index, state in seen["optimizer"]["state"].items():
        for key in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(torch.as_tensor(state[key]), torch.as_tensor(saved_opt[index][key])), (index, key)
    assert seen["optimizer"]["param_groups"][0]["lr"] == ckpt["optimizer"]["param_groups"][0]["lr"]
    py = ckpt["rng"]["python"]
    assert seen["python"] == (py[0], tuple(py[1]), py[2])
    assert seen["numpy"].tolist() == ckpt["rng"]["numpy"][1]
    assert torch.equal(seen["torch"], ckpt["rng"]["torch"])
    assert seen["rewards"] == ckpt["rewards"] and seen["best_mean"] == ckpt["best_mean"]
    assert seen["epsilon"] == ckpt["epsilon"]

    assert res.outcome.summary["start_frame"] == 400 and res.outcome.summary["frames"] == 480
    # The run's time over its sittings: the checkpoint's, then this sitting's on top.
    first = ckpt["run_seconds"]
    assert 0 < first < res.outcome.summary["run_seconds"]
    assert res.outcome.summary["run_seconds"] == pytest.approx(first + res.outcome.summary["seconds"], abs=0.01)
    assert run_folder(runs) == folder  # the same run folder goes on
    # The curves count the run's time as run_seconds does (from each writer's start, which comes
    # a little after the sitting's): the second event file says it resumed at frame 400, its
    # points go on in time from the first's, and its last is no later than the run's time.
    assert [s["resumed"] for s in runs_module._sessions(str(folder))] == [None, 400]
    points = runs_module.stitched(str(folder))
    assert [p[1] for p in points] == sorted(p[1] for p in points)
    frame, seconds, _ = points[-1]
    assert 400 < frame <= 480 and 0 < seconds <= res.outcome.summary["run_seconds"] + 0.5
    after = torch.load(ckpt_path, weights_only=True)
    assert after["frame_idx"] == 480
    # The optimizer went on from where it stopped: its step count kept growing.
    assert after["optimizer"]["state"][0]["step"] > ckpt["optimizer"]["state"][0]["step"]

    res = run_inprocess("02", "--resume", ckpt_path, "--game", "pong", "--max-frames", 800)
    assert res.code == 2 and res.stderr.strip().splitlines() == [
        f"02_play_steps.py: error: --resume {ckpt_path}: the checkpoint is for game 'synthetic', not 'pong'"
    ]

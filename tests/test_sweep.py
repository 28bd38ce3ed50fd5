"""lib.sweep: a tiny grid on this machine and on a two-node Ray cluster on this machine, a rerun
that reruns nothing, a node lost mid-sweep, Ctrl-C, and bad input refused before anything starts.

Every run is a real stage script on the real emulator, kept tiny (a few seconds each). The Ray
tests share one cluster (starting one takes seconds) and are skipped where ray is not installed.
Nothing here leaves this machine: Ray's usage statistics are off, its dashboard is not started,
and RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 makes Ray give every node and driver the loopback
address instead of the machine's network address.
"""

import glob
import importlib.util
import json
import os
import pathlib
import queue
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import pytest

from lib import sweep
from lib.analysis.run_folders import resumes
from lib.run import procs
from lib.run.cli import ROOT

HAVE_RAY = importlib.util.find_spec("ray") is not None
needs_ray = pytest.mark.skipif(not HAVE_RAY, reason='ray is not installed (pip install -e ".[cluster]")')
RAY_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
# Stages 01 and 02 on Pong: 100 random fill frames, then 30 frames of training.
TINY = ["--max-frames", "130", "--per-run-cpus", "1", "--progress", "2", "--", "--replay-initial", "100",
        "--replay-size", "1000"]  # fmt: skip
GRID = ["01-pong-seed0", "02-pong-seed0"]


STARTED: list = []  # every sweep a test started, ended at its teardown if it is still running


@pytest.fixture(autouse=True)
def _no_sweep_left():
    yield
    while STARTED:
        proc = STARTED.pop().proc
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)  # as a user would: the sweep ends its runs
            try:
                proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


class Sweep:
    """``python -m lib.sweep`` in its own process group, its output read line by line."""

    def __init__(self, *args, env=None):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "lib.sweep", *map(str, args)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            env=dict(os.environ, PYTHONUNBUFFERED="1", **(env or {})),
            start_new_session=True,
        )
        STARTED.append(self)
        self.lines: list[str] = []
        self._new: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line)
            self._new.put(line)

    def wait_for(self, pattern, timeout=60.0):
        """The first line from now on that matches ``pattern``, as a match."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self._new.get(timeout=0.2)
            except queue.Empty:
                continue
            m = re.search(pattern, line)
            if m:
                return m
        raise AssertionError(f"no line matching {pattern!r} in:\n{self.output}")

    def finish(self, timeout=120.0) -> int:
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            raise AssertionError(f"the sweep did not end:\n{self.output}")
        time.sleep(0.1)  # the reader's last lines
        return code

    @property
    def output(self) -> str:
        return "".join(self.lines)


def run_sweep(*args, env=None, timeout=120.0):
    s = Sweep(*args, env=env)
    code = s.finish(timeout)
    return s, code


def assert_runs_arrived(out, keys, frames=130):
    for key in keys:
        folder = out / "runs" / key
        summary = json.loads((folder / "summary.json").read_text())
        # Stage 02 plays 4 frames per step: it may pass --max-frames by up to 3.
        assert frames <= summary["frames"] < frames + 4 and summary["interrupted"] is None and summary["error"] is None
        assert list(folder.glob("events.out.tfevents.*")), f"{key}: no event file"
        assert f"RESULT stage={key[:2]} game=pong frames={summary['frames']}" in (folder / "run.log").read_text()
    state = json.loads((out / "sweep.json").read_text())
    assert {k: v["status"] for k, v in state["runs"].items()} == dict.fromkeys(keys, "done")
    readme = (out / "README.md").read_text()
    assert "## Runs" in readme and "## Seeds" in readme and "- commit: " in readme
    assert "| f/s, ε decaying | f/s, ε at floor |" in readme
    return state


# -- bad input: one line, exit 2, nothing made or started ----------------------------------------


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(
    "case, argv, words",
    [
        ("unknown stage", ["--stages", "01,99"], "unknown stage '99'"),
        ("empty seed range", ["--stages", "01", "--seeds", "4-0"], "is empty"),
        ("seed list", ["--stages", "01", "--seeds", "a-b"], "--seeds"),
        ("unknown game", ["--stages", "01", "--games", "tetris"], "unknown game"),
        ("address format", ["--stages", "01", "--address", "nohost"], "HOST:PORT"),
        ("nothing at address", ["--stages", "01", "--address", "127.0.0.1:{port}"], "nothing answers"),
        ("no cpus", ["--stages", "01", "--per-run-cpus", "0"], "--per-run-cpus"),
        ("more cpus than cores", ["--stages", "01", "--per-run-cpus", "4096"], "cores"),
        ("negative frames", ["--stages", "01", "--max-frames", "-5"], "--max-frames: expected a number >= 1, got -5"),
        ("part of a gpu above 1", ["--stages", "01", "--per-run-gpus", "1.5"], "whole GPUs"),
        ("negative gpus", ["--stages", "01", "--per-run-gpus", "-1"], "--per-run-gpus: expected a number >= 0, got -1"),
        (
            "infinite gpus",
            ["--stages", "01", "--per-run-gpus", "inf"],
            "--per-run-gpus: expected a number >= 0, got inf",
        ),
        ("owned stage flag", ["--stages", "01", "--", "--seed", "3"], "--seeds"),
        ("unknown stage flag", ["--stages", "01", "--", "--bogus", "1"], "stage 01"),
        ("knob of no stage", ["--stages", "01,02", "--", "--envs", "4"], "--envs"),
        ("bad knob", ["--stages", "02", "--", "--steps", "0"], "--steps"),
        ("knob value not among its choices", ["--stages", "08", "--", "--capture", "fast"], "--capture"),
        ("fill above size", ["--stages", "01", "--", "--replay-initial", "2000", "--replay-size", "1000"], "larger"),
        ("no stages", ["--seeds", "0-2"], "required: --stages"),
        ("report with a grid", ["--report", "--stages", "01"], "--report: --stages"),
        ("an abbreviated option", ["--report", "--max-f", "9"], "unrecognized arguments: --max-f 9"),
        ("report with stage flags", ["--report", "--", "--envs", "4"], "--report: stage flags"),
        ("report of a folder with no sweep", ["--report"], "no sweep.json"),
        ("ring flag passed through", ["--stages", "01", "--max-frames", "1", "--", "--save-replay"], "--save-replay"),
        ("arm without a name", ["--stages", "02", "--arm", "--steps 2"], "NAME=FLAGS"),
        ("arm name with a dash", ["--stages", "02", "--arm", "two-steps=--steps 2"], "NAME=FLAGS"),
        ("two arms of one name", ["--stages", "02", "--arm", "a=", "--arm", "a=--steps 2"], "a name of its own"),
        ("arm knob of no stage", ["--stages", "02", "--arm", "e=--envs 2"], "--envs"),
        ("arm flag the sweep sets", ["--stages", "02", "--arm", "s=--seed 3"], "--seeds"),
        ("report with arms", ["--report", "--arm", "a="], "--report: --arm"),
    ],
)
def test_bad_input_one_line_exit_2(case, argv, words, tmp_path, capsys):
    out = tmp_path / "sweep"
    argv = [a.format(port=_closed_port()) for a in argv]
    pos = argv.index("--") if "--" in argv else len(argv)
    argv[pos:pos] = ["--out", str(out)]
    code = sweep.main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and err.startswith("sweep: error: "), err
    assert words in err
    assert not out.exists(), "bad input made the sweep's folder"
    ray = sys.modules.get("ray")  # imported only if the sweep went that far
    assert ray is None or not ray.is_initialized()


def test_an_address_that_is_not_ray_gets_one_line_and_none_of_rays_own(capfd, monkeypatch):
    """A port that answers but is not a Ray head: while Ray tries it, what its C++ core writes
    to the file descriptors (a stand-in for ray here, writing as Ray's core does) is not shown;
    the sweep's own line is."""
    import types

    from lib.run.cli import UsageError
    from lib.sweep import ray_pool

    def init(**kwargs):
        os.write(2, b"[2026-01-01 00:00:00,000 W 1 1] gcs_rpc_client.h:151: Failed to connect to GCS\n")
        os.write(1, b"[core] retrying\n")
        raise ConnectionError("Could not read 'session_name' from GCS")

    monkeypatch.setitem(sys.modules, "ray", types.SimpleNamespace(init=init))
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        address = f"127.0.0.1:{server.getsockname()[1]}"
        with pytest.raises(UsageError, match="cannot join the Ray cluster"):
            ray_pool.RayPool(address, 1.0, None).connect()
    out, err = capfd.readouterr()
    assert out == "" and err == ""


def test_plan_routes_knobs_and_orders_by_seed():
    args = sweep.parse_args(
        ["--stages", "7,1", "--seeds", "0-1", "--max-frames", "9", "--", "--envs", "2", "--replay-initial", "50"]
    )
    specs = sweep.plan(args)
    assert [s.key for s in specs] == ["01-pong-seed0", "07-pong-seed0", "01-pong-seed1", "07-pong-seed1"]
    assert specs[0].flags == ("--replay-initial", "50")
    assert specs[1].flags == ("--envs", "2", "--replay-initial", "50")
    assert sweep.parse_seeds("1,3-4,3") == [1, 3, 4]
    # Each knob is checked with its own type: --capture takes a word, --envs a number.
    args = sweep.parse_args(["--stages", "07,08", "--", "--capture", "none", "--envs", "2"])
    assert [s.flags for s in sweep.plan(args)] == [("--envs", "2"), ("--capture", "none", "--envs", "2")]


def test_arms_repeat_the_grid_with_their_flags_in_folders_of_their_own():
    args = sweep.parse_args(["--stages", "07,08", "--seeds", "0-1", "--arm", "base=", "--arm", "fp32=--precision fp32",
                             "--", "--capture", "none"])  # fmt: skip
    specs = sweep.plan(args)
    assert [s.key for s in specs] == [
        "07+base-pong-seed0", "07+fp32-pong-seed0", "08+base-pong-seed0", "08+fp32-pong-seed0",
        "07+base-pong-seed1", "07+fp32-pong-seed1", "08+base-pong-seed1", "08+fp32-pong-seed1",
    ]  # fmt: skip
    # The sweep's own pass-through flags first (--capture is 08's knob only), then the arm's.
    assert [s.flags for s in specs[:4]] == [(), ("--precision", "fp32"), ("--capture", "none"),
                                            ("--capture", "none", "--precision", "fp32")]  # fmt: skip
    assert {s.arm for s in specs} == {"base", "fp32"}
    # Without --arm, one arm without a name: the keys as ever.
    assert [s.key for s in sweep.plan(sweep.parse_args(["--stages", "08"]))] == ["08-pong-seed0"]


def test_a_sweep_of_two_arms_reports_each_as_a_stage_of_its_own(tmp_path):
    """Two arms of stage 02 (N=1 and N=2) run, are told apart in the report and the seed tables,
    record their knob in summary.json, and come back the same with --report."""
    out = tmp_path / "sweep"
    result, code = run_sweep("--stages", "02", "--arm", "one=--steps 1", "--arm", "two=--steps 2", "--out", out, *TINY)
    assert code == 0, result.output
    keys = ["02+one-pong-seed0", "02+two-pong-seed0"]
    assert_runs_arrived(out, keys)
    summaries = [json.loads((out / "runs" / k / "summary.json").read_text()) for k in keys]
    assert [s["knobs"]["steps"] for s in summaries] == [1, 2] and not any(s["resumed"] for s in summaries)
    readme = (out / "README.md").read_text()
    assert "x arms one, two" in readme.splitlines()[0] and "- arm `two`: `--steps 2`" in readme
    assert "| 02+one-pong-seed0 | done |" in readme and "| 02+two-pong-seed0 | done |" in readme
    seeds = (out / "curves.md").read_text()
    assert "| stage 02+one | 0 |" in seeds and "| stage 02+two | 0 |" in seeds
    assert json.loads((out / "sweep.json").read_text())["grid"]["arms"] == ["one=--steps 1", "two=--steps 2"]
    assert sweep.main(["--report", "--out", str(out)]) == 0
    assert "| 02+two-pong-seed0 | done |" in (out / "README.md").read_text()


def test_run_minutes_count_every_sitting_and_say_when_they_cannot():
    from lib.sweep.report import _minutes

    assert _minutes({"seconds": 600.0, "run_seconds": 1500.0, "start_frame": 20000}) == "25.0"
    assert _minutes({"seconds": 600.0, "run_seconds": None, "start_frame": 20000}) == "10.0 from frame 20000"
    assert _minutes({"seconds": 600.0, "start_frame": 0}) == "10.0"
    assert _minutes({}) == "—"


def test_the_folders_notes_go_into_its_readme_every_time(tmp_path):
    from lib.sweep.report import notes_section

    assert notes_section(str(tmp_path)) == []
    (tmp_path / "NOTES.md").write_text("Sitting 1 ran beside the test suite.\n")
    assert notes_section(str(tmp_path)) == ["## Notes", "", "Sitting 1 ran beside the test suite.", ""]
    (tmp_path / "NOTES.md").write_bytes(b"\xff\xfe not text")
    assert notes_section(str(tmp_path)) == []


def _ended_sweep(out):
    """A folder as a sweep of 08 over seeds 0-1 leaves it when interrupted during seed 0."""
    from tests.test_run_folders import _resumed_run

    run = out / "runs" / "08-pong-seed0"
    run.mkdir(parents=True)
    _resumed_run(run, 1_700_000_000.0)
    summary = {"stage": "08", "game": "pong", "seed": 0, "frames": 400, "run_seconds": 240.0, "fps": 3.3,
               "solved": False, "mean_reward": -9.0, "interrupted": "SIGINT", "error": None,
               "params": {"replay_initial": 100, "epsilon_frames": 300}}  # fmt: skip
    (run / "summary.json").write_text(json.dumps(summary))
    state = {
        "grid": {"stages": "08", "seeds": "0-1", "games": "pong", "max_frames": 1000, "flags": []},
        "runs": {"08-pong-seed0": {"status": "interrupted", "attempts": 2, "frames": 400, "host": "vm", "node": None,
                                   "reason": "exit code 130"}},
        "invocations": [{"command": "python -m lib.sweep --stages 08 --seeds 0-1", "commit": "abc1234",
                         "date": "2026-12-01T05:00:00", "wall_s": 240.0, "where": "this machine (2 cores, 0 GPUs)",
                         "outcome": "interrupted"}],
    }  # fmt: skip
    (out / "sweep.json").write_text(json.dumps(state))


def test_report_writes_the_readme_again_from_sweep_json_and_runs_nothing(tmp_path, capsys):
    out = tmp_path / "sweep"
    _ended_sweep(out)
    (out / "NOTES.md").write_text("Sitting 1 ran beside the test suite.\n")
    before = (out / "sweep.json").read_bytes()
    assert sweep.main(["--report", "--out", str(out)]) == 0, capsys.readouterr().err
    readme = (out / "README.md").read_text()
    # The last invocation's facts, each run's row with its speed by phase (tests/test_run_folders.py's
    # two sittings: 100/60 f/s while epsilon decays, 100/30 at its floor), the notes.
    assert "- command: `python -m lib.sweep --stages 08 --seeds 0-1`" in readme
    assert "- commit: abc1234; date: 2026-12-01T05:00:00" in readme
    assert "- hardware: not recorded" in readme and "4 min this time (interrupted)" in readme
    # One resume (sitting 2, from frame 200) whose ring neither its events nor a run.log record.
    assert "| 08-pong-seed0 | interrupted | 400 | 4.0 | 1.7 | 3.3 | -9.0 | no | 1 | — | 2 | vm |" in readme
    assert "| 08-pong-seed1 | queued | — | — | — | — | — | — | 0 | 0 | 0 | — |" in readme
    # Each run's frames to each level and reward_100 at fixed frames, beside the 2017 run's.
    levels = readme.split("Each run: frames to each level")[1]
    assert (
        levels.count("| 08-pong-seed0 |") == 1
        and "| 2017 basic DQN (1 run, GTX 1080 Ti) | fp32, 1, 1 | 114344 |" in levels
    )
    # Where the 2017 run stands: behind this run at -19 and -15 (frames 200 and 300), the rest unplaced.
    assert "stands among these Pong runs (1: ahead of every one; a run that stopped short of its figure" in levels
    assert "left out): frames to -19: 2 of 2; frames to -15: 2 of 2. Were it" in levels
    assert readme.rstrip().endswith("## Notes\n\nSitting 1 ran beside the test suite.")
    assert (out / "curves.png").exists() and "stage 08" in (out / "curves.md").read_text()
    assert (out / "sweep.json").read_bytes() == before, "--report wrote sweep.json"
    assert not (out / ".work").exists() and sorted(os.listdir(out / "runs")) == ["08-pong-seed0"]
    # A sweep.json that is not one: one line, exit 2.
    (out / "sweep.json").write_text("{not json")
    assert sweep.main(["--report", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "sweep.json cannot be read" in err


def test_the_report_places_the_2017_run_among_the_pong_runs():
    from lib.analysis import reference
    from lib.sweep.report import LEVELS, _reference_places

    frames, minutes, values = reference.curve()
    reached, at = reference.marks(frames, minutes, values, LEVELS)
    never = [None] * len(LEVELS)
    # Two runs to 400k: one ahead of the 2017 run to -19 and -15 and at 400k, one that never
    # reached -19 (behind it there) and stood below it at 400k; neither is placed at 0 and beyond.
    ahead = ([110_000, 230_000, *never[2:]], 400_000, [-19.0, -16.0, -11.0, 3.5])
    behind = (never, 400_000, [-20.5, -20.0, -19.5, -19.0])
    line = _reference_places(reached, at, [ahead, behind])
    assert "frames to -19: 2 of 3; frames to -15: 2 of 3; reward_100 at 100k: 2 of 3" in line
    assert "reward_100 at 400k: 2 of 3." in line and "frames to 0" not in line
    assert _reference_places(reached, at, [(never, 50_000, [None] * 4)]) == ""


def test_run_speed_while_epsilon_decays_and_at_its_floor_comes_from_the_event_files(tmp_path):
    from lib.sweep.report import _phase_speeds
    from tests.test_run_folders import _resumed_run

    _resumed_run(tmp_path, 1_700_000_000.0)
    params = {"params": {"replay_initial": 100, "epsilon_frames": 300}}
    # Decaying (games ending in (100, 300]): sitting 1's 100->200 at 100/60 f/s; sitting 2's
    # first game has no game before it. At the floor (past 300): sitting 2's 300->400 at 100/30,
    # sitting 1's 300 and 400 having been played again.
    assert _phase_speeds(str(tmp_path), params) == pytest.approx((100 / 60, 100 / 30))
    assert _phase_speeds(str(tmp_path), {}) == (None, None)  # no summary: no schedule
    assert _phase_speeds(str(tmp_path / "nothing"), params) == (None, None)


def test_local_pool_packs_runs_by_cores_and_gpu_shares(tmp_path):
    # 16 cores, two GPUs listed as CUDA_VISIBLE_DEVICES entries 3 and 5 (no GPU is needed here).
    pool = sweep.LocalPool(1, 0.25, str(tmp_path), cores=16, gpu_names=["3", "5"])
    got = []
    while pool.can_start():
        got.append(pool.reserve(len(got)))
    assert got == [["3"]] * 4 + [["5"]] * 4 and pool.slots() == 8  # a quarter GPU each: four per GPU
    pool.release(5)
    assert pool.can_start() and pool.reserve(99) == ["5"]
    # Two whole GPUs per run on two GPUs: one at a time; cores bound CPU runs.
    pool = sweep.LocalPool(2, 2, str(tmp_path), cores=16, gpu_names=["0", "1"])
    assert pool.reserve(0) == ["0", "1"] and not pool.can_start()
    assert sweep.LocalPool(4, 0, str(tmp_path), cores=16, gpu_names=[]).slots() == 4
    spec = sweep.RunSpec("06", "pong", 1, 100, 50, 5.0, (), cpus=2.0, gpus=0.25)
    env = sweep.child_env(spec, ["5"])
    assert env["CUDA_VISIBLE_DEVICES"] == "5" and env["OMP_NUM_THREADS"] == "2"
    assert spec.argv()[spec.argv().index("--device") + 1] == "cuda"
    cpu = sweep.RunSpec("06", "pong", 1, 100, 50, 5.0, (), cpus=0.5, gpus=0.0)
    assert sweep.child_env(cpu, [])["CUDA_VISIBLE_DEVICES"] == "" and "cpu" in cpu.argv()


# -- this machine --------------------------------------------------------------------------------


def test_local_grid_then_a_rerun_reruns_nothing(tmp_path):
    out = tmp_path / "sweep"
    first, code = run_sweep("--stages", "01,02", "--out", out, *TINY)
    assert code == 0, first.output
    assert "2 at a time" in first.output  # 2 cores, 1 CPU per run: side by side
    state = assert_runs_arrived(out, GRID)
    assert all(r["node"] is None for r in state["runs"].values())
    assert re.search(r"sweep: 2/2 done, 0 running, 0 failed, 0 queued", first.output)
    stamps = {p: p.stat().st_mtime_ns for p in (out / "runs").rglob("*")}

    again, code = run_sweep("--stages", "01,02", "--out", out, *TINY)
    assert code == 0, again.output
    assert "2 finished before, 0 to run" in again.output
    assert "started" not in again.output
    assert {p: p.stat().st_mtime_ns for p in (out / "runs").rglob("*")} == stamps
    assert len(json.loads((out / "sweep.json").read_text())["invocations"]) == 2


def test_the_readme_names_the_commit_its_runs_started_from(tmp_path, monkeypatch, capsys):
    # A sweep on a CPU runs for hours; a commit made meanwhile is not the code its runs run.
    from lib.run import cli
    from lib.sweep import command

    checked_out = ["1111111"]
    monkeypatch.setattr(cli, "git_commit", lambda root=ROOT: checked_out[0])
    drive = command._drive

    def commit_while_the_runs_go_on(*args, **kwargs):
        checked_out[0] = "2222222"
        return drive(*args, **kwargs)

    monkeypatch.setattr(command, "_drive", commit_while_the_runs_go_on)
    out = tmp_path / "sweep"
    assert sweep.main(["--stages", "01", "--out", str(out), *TINY]) == 0, capsys.readouterr().out
    assert checked_out == ["2222222"]
    assert json.loads((out / "sweep.json").read_text())["invocations"][-1]["commit"] == "1111111"
    assert "- commit: 1111111;" in (out / "README.md").read_text()


def test_ctrl_c_ends_every_run_and_keeps_its_checkpoint(tmp_path):
    out = tmp_path / "sweep"
    s = Sweep("--stages", "01", "--out", out, "--max-frames", "100000", "--save-every", "50", "--per-run-cpus", "1",
              "--", "--replay-initial", "100", "--replay-size", "1000")  # fmt: skip
    pid = int(s.wait_for(r"run 01-pong-seed0: started \(attempt 1\) on .*, pid (\d+)").group(1))
    ckpt = out / "runs" / "01-pong-seed0" / "checkpoint.pt"
    deadline = time.monotonic() + 60
    while not ckpt.exists():  # brought back while the run goes on
        assert time.monotonic() < deadline, s.output
        time.sleep(0.2)
    os.kill(s.proc.pid, signal.SIGINT)  # the sweep alone: its runs are in their own process groups
    assert s.finish(60) == 130, s.output
    assert procs.exited(pid), "the stage outlived the sweep"
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)  # nor anything else of its group
    summary = json.loads((out / "runs" / "01-pong-seed0" / "summary.json").read_text())
    assert summary["interrupted"] == "SIGTERM" and 0 < summary["frames"] < 100000
    assert ckpt.exists()
    assert "| 01-pong-seed0 | interrupted |" in (out / "README.md").read_text()
    assert not (out / ".work").exists()


def test_a_run_killed_twice_is_retried_once_then_reported_failed(tmp_path):
    out = tmp_path / "sweep"
    s = Sweep("--stages", "01", "--out", out, "--max-frames", "100000", "--save-every", "50", "--per-run-cpus", "1",
              "--", "--replay-initial", "100", "--replay-size", "1000")  # fmt: skip
    ckpt = out / "runs" / "01-pong-seed0" / "checkpoint.pt"
    pid = int(s.wait_for(r"run 01-pong-seed0: started \(attempt 1\) on .*, pid (\d+)").group(1))
    deadline = time.monotonic() + 60
    while not ckpt.exists():
        assert time.monotonic() < deadline, s.output
        time.sleep(0.2)
    os.killpg(pid, signal.SIGKILL)  # as the kernel's OOM killer would
    s.wait_for(r"run 01-pong-seed0: killed by SIGKILL; retrying from its last checkpoint")
    pid = int(s.wait_for(r"run 01-pong-seed0: started \(attempt 2\) on .*, pid (\d+)").group(1))
    os.killpg(pid, signal.SIGKILL)
    s.wait_for(r"run 01-pong-seed0: FAILED \(killed by SIGKILL\); log: .*run.log")
    assert s.finish(60) == 1, s.output
    readme = (out / "README.md").read_text()
    assert "| 01-pong-seed0 | failed |" in readme and "- 01-pong-seed0: killed by SIGKILL" in readme
    log = (out / "runs" / "01-pong-seed0" / "run.log").read_text()
    assert "== attempt 1, from the start" in log and "== attempt 2, from its checkpoint" in log
    assert re.search(r"01_dqn_basic.py .*--resume \S+/checkpoint.pt\n", log)


# -- a Ray cluster on this machine -------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster():
    if not HAVE_RAY:
        pytest.skip("ray is not installed")
    saved = {k: os.environ.get(k) for k in RAY_ENV}
    os.environ.update(RAY_ENV)  # the nodes' processes inherit it
    from ray._private import ray_constants
    from ray.cluster_utils import Cluster

    loopback = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False  # what the variable sets, had ray been imported before it was
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    try:
        assert c.address.startswith("127.0.0.1:"), c.address
        c.add_node(num_cpus=1)
        yield c
    finally:
        c.shutdown()
        ray_constants.ENABLE_RAY_CLUSTER = loopback
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@needs_ray
@pytest.mark.xdist_group("ray-cluster")  # one worker runs both: they share the module's cluster
def test_ray_two_nodes_every_result_arrives(cluster, tmp_path):
    out = tmp_path / "sweep"
    s, code = run_sweep("--stages", "01,02", "--out", out, "--address", cluster.address, *TINY, env=RAY_ENV)
    assert code == 0, s.output
    state = assert_runs_arrived(out, GRID)
    # One CPU per node and per run: both nodes ran one run each.
    assert len({r["node"] for r in state["runs"].values()}) == 2
    assert "Ray cluster at 127.0.0.1:" in (out / "README.md").read_text()


@needs_ray
@pytest.mark.xdist_group("ray-cluster")
def test_ray_node_lost_mid_sweep_its_run_resumes_elsewhere(cluster, tmp_path):
    extra = cluster.add_node(num_cpus=1)
    nodes = {n.node_id: n for n in cluster.worker_nodes}
    out = tmp_path / "sweep"
    # A long random fill with checkpoints every 50 frames, then a short training.
    s = Sweep("--stages", "01", "--seeds", "0-1", "--out", out, "--address", cluster.address, "--max-frames", "720",
              "--save-every", "50", "--per-run-cpus", "1", "--progress", "2", "--", "--replay-initial", "700",
              "--replay-size", "1000", env=RAY_ENV)  # fmt: skip
    started = [s.wait_for(r"run (\S+): started \(attempt 1\) on \S+ node (\w+), pid (\d+)") for _ in range(2)]
    # The head has one CPU: at least one run is on a worker node.
    key, node, pid = next(m.groups() for m in started if m.group(2) in nodes)
    # Freeze the run at its first checkpoint, in the folder it writes on its node, so that it
    # cannot finish before its node goes (a fast machine plays the 720 frames in two seconds);
    # the SIGTERM its worker's death sends waits until it is let go again.
    work = os.path.join(tempfile.gettempdir(), "dqn-sweep", f"{key}-p*", "**", "checkpoint.pt")
    deadline = time.monotonic() + 60
    while not glob.glob(work, recursive=True):
        assert time.monotonic() < deadline, s.output
        time.sleep(0.02)
    os.killpg(int(pid), signal.SIGSTOP)
    try:
        # The node goes once the checkpoint has come back through Ray, for the retry to start from.
        ckpt = out / "runs" / key / "checkpoint.pt"
        while not ckpt.exists():
            assert time.monotonic() < deadline, s.output
            time.sleep(0.1)
        cluster.remove_node(nodes[node])
        # Ray declares the node dead after its health checks fail; on a loaded 2-core machine
        # that has taken over a minute.
        s.wait_for(rf"run {key}: NodeDiedError.*retrying from its last checkpoint", timeout=180)
    finally:
        os.killpg(int(pid), signal.SIGCONT)
    s.wait_for(rf"run {key}: started \(attempt 2\)")
    assert s.finish(120) == 0, s.output
    assert_runs_arrived(out, ["01-pong-seed0", "01-pong-seed1"], frames=720)
    summary = json.loads((out / "runs" / key / "summary.json").read_text())
    assert summary["start_frame"] > 0, "the retry did not start from the checkpoint"
    assert "attempt 2, from its checkpoint" in (out / "runs" / key / "run.log").read_text()
    deadline = time.monotonic() + 10
    while not procs.exited(int(pid)):  # the lost node's stage got SIGTERM when its worker died
        assert time.monotonic() < deadline, "the lost node's stage outlived it"
        time.sleep(0.1)
    if extra is not nodes[node]:
        cluster.remove_node(extra)
    # The lost worker could not remove its run's folder; the next run on that machine does (the
    # retry, unless the worker was still dying then).
    parent = os.path.join(tempfile.gettempdir(), "dqn-sweep")
    sweep.clear_stale(parent)
    # No run's staging folder is left on a node; the last run's end removes the emptied parent too.
    assert not os.path.isdir(parent) or not [d for d in os.listdir(parent) if d.startswith("01-pong-seed")]


def test_a_rerun_keeps_attempts_and_leaves_a_run_past_a_smaller_budget(tmp_path, capsys):
    """A rerun whose --max-frames is below an unfinished run's checkpoint does not start that
    run: it says the run is past the budget (exit 0). A run finished before keeps the attempts
    and host that the invocation which ran it recorded."""
    import torch

    out = tmp_path / "sweep"
    past, done = out / "runs" / "01-pong-seed0", out / "runs" / "02-pong-seed0"
    past.mkdir(parents=True)
    done.mkdir()
    torch.save({"kind": "dqn-speedup-checkpoint", "frame_idx": 500}, past / "checkpoint.pt")
    (past / "summary.json").write_text(json.dumps({"stage": "01", "frames": 500, "interrupted": "SIGINT"}))
    (done / "summary.json").write_text(json.dumps({"stage": "02", "frames": 130, "interrupted": None, "error": None}))
    earlier = {"01-pong-seed0": {"status": "interrupted", "attempts": 1, "host": "there"},
               "02-pong-seed0": {"status": "done", "attempts": 2, "host": "there", "node": None}}  # fmt: skip
    (out / "sweep.json").write_text(json.dumps({"runs": earlier, "invocations": []}))
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        code = sweep.main(["--stages", "01,02", "--out", str(out), "--max-frames", "130", "--per-run-cpus", "1"])
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "run 01-pong-seed0: not run: its checkpoint is at frame 500, past --max-frames 130" in printed
    assert "1 finished before, 1 past --max-frames, 0 to run" in printed and "started" not in printed
    readme = (out / "README.md").read_text()
    assert re.search(r"\| 01-pong-seed0 \| past --max-frames \| 500 \|.*\| 1 \| there \|", readme), readme
    assert re.search(r"\| 02-pong-seed0 \| done before \| 130 \|.*\| 2 \| there \|", readme), readme
    assert "- 01-pong-seed0: its checkpoint is at frame 500, past --max-frames 130" in readme
    runs = json.loads((out / "sweep.json").read_text())["runs"]
    assert runs["01-pong-seed0"]["attempts"] == 1 and runs["02-pong-seed0"]["attempts"] == 2


def test_a_sweep_of_other_seeds_keeps_the_folders_earlier_runs_in_its_report(tmp_path, capsys):
    """A sitting that runs other stages or seeds in a sweep's folder reports the runs earlier
    invocations left there (recorded in sweep.json, or only a folder under runs/) as they were
    left, and never starts them; --report then shows them too."""
    out = tmp_path / "sweep"
    mine, recorded, unrecorded = (out / "runs" / k for k in ("01-pong-seed1", "02-pong-seed0", "01-pong-seed5"))
    for folder in (mine, recorded, unrecorded):
        folder.mkdir(parents=True)
    ended = {"frames": 130, "interrupted": None, "error": None}
    (mine / "summary.json").write_text(json.dumps({"stage": "01", **ended}))
    (recorded / "summary.json").write_text(json.dumps({"stage": "02", **ended, "solved": True}))
    (unrecorded / "summary.json").write_text(json.dumps({"stage": "01", "frames": 900, "interrupted": "SIGTERM"}))
    (out / "runs" / "not-a-run").mkdir()
    earlier = {"02-pong-seed0": {"status": "done", "attempts": 2, "frames": 130, "host": "there"},
               "01-pong-seed7": {"status": "interrupted", "attempts": 0}}  # never started: no folder  # fmt: skip
    (out / "sweep.json").write_text(json.dumps({"runs": earlier, "invocations": []}))
    code, printed = _in_process(
        ["--stages", "01", "--seeds", "1", "--out", out, "--max-frames", "130", "--per-run-cpus", "1"], capsys
    )
    assert code == 0, printed
    assert "1 runs (1 stages x 1 seeds x 1 games), 1 finished before, 0 to run" in printed
    assert "started" not in printed
    runs = json.loads((out / "sweep.json").read_text())["runs"]
    assert {k: v["status"] for k, v in runs.items()} == {
        "01-pong-seed1": "skipped", "01-pong-seed5": "interrupted", "01-pong-seed7": "queued", "02-pong-seed0": "done"
    }  # fmt: skip
    assert runs["02-pong-seed0"]["attempts"] == 2 and runs["01-pong-seed5"]["frames"] == 900
    for readme in ((out / "README.md").read_text(), None):
        if readme is None:
            assert sweep.main(["--report", "--out", str(out)]) == 0, capsys.readouterr().err
            readme = (out / "README.md").read_text()
        assert "- 1/1 done, 0 running, 0 failed, 0 queued" in readme
        assert (
            "outside this grid: 3 runs of earlier sweeps, as they were left (01-pong-seed5, 01-pong-seed7, 02-pong-seed0)"
        ) in readme
        rows = [line.split(" | ")[:3] for line in readme.splitlines() if line.startswith("| 0")]
        assert rows == [["| 01-pong-seed1", "done before", "130"], ["| 01-pong-seed5", "interrupted", "900"],
                        ["| 01-pong-seed7", "queued", "—"], ["| 02-pong-seed0", "done", "130"]]  # fmt: skip
        assert re.search(r"\| 02-pong-seed0 \| done \| 130 \|.*\| yes \|.*\| 2 \| there \|", readme), readme


# -- replay rings across sittings ------------------------------------------------------------------

RING = ["--per-run-cpus", "1", "--progress", "2", "--save-every", "50", "--", "--replay-initial", "100",
        "--replay-size", "1000"]  # fmt: skip


def _in_process(argv, capsys) -> tuple[int, str]:
    """``sweep.main(argv)`` in this process, its signal handlers put back; (exit code, its output)."""
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        code = sweep.main([str(a) for a in argv])
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    return code, capsys.readouterr().out


def _rings(folder):
    return sorted(p.name for p in folder.glob("replay-*.pt"))


def test_a_sweep_interrupted_mid_run_resumes_with_its_replay_ring(tmp_path):
    """Ctrl-C mid-run, then the same sweep again: the run goes on with the buffer it had, so that
    training goes on at once; the report counts one resume and no frame played untrained."""
    from lib.sweep.grid import checkpoint_frame

    out = tmp_path / "sweep"
    folder = out / "runs" / "01-pong-seed0"
    s = Sweep("--stages", "01", "--out", out, "--max-frames", "100000", *RING)
    s.wait_for(r"run 01-pong-seed0: started \(attempt 1\)")
    deadline = time.monotonic() + 120
    while (checkpoint_frame(str(folder)) or 0) < 150:  # past the first fill of 100 transitions
        assert time.monotonic() < deadline, s.output
        time.sleep(0.2)
    os.kill(s.proc.pid, signal.SIGINT)
    assert s.finish(60) == 130, s.output
    stopped = json.loads((folder / "summary.json").read_text())["frames"]
    assert _rings(folder) == [f"replay-{stopped}.pt"]  # the ring of the checkpoint taken at the stop

    again, code = run_sweep("--stages", "01", "--out", out, "--max-frames", stopped + 40, *RING)
    assert code == 0, again.output
    log = (folder / "run.log").read_text()
    held = re.search(rf"resuming 01 pong at frame {stopped}: with its replay buffer of (\d+) transitions", log)
    assert held and int(held.group(1)) >= stopped, log  # a slot for every frame played (and the first screen)
    summary = json.loads((folder / "summary.json").read_text())
    # Trained from the first frame after the resume (the speed meter starts with training).
    assert summary["start_frame"] == stopped and summary["train_frames"] >= summary["frames"] - stopped - 1
    readme = (out / "README.md").read_text()
    assert re.search(r"\| 01-pong-seed0 \| done \|.*\| 1 \(1 with ring\) \| 0 \| 2 \|", readme), readme
    state = json.loads((out / "sweep.json").read_text())["runs"]["01-pong-seed0"]
    assert (state["resumes"], state["resumes_with_ring"], state["untrained_frames"]) == (1, 1, 0)
    assert _rings(folder) == [f"replay-{summary['frames']}.pt"]  # the older ring went with its checkpoint
    (folder / "run.log").unlink()  # the run's own events say it too (resume_ring 1 at its frame)
    assert resumes(str(folder)) == [(stopped, True)]


def test_without_room_for_its_ring_a_run_says_so_once_and_resumes_refilling(tmp_path, monkeypatch, capsys):
    """The disk of the sweep's folder has no room for another ring: one line, and the run goes
    on from its checkpoint without the ring, refilling its 100 transitions before training; the
    report counts them and says why."""
    from lib.sweep import rings

    out = tmp_path / "sweep"
    folder = out / "runs" / "01-pong-seed0"
    code, printed = _in_process(["--stages", "01", "--out", out, "--max-frames", 200, *RING], capsys)
    assert code == 0, printed
    assert _rings(folder) == ["replay-200.pt"] and "replay ring" not in printed

    monkeypatch.setattr(rings, "free_bytes", lambda folder: 50 * 2**20)
    code, printed = _in_process(["--stages", "01", "--out", out, "--max-frames", 350, *RING], capsys)
    assert code == 0, printed
    said = [line for line in printed.splitlines() if "replay ring" in line]
    assert len(said) == 1 and said[0].startswith("run 01-pong-seed0: no room for its replay ring: "), printed
    assert said[0].endswith("needed, 50 MiB free; it goes without (its buffer refilled)")
    log = (folder / "run.log").read_text()
    assert "resuming 01 pong at frame 200: the replay buffer is refilled with 100 transitions" in log
    assert log.split("== attempt")[-1].count("--save-replay") == 0
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["frames"] == 350 and summary["train_frames"] <= 350 - 200 - 100  # 100 frames untrained
    readme = (out / "README.md").read_text()
    assert re.search(r"\| 01-pong-seed0 \| done \|.*\| 1 \| 100 \| 2 \|", readme), readme
    assert "Went without their replay ring" in readme and "- 01-pong-seed0: no room for its replay ring" in readme
    state = json.loads((out / "sweep.json").read_text())["runs"]["01-pong-seed0"]
    assert (state["resumes"], state["resumes_with_ring"], state["untrained_frames"]) == (1, 0, 100)
    assert _rings(folder) == []  # its checkpoint names none now: the old ring is gone
    (folder / "run.log").unlink()  # the run's own events say it too (resume_ring 0 at its frame)
    assert resumes(str(folder)) == [(200, False)]


def test_replay_files_of_a_committed_sweep_are_ignored_by_git():
    """A committed sweep keeps its runs' logs and event files; never a ring (0.7 GB) or a
    checkpoint, nor one of their temporary files."""
    if subprocess.run(["git", "rev-parse"], cwd=ROOT, capture_output=True).returncode != 0:
        pytest.skip("not a git work tree")
    for name in ("replay-1000.pt", "replay-1000.pt.tmp", "checkpoint.pt", "checkpoint.pt.tmp"):
        for sweep_dir in ("results/cpu-x-sweep", "results/cpu-x-sweep-08"):
            path = f"{sweep_dir}/runs/08-pong-seed0/{name}"
            assert subprocess.run(["git", "check-ignore", "-q", path], cwd=ROOT).returncode == 0, path
    assert subprocess.run(["git", "check-ignore", "-q", "results/cpu-x-sweep/runs/08-pong-seed0/run.log"],
                          cwd=ROOT).returncode == 1  # fmt: skip


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_sigterm_and_sighup_end_a_sweep_with_its_report(sig, code, tmp_path):
    """As Ctrl-C does (exit 130, above): the runs are stopped and the report written, with
    the signal's exit code and nothing else printed (SIGHUP used to kill the sweep outright)."""
    out = tmp_path / "sweep"
    s = Sweep("--stages", "01", "--out", out, "--max-frames", "100000", "--per-run-cpus", "1", "--",
              "--replay-initial", "100", "--replay-size", "1000")  # fmt: skip
    pid = int(s.wait_for(r"run 01-pong-seed0: started \(attempt 1\) on .*, pid (\d+)").group(1))
    os.kill(s.proc.pid, sig)
    assert s.finish(60) == code, s.output
    assert "Traceback" not in s.output and "rror" not in s.output, s.output
    assert f"sweep: wrote {out / 'README.md'}" in s.output
    assert procs.exited(pid)
    assert "| 01-pong-seed0 | interrupted |" in (out / "README.md").read_text()


class _Pool:
    """A pool that starts nothing: the driver's bookkeeping alone, under exact control."""

    def start(self, token, spec, resume, keep=None):
        self.started = spec


def test_a_write_error_is_not_retried_and_attempts_count_across_invocations(tmp_path, capsys):
    """A run that exits 74 (a file it could not write: disk full) fails at once, where a run
    that dies is retried; and the attempt a later invocation makes is numbered after the
    earlier ones' in the run's log (a resumed run.log used to say "attempt 1" twice)."""
    from lib.sweep.driver import Sweep as Driver
    from lib.sweep.grid import Job, RunSpec

    job = Job(RunSpec("01", "pong", 0, 100, 50, 1.0, (), 1.0, 0.0))
    job.earlier = 1
    driver = Driver([job], str(tmp_path), _Pool(), 60.0)
    driver._launch(job)
    log = tmp_path / "runs" / "01-pong-seed0" / "run.log"
    assert log.read_text().startswith("== attempt 2, from the start")
    log.write_text(log.read_text() + "01_dqn_basic.py: error: cannot write checkpoint.pt: No space left on device\n")
    driver._ended(job, 74, None)
    assert job.status == "failed" and not driver.queue
    assert job.reason == "a file of the run could not be written (01_dqn_basic.py: error: cannot write " \
                         "checkpoint.pt: No space left on device)"  # fmt: skip


@needs_ray
@pytest.mark.xdist_group("ray-cluster")
def test_ray_sigterm_ends_the_sweep_with_its_report_and_leaves_no_staging_folder(cluster, tmp_path):
    """SIGTERM used to land inside ray.wait, which Ray wrapped as a SystemError: exit 1, a long
    traceback, the runs never stopped. Now: exit 143, the report, nothing else printed; the
    nodes' staging folder in the temp folder goes with the last run (it used to stay, empty)."""
    out = tmp_path / "sweep"
    staging = pathlib.Path(tempfile.gettempdir()) / "dqn-sweep"
    s = Sweep("--stages", "01", "--out", out, "--address", cluster.address, "--max-frames", "100000",
              "--per-run-cpus", "1", "--", "--replay-initial", "100", "--replay-size", "1000", env=RAY_ENV)  # fmt: skip
    s.wait_for(r"run 01-pong-seed0: started \(attempt 1\) on ")
    os.kill(s.proc.pid, signal.SIGTERM)
    assert s.finish(90) == 143, s.output
    assert "Traceback" not in s.output and "rror" not in s.output, s.output
    assert f"sweep: wrote {out / 'README.md'}" in s.output
    assert "| 01-pong-seed0 | interrupted |" in (out / "README.md").read_text()
    deadline = time.monotonic() + 30
    while staging.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not staging.exists()


def test_a_run_whose_reward_has_not_risen_for_300k_frames_is_named_stalled():
    from lib.sweep.report import stall_line

    frames = list(range(0, 700_001, 10_000))
    # Learns to -15 by 300k, then stays within 0.8 of it: its best of the last 300k (from 400k on)
    # is -14.2, its best before them -15.0: a rise of 0.8, under 1.
    flat = [max(-21.0, -21.0 + f / 50_000) if f <= 300_000 else -15.0 + 0.8 * (f >= 600_000) for f in frames]
    rising = [-21.0 + f / 50_000 for f in frames]  # one point a 50k frames
    line = stall_line([("01-pong-seed0", frames, flat), ("05-pong-seed0", frames, rising)])
    assert line.endswith(": 01-pong-seed0 (best -15.0 by frame 400000, -14.2 since).")
    assert "05-pong-seed0" not in line
    assert stall_line([("05-pong-seed0", frames, rising)]).endswith(": none (1 unsolved runs long enough to tell).")
    assert stall_line([("01-pong-seed0", frames[:30], flat[:30])]) == ""  # 290k frames: too short to tell
    assert stall_line([]) == ""

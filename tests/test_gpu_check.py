"""The GPU check script's own plumbing, run on the CPU (DEVICE=cpu, its dry-run mode): the parts
it is asked for run in order under their budgets, each leaves its log, and summary.txt names
each step with its outcome. What it measures on a GPU is not tested here; that it starts, ends,
and brings back a figure when the first solve fails, is."""

import os
import subprocess
import sys

from lib.precision import resolve_precision
from tests.conftest import ROOT


def _check(out, timeout=300, **env):
    env = dict(
        os.environ,
        PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""),
        DEVICE="cpu",
        **env,
    )
    proc = subprocess.run(
        ["bash", str(ROOT / "results" / "gpu_check.sh"), str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    summary = (out / "summary.txt").read_text() if (out / "summary.txt").exists() else ""
    steps = {line.split()[0]: line for line in summary.splitlines()}
    return proc, steps


def test_gpu_check_dry_run_on_cpu(tmp_path):
    out = tmp_path / "check"
    proc, steps = _check(
        out,
        PARTS="deps,hardware,tests,solve,timing,compiled",
        TOTAL_SECONDS="240",
        SOLVE_SECONDS="20",
        TIMING_ARGS="--batch 8 --iters 2 --replay-size 240 --envs 2",
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    # One line per step asked for, in the order run; the bench was not asked for.
    assert list(steps) == ["deps", "hardware", "tests", "solve", "timing", "compiled"], steps
    assert "passed" in steps["deps"] and "ok torch" in steps["deps"]
    assert all(f"ok {name} " in (out / "deps.log").read_text() for name in ("gymnasium", "ale-py", "matplotlib"))
    assert "skipped" in (out / "tests_cuda.log").read_text()  # no CUDA here: every CUDA test skips
    # 20 s of stage 08 stop it with SIGINT: its RESULT line still comes back, marked, and the curve step runs.
    assert "time up" in steps["solve"] and "RESULT stage=08" in steps["solve"], steps["solve"]
    assert (out / "solve08_curve.log").exists() and not (out / "solve08_failed.log").exists()
    learner = resolve_precision("auto", "cpu")  # the stage's default here
    assert (
        (out / "trainstep.log")
        .read_text()
        .startswith(f"TRAINSTEP capture=none precision={learner} device=cpu batch=8 ")
    )
    assert "TRAINSTEP capture=none" in steps["timing"]
    assert "compiled" in steps  # ran or was skipped for lack of time: either way it says so
    assert not (out / "bench.log").exists()


def test_gpu_check_a_failed_solve_is_kept_and_run_again_without_capture(tmp_path):
    # --envs 0 is refused at once (exit 2): the first run's log is kept as solve08_failed.log,
    # the run starts again with --capture none (refused too here), and summary.txt says both.
    out = tmp_path / "check"
    proc, steps = _check(out, PARTS="solve", SOLVE_SECONDS="60", SOLVE_ENVS="0")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "--envs" in (out / "solve08_failed.log").read_text()
    assert "again with --capture none" in steps["solve"] and "failed (2)" in steps["solve"], steps
    assert "--capture none" in (out / "check.log").read_text()

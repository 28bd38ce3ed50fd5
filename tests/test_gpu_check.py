"""The GPU check script's own plumbing, run on the CPU (DEVICE=cpu, its dry-run mode): the parts
it is asked for run in order under their budgets, each leaves its log, and the summary names
them. What it measures on a GPU is not tested here; that it starts and ends is."""

import os
import subprocess
import sys

from tests.conftest import ROOT


def test_gpu_check_dry_run_on_cpu(tmp_path):
    out = tmp_path / "check"
    env = dict(
        os.environ,
        PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""),
        DEVICE="cpu",
        PARTS="tests,timing",
        TOTAL_SECONDS="240",
        TIMING_ARGS="--batch 8 --iters 2 --replay-size 240 --envs 2",
    )
    proc = subprocess.run(
        ["bash", str(ROOT / "results" / "gpu_check.sh"), str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    log = (out / "check.log").read_text()
    for step in ("hardware", "CUDA tests", "train step forms: --batch 8", "done"):
        assert step in log, log
    assert "skipped" in (out / "tests_cuda.log").read_text()  # no CUDA here: every CUDA test skips
    trainstep = (out / "trainstep.log").read_text()
    assert trainstep.startswith("TRAINSTEP capture=none device=cpu batch=8 "), trainstep
    assert "TRAINSTEP capture=none" in proc.stdout  # the closing summary
    assert not (out / "bench.log").exists() and not (out / "solve08.log").exists()  # parts not asked for

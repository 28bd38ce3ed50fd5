"""Helpers for the tests that run the numbered scripts: in-process (``run_inprocess``, the
default: a whole run in seconds) and as real subprocesses in their own process group
(``StageProcess``, for what only a process can show: signals, process groups, exit codes)."""

import contextlib
import io
import json
import os
import pathlib
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

import pytest

from lib.run import cli
from lib.run.scripts import load_script
from lib.run.stages import STAGES

ROOT = pathlib.Path(cli.ROOT)


def _share_cores_between_workers() -> None:
    """Under pytest-xdist (``-n W``) each worker, and every stage and play process it starts,
    gets cores/W threads: W workers each spinning up every core's OpenMP threads oversubscribe
    the machine, and OpenMP threads that wait on a descheduled peer stall whole runs."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 0)
    if workers > 1 and "OMP_NUM_THREADS" not in os.environ:
        import torch

        threads = max(1, len(os.sched_getaffinity(0)) // workers)
        os.environ["OMP_NUM_THREADS"] = str(threads)
        torch.set_num_threads(threads)


_share_cores_between_workers()


def stage_cmd(stage, *args):
    return [sys.executable, str(ROOT / STAGES[stage].script), "--device", "cpu", *map(str, args)]


@dataclass
class InProcess:
    code: int
    stdout: str
    stderr: str
    outcome: object  # runner.Outcome: .summary, .run (its saveables, tracker, buffer ...)

    @property
    def run(self):
        return self.outcome.run


def run_inprocess(stage, *args):
    """Run a stage's ``main`` in this process on CPU; its printed lines are collected."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        outcome = load_script(stage).main(["--device", "cpu", *map(str, args)])
    return InProcess(outcome.code, out.getvalue(), err.getvalue(), outcome)


class StageProcess:
    """A stage run in its own process group (like a shell job), with its output collected."""

    def __init__(self, stage, *args, sigint_ignored=False):
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        # A background job of a non-interactive shell starts with SIGINT ignored.
        preexec = (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if sigint_ignored else None
        self.proc = subprocess.Popen(
            stage_cmd(stage, *args),
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
            env=env,
            preexec_fn=preexec,
        )
        self.pgid = self.proc.pid
        self.lines = []

    def wait_for(self, prefix, timeout=60):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            self.lines.append(line)
            if line.startswith(prefix):
                return line
        raise AssertionError(f"no line starting {prefix!r} in {self.lines}")

    def signal_group(self, sig):
        os.killpg(self.pgid, sig)

    def finish(self, timeout=60):
        out, err = self.proc.communicate(timeout=timeout)
        self.lines.extend(out.splitlines(keepends=True))
        self.stderr = err
        return self.proc.returncode

    @property
    def stdout(self):
        return "".join(self.lines)


def run_stage(stage, *args, timeout=240):
    proc = StageProcess(stage, *args)
    code = proc.finish(timeout)
    return proc, code


def group_alive(pgid):
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def assert_group_gone(pgid, within=5.0):
    """No process of the run (trainer, play process, helpers) survives it."""
    deadline = time.monotonic() + within
    while group_alive(pgid):
        if time.monotonic() > deadline:
            os.killpg(pgid, signal.SIGKILL)
            raise AssertionError("a process of the run outlived it")
        time.sleep(0.05)


def result_fields(stdout):
    lines = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
    assert len(lines) == 1, stdout
    return dict(kv.split("=", 1) for kv in lines[0].split()[1:])


def run_folder(run_dir):
    folders = [p for p in pathlib.Path(run_dir).iterdir() if p.is_dir()]
    assert len(folders) == 1, folders
    return folders[0]


def summary(run_dir):
    return json.loads((run_folder(run_dir) / "summary.json").read_text())


@pytest.fixture
def runs(tmp_path):
    return tmp_path / "runs"

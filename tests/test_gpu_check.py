"""The GPU check script's own plumbing, run on the CPU (DEVICE=cpu, its dry-run mode): the parts
it is asked for run in order under their budgets, summary.txt names the commit and each step
with its outcome, and OUTDIR stays small enough to copy off a remote machine in one piece (at most 8 files,
16 MiB each, 64 MiB together, none deeper than OUT/a/b/file, plain names): the summary, the
solve's RESULT lines and one archive of everything else. What it measures on a GPU is not
tested here; that it starts, ends, and brings back a figure when the first solve fails or
hangs, is."""

import os
import re
import shutil
import subprocess
import sys
import tarfile

import pytest

from lib.precision import resolve_precision
from tests.conftest import ROOT

SCRIPT = ROOT / "results" / "gpu_check.sh"
# A solve that hangs in its first run, as one stuck in capture would: no output until SIGINT.
# The run with --capture none is the real stage 08.
HANGS_UNLESS_CAPTURE_NONE = """#!/usr/bin/env bash
case " $* " in *" --capture none "*) exec python3 "$@" ;; esac
exec python3 -c 'import signal, time; signal.signal(signal.SIGINT, signal.default_int_handler); time.sleep(300)'
"""


def _check(out, timeout=420, script=SCRIPT, cwd=ROOT, **env):
    env = dict(
        os.environ,
        PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""),
        DEVICE="cpu",
        **env,
    )
    proc = subprocess.run(
        ["bash", str(script), str(out)], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    summary = (out / "summary.txt").read_text() if (out / "summary.txt").exists() else ""
    steps = {line.split()[0]: line for line in summary.splitlines()}
    return proc, steps


def _expected_commit(root) -> str:
    """The commit line gpu_check.sh writes for the tree at ``root``, by its own rule."""
    git = subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=7"], cwd=root, capture_output=True)
    if git.returncode == 0 and git.stdout.strip():
        return f"{git.stdout.decode().strip()} (git)"
    stamp = root / ".whl" / "COMMIT"
    if stamp.is_file() and stamp.stat().st_size:
        return f"{stamp.read_text().splitlines()[0]} (.whl/COMMIT)"
    return "unknown (no .git, no .whl/COMMIT)"


def test_the_dry_run_from_a_source_archive_says_commit_unknown(tmp_path):
    """A tree without .git (``git archive HEAD``, GitHub's "Download ZIP"): the dry run writes
    "commit unknown" and runs, and the dry-run test above expects that line there (it expected
    git's commit, and failed in such a tree). One cheap step, not the suite again."""
    tree = tmp_path / "src"
    tree.mkdir()
    archive = subprocess.run(["git", "archive", "HEAD"], cwd=ROOT, capture_output=True)
    if archive.returncode != 0:
        pytest.skip("not a git checkout: this tree is itself an archive")
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    assert not (tree / ".git").exists()
    out = tmp_path / "check"
    proc, steps = _check(out, timeout=120, script=tree / "results" / "gpu_check.sh", cwd=tree, PARTS="deps",
                         TOTAL_SECONDS="100")  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert _expected_commit(tree) == "unknown (no .git, no .whl/COMMIT)"
    assert steps["commit"].startswith("commit unknown (no .git, no .whl/COMMIT)"), steps
    assert steps["deps"].split()[1] == "passed", steps


def assert_what_comes_back(out):
    """OUT as small as it must stay: at most 8 plain files, at most two folders deep,
    names of letters, digits, '.', '_' and '-', 16 MiB each and 64 MiB in all."""
    files = []
    for folder, dirs, names in os.walk(out):
        for name in dirs + names:
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, out)
            assert re.fullmatch(r"[A-Za-z0-9._-]+", name), rel
            assert not os.path.islink(path), rel
            if name in names:
                assert os.path.isfile(path) and rel.count(os.sep) <= 2, rel
                files.append(os.path.getsize(path))
    assert len(files) <= 8 and max(files) <= 16 * 2**20 and sum(files) <= 64 * 2**20, files


def _members(out):
    with tarfile.open(out / "bundle.tar.gz") as tar:
        return tar.getnames()


def _read(out, name):
    with tarfile.open(out / "bundle.tar.gz") as tar:
        return tar.extractfile(name).read().decode()


def test_gpu_check_dry_run_on_cpu(tmp_path):
    out = tmp_path / "check"
    proc, steps = _check(
        out,
        PARTS="deps,hardware,tests,solve,timing,bench",
        TOTAL_SECONDS="400",
        SOLVE_SECONDS="35",
        TIMING_ARGS="--batch 8 --iters 2 --replay-size 240 --envs 2",
        BENCH_ARGS="--stages 08 --repeat 1 --no-sweep --frames 16 --replay-initial 100 --bound-seconds 0.2",
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert_what_comes_back(out)
    assert sorted(os.listdir(out)) == ["bundle.tar.gz", "solve08_result.txt", "summary.txt"]
    # The commit first (git's where this tree has .git, else .whl/COMMIT's, else unknown: a source
    # archive), then one line per step asked for, in the order run; the curve goes with the solve,
    # and the compiled step was not asked for.
    assert steps.pop("commit").startswith(f"commit {_expected_commit(ROOT)}")
    assert list(steps) == ["deps", "hardware", "tests", "solve", "curve", "timing", "bench"], steps
    # The curve has nothing to draw where a busy machine's solve finished no game in its seconds.
    no_game = "mean_reward=nan" in steps["solve"]
    assert steps["curve"].split()[1] == ("skipped" if no_game else "passed"), steps
    assert all(line.split()[1] == "passed" for step, line in steps.items() if step not in ("solve", "curve")), steps
    assert "ok torch" in steps["deps"]
    # 35 s of stage 08 stop it with SIGINT 20 s before its budget: its RESULT line still comes back, marked.
    assert "time up" in steps["solve"] and "RESULT stage=08" in steps["solve"], steps["solve"]
    assert "08:" in steps["bench"] and steps["bench"].split()[3:5] == ["1", "stage"], steps["bench"]
    result = (out / "solve08_result.txt").read_text().splitlines()
    assert result[0] == "# solve08/solve08.log", result
    assert result[1].startswith("TIME stage=08 bound=") and result[2].startswith("RESULT stage=08 "), result

    names = _members(out)
    assert not [n for n in names if n.endswith(".pt")]
    runs = [n for n in names if n.startswith("gpu_check/solve08/runs/08-pong-seed1-")]
    assert any(n.endswith("/summary.json") for n in runs) and any("/events.out.tfevents." in n for n in runs), runs
    for name in ("check.log", "deps.log", "machine.txt", "tests_cuda.log", "solve08/solve08.log",
                 "solve08_curve.log", "trainstep.log", "bench.log", "summary.txt"):  # fmt: skip
        assert f"gpu_check/{name}" in names, name
    assert ("gpu_check/solve08.png" in names) == (not no_game), names  # a chart only where a game finished
    assert any(n.startswith("gpu_check/bench/") and n.endswith("/fps.csv") for n in names), names
    deps = _read(out, "gpu_check/deps.log")
    assert all(f"ok {name} " in deps for name in ("gymnasium", "ale-py", "matplotlib")), deps
    assert "skipped" in _read(out, "gpu_check/tests_cuda.log")  # no CUDA here: every CUDA test skips
    learner = resolve_precision("auto", "cpu")  # the stage's default here
    trainstep = _read(out, "gpu_check/trainstep.log")
    assert trainstep.startswith(f"TRAINSTEP capture=none precision={learner} device=cpu batch=8 "), trainstep
    assert "TRAINSTEP capture=none" in steps["timing"]


def test_gpu_check_a_hung_solve_is_stopped_and_run_again_without_capture(tmp_path):
    # The first run prints nothing for SOLVE_STALL_SECONDS: it is stopped, its folder kept, and
    # stage 08 runs again with --capture none, in its own folder, for the time left.
    fake = tmp_path / "python"
    fake.write_text(HANGS_UNLESS_CAPTURE_NONE)
    fake.chmod(0o755)
    out = tmp_path / "check"
    proc, steps = _check(out, PARTS="solve", SOLVE_SECONDS="50", SOLVE_STALL_SECONDS="4", SOLVE_PYTHON=str(fake))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert_what_comes_back(out)
    solve = steps["solve"]
    assert solve.split()[1:3] == ["time", "up"], solve
    assert (
        "the first run hung (no output for 4 s" in solve
        and "again with --capture none (solve08-capture-none/)" in solve
    )
    assert "RESULT stage=08 " in solve and "interrupted=SIGINT" in solve
    names = _members(out)
    assert "gpu_check/solve08/stalled" in names and "gpu_check/solve08/solve08.log" in names
    again = _read(out, "gpu_check/solve08-capture-none/solve08.log")
    assert "train step capture: none" in again and "RESULT stage=08 " in again
    assert any(n.startswith("gpu_check/solve08-capture-none/runs/") and n.endswith("/summary.json") for n in names)
    result = (out / "solve08_result.txt").read_text()
    assert "# solve08/solve08.log\n# solve08-capture-none/solve08.log\nTIME stage=08 " in result, result
    assert "curve" in steps


def test_gpu_check_a_failed_solve_is_kept_and_run_again_without_capture(tmp_path):
    # --envs 0 is refused at once (exit 2): the first run's folder is kept, the run starts again
    # with --capture none in a folder of its own (refused too here), then stage 07 (refused too),
    # and summary.txt says all three.
    out = tmp_path / "check"
    proc, steps = _check(out, PARTS="solve", SOLVE_SECONDS="100", SOLVE_ENVS="0")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert_what_comes_back(out)
    assert "--envs" in _read(out, "gpu_check/solve08/solve08.log")
    assert "--envs" in _read(out, "gpu_check/solve08-capture-none/solve08.log")
    solve = steps["solve"]
    assert "the first run failed (exit 2)" in solve and "again with --capture none" in solve, solve
    assert "failed (exit 2); stage 07 instead (solve07/)" in solve, solve
    assert "--envs" in _read(out, "gpu_check/solve07/solve07.log")
    assert solve.split()[1:3] == ["failed", "(2)"] and "no RESULT line" in solve, solve
    assert "skipped" in steps["curve"] and "no run folder" in steps["curve"]  # bad input creates no run folder
    assert "--capture none" in _read(out, "gpu_check/check.log")


def test_gpu_check_compiled_step_says_when_no_time_is_left(tmp_path):
    out = tmp_path / "check"
    proc, steps = _check(out, PARTS="compiled", TOTAL_SECONDS="30")
    assert proc.returncode == 0, proc.stderr
    assert steps["compiled"].split()[1] == "skipped" and "no time left" in steps["compiled"], steps


def test_gpu_check_packs_no_checkpoint_and_leaves_out_the_largest_files_past_the_limit(tmp_path):
    # A scratch folder holding a checkpoint and a 300 kB log that does not compress, packed
    # under a 100 kB limit: the checkpoint is never packed, the log is left out and named.
    run = tmp_path / "work" / "gpu_check" / "solve08" / "runs" / "08-pong-seed1-x"
    run.mkdir(parents=True)
    (run / "checkpoint.pt").write_bytes(b"0" * 1000)
    (run / "noise.log").write_bytes(os.urandom(300_000))
    (run / "summary.json").write_text("{}")
    out = tmp_path / "check"
    proc, steps = _check(out, PARTS="none", BUNDLE_LIMIT="100000", WORK=str(tmp_path / "work"))
    assert proc.returncode == 0, proc.stderr
    assert_what_comes_back(out)
    assert os.path.getsize(out / "bundle.tar.gz") <= 100_000
    prefix = "gpu_check/solve08/runs/08-pong-seed1-x/"
    assert sorted(_members(out)) == sorted(
        ["gpu_check/check.log", "gpu_check/summary.txt", "gpu_check/DROPPED.txt", prefix + "summary.json"]
    )
    dropped = _read(out, "gpu_check/DROPPED.txt")
    assert dropped.startswith(f"left out {prefix}noise.log (300000 bytes): the archive was "), dropped
    assert len(dropped.splitlines()) == 1


def test_gpu_check_names_the_commit_written_before_the_tree_travelled(tmp_path):
    # A tree without .git (as it reaches the GPU machine): the commit gpu_wheels.sh put in .whl/COMMIT.
    tree = tmp_path / "tree"
    (tree / "results").mkdir(parents=True)
    shutil.copy(SCRIPT, tree / "results")
    out = tmp_path / "check"
    proc, steps = _check(out, script=tree / "results" / "gpu_check.sh", PARTS="none")
    assert proc.returncode == 0, proc.stderr
    assert steps["commit"].startswith("commit unknown (no .git, no .whl/COMMIT)"), steps
    (tree / ".whl").mkdir()
    (tree / ".whl" / "COMMIT").write_text("abc1234-dirty\n")
    proc, steps = _check(out, script=tree / "results" / "gpu_check.sh", PARTS="none")
    assert steps["commit"].startswith("commit abc1234-dirty (.whl/COMMIT)"), steps


# Stage 08 fails in both forms (the first only after the bundle has been packed mid-run, which it
# lists); stage 07 is the real one.
FAILS_UNLESS_07 = """#!/usr/bin/env bash
case " $* " in *" 07_vector_play.py "*) exec python3 "$@" ;; esac
echo "stage 08: starting"
case " $* " in *" --capture none "*) exit 3 ;; esac
sleep 7
tar -tzf {out}/bundle.tar.gz > {seen} 2>&1
exit 3
"""


def test_gpu_check_packs_during_the_solve_and_falls_back_to_stage_07(tmp_path):
    # 08 fails with its capture and again with --capture none: stage 07 runs in the time left for
    # an f/s figure; the bundle is rewritten every PACK_SECONDS while a run goes on.
    out, seen = tmp_path / "check", tmp_path / "seen.txt"
    fake = tmp_path / "python"
    fake.write_text(FAILS_UNLESS_07.format(out=out, seen=seen))
    fake.chmod(0o755)
    proc, steps = _check(out, PARTS="solve", SOLVE_SECONDS="50", PACK_SECONDS="3", SOLVE_PYTHON=str(fake))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert_what_comes_back(out)
    assert "gpu_check/solve08/solve08.log" in seen.read_text().split()  # packed while the first run went on
    solve = steps["solve"]
    assert "the first run failed (exit 3)" in solve and "failed (exit 3); stage 07 instead (solve07/)" in solve
    assert "RESULT stage=07 " in solve and solve.split()[1:3] == ["time", "up"], solve
    assert "RESULT stage=07 " in _read(out, "gpu_check/solve07/solve07.log")
    result = (out / "solve08_result.txt").read_text()
    assert "# solve07/solve07.log\nTIME stage=07 " in result, result

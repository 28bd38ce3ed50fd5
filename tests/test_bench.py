"""lib.bench: tag slugs, bound formulas, output parsing, the results folder, stage subprocess
handling (with stand-in stage scripts), bad flags, and one real tiny end-to-end run."""

import csv
import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from lib import bench


# -- tag --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, slug",
    [
        ("Intel(R) Xeon(R) Gold 6338 CPU @ 2.00GHz", "intel-xeon-gold-6338"),
        ("Intel(R) Xeon(R) Processor", "intel-xeon"),
        ("AMD EPYC 7B13 64-Core Processor", "amd-epyc-7b13-64-core"),
        ("NVIDIA GeForce RTX 4090", "nvidia-geforce-rtx-4090"),
        ("", "unknown"),
    ],
)
def test_slugify(name, slug):
    assert bench.slugify(name) == slug


def test_default_tag():
    assert bench.default_tag("cpu", "Intel(R) Xeon(R) Processor", 2) == "cpu-intel-xeon-2c"
    assert bench.default_tag("cuda", "Intel(R) Xeon(R) Processor", 16, "NVIDIA H200") == "gpu-nvidia-h200"


# -- bounds -----------------------------------------------------------------------------------

# Rates picked so that each part takes a round time per call:
#   env_old 1 ms, env_new 0.5 ms, vector step of K=4 envs 1 ms (4000 agent steps/s),
#   act1 2 ms, actK 4 ms, sample(32) 1 ms, sample(128) 4 ms,
#   train fp32(32) 20 ms, train fp32(128) 50 ms, train bf16(128) 25 ms.
RATES = {
    "env_old": 1000.0, "env_new": 2000.0, "env_vector": 4000.0, "act_b1": 500.0, "act_bK": 250.0,
    "sample_b32": 1000.0, "sample_b128": 250.0,
    "train_fp32_b32": 50.0, "train_fp32_b128": 20.0, "train_bf16_b128": 40.0,
}  # fmt: skip


def test_stage_bounds_by_hand():
    b = bench.stage_bounds(RATES, envs=4, greedy=1.0)
    # 01: 1 / (1 + 2 + 1 + 20 ms) = 1 / 24 ms
    assert b["01"] == pytest.approx(1 / 0.024)
    # 02: 1 / (1 + 2 + (4 + 50) / 4 ms) = 1 / 16.5 ms
    assert b["02"] == pytest.approx(1 / 0.0165)
    # 03, 04: min(1 / 3 ms = 333.3, 4 / 54 ms = 74.07): the train side sets the pace
    assert b["03"] == b["04"] == pytest.approx(4 / 0.054)
    # 05: min(1 / 2.5 ms = 400, 74.07)
    assert b["05"] == pytest.approx(4 / 0.054)
    # 06: min(400, 4 / (4 + 25) ms = 137.9)
    assert b["06"] == pytest.approx(4 / 0.029)
    # 07: min(4 / (1 + 4) ms = 800, 137.9)
    assert b["07"] == pytest.approx(4 / 0.029)


def test_stage_bounds_play_side_and_greedy_share():
    rates = dict(RATES, train_bf16_b128=1000.0)  # bf16 train step 1 ms
    b = bench.stage_bounds(rates, envs=4, greedy=0.5)
    # 01 with half the actions greedy: 1 / (1 + 0.5 * 2 + 1 + 20 ms) = 1 / 23 ms
    assert b["01"] == pytest.approx(1 / 0.023)
    # 06: min(1 / (0.5 + 1) ms = 666.7, 4 / (4 + 1) ms = 800): the play side sets the pace
    assert b["06"] == pytest.approx(1 / 0.0015)
    # 07 with g_K = 1 (the default): min(4 / (1 + 4) ms = 800, 800)
    assert b["07"] == pytest.approx(800.0)
    # 07 forwards only on vector steps with a greedy env: g_K = 0.25 -> 4 / (1 + 0.25 * 4) ms
    fast_train = dict(rates, sample_b128=1e6, train_bf16_b128=1e6)
    assert bench.stage_bounds(fast_train, envs=4, greedy_any=0.25)["07"] == pytest.approx(2000.0)


def test_stage_bounds_missing_part():
    rates = {k: v for k, v in RATES.items() if k != "env_vector"}
    b = bench.stage_bounds(rates, envs=4)
    assert b["07"] is None and b["06"] is not None


def test_greedy_fraction():
    # epsilon(f) = 1 - 0.98 f / 100000 below 100k frames, so 1 - epsilon = 0.98 f / 1e5; the
    # mean over f = 1001 .. 5000 is 0.98 * 3000.5 / 1e5 = 0.0294049.
    assert bench.greedy_fraction(1000, 4000) == pytest.approx(0.0294049)
    # Resumed past the schedule (--resume), every frame has epsilon 0.02.
    assert bench.greedy_fraction(1000, 4000, start=900_000) == pytest.approx(0.98)
    # K = 4 envs: a vector step forwards unless all four explore. Frame 1: epsilon = 1 - 0.98e-5,
    # 1 - epsilon^4 = 3.92e-5 (to first order); past the schedule 1 - 0.02^4 = 0.99999984.
    assert bench.greedy_fraction(0, 1, envs=4) == pytest.approx(3.92e-5, rel=1e-4)
    assert bench.greedy_fraction(1000, 4000, start=900_000, envs=4) == pytest.approx(1 - 0.02**4)


def test_needed_rates():
    assert bench.needed_rates(["01"]) == ["env_old", "act_b1", "sample_b32", "train_fp32_b32"]
    assert len(bench.needed_rates(sorted(bench.STAGES))) == len(bench.RATE_UNITS)


# -- parsing ----------------------------------------------------------------------------------


def test_parse_result_line():
    r = bench.parse_result_line(
        "RESULT stage=02 game=pong frames=5000 seconds=95.2 fps=52.1 solved=no mean_reward=nan\n"
    )
    assert r["stage"] == "02" and r["frames"] == 5000 and r["fps"] == 52.1 and r["seconds"] == 95.2
    assert r["solved"] is False
    r = bench.parse_result_line(
        "RESULT stage=01 game=pong frames=10 seconds=1.0 fps=0.0 solved=yes mean_reward=19.500 interrupted=SIGINT"
    )
    assert r["solved"] is True and r["mean_reward"] == 19.5 and r["interrupted"] == "SIGINT"
    assert bench.parse_result_line("stage 01: PongNoFrameskip-v4 on cpu, 2 threads") is None


def test_parse_progress_line():
    p = bench.parse_progress_line("PROGRESS stage=02 frame=2400 phase=train fps=52.1")
    assert p == {"stage": "02", "frame": 2400, "phase": "train", "fps": 52.1}
    assert bench.progress_text("[3/13] stage 02 N=4", p, 5000) == "[3/13] stage 02 N=4: frame 2400/5000 train 52.1 f/s"
    p = bench.parse_progress_line("PROGRESS stage=03 frame=4 phase=fill fps=0.0")
    assert "filling" in bench.progress_text("[1/1] stage 03 N=4", p, 100)
    assert bench.parse_progress_line("PROGRESS stage=02 frame=x") is None
    assert bench.parse_progress_line("RESULT stage=02") is None


def test_plan_runs():
    settings = {"stages": ["01", "02", "07"], "envs": 4, "frames": 100, "sweep": True, "sweep_frames": 50}
    runs = bench.plan_runs(settings)
    assert [r["label"] for r in runs] == [
        "stage 01", "stage 02 N=4", "stage 07 N=4 K=4",
        "sweep 02 N=1", "sweep 02 N=2", "sweep 02 N=3", "sweep 02 N=4", "sweep 02 N=5", "sweep 02 N=6",
    ]  # fmt: skip
    assert runs[2]["args"] == ["--steps", "4", "--envs", "4"]
    assert [r["frames"] for r in runs] == [100] * 3 + [50] * 6
    assert runs[-1]["index"] == runs[-1]["total"] == 9


# -- the results folder -----------------------------------------------------------------------


def _record(stage, fps, steps=4, status="ok", error=None):
    return {"stage": stage, "label": f"stage {stage}", "steps": steps, "fps": fps, "train_frames": 4000,
            "frames": 5000, "seconds": 100.0, "status": status, "error": error}  # fmt: skip


def _meta(settings_extra=None):
    settings = {"device": "cpu", "quick": False, "frames": 4000, "sweep_frames": 2000, "replay_initial": 1000,
                "stages": ["01", "02", "06"], "sweep": True, "seed": 0, "envs": 4, "steps": 4, "bound_seconds": 10.0,
                "out": "results"}  # fmt: skip
    settings.update(settings_extra or {})
    return {
        "tag": "cpu-test-2c", "command": "python -m lib.bench --frames 4000", "argv": ["--frames", "4000"],
        "date": "2026-01-01T00:00:00+00:00", "commit": "abc1234-dirty", "status": "complete", "wall_seconds": 900.0,
        "hardware": {"cpu": "Test CPU", "cores": 2, "memory_gib": 8.0, "gpu": None},
        "versions": {"python": "3.11", "torch": "2.x", "gymnasium": "1.x", "ale-py": "0.12", "numpy": "2",
                     "opencv": "4"},
        "settings": settings, "load_average": {"start": 0.25, "end": 1.5},
    }  # fmt: skip


def _read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_write_results(tmp_path):
    stages = [_record("01", 40.0, steps=1), _record("02", 50.0), _record("06", None, status="failed", error="boom")]
    sweep = [_record("02", 40.0 + n, steps=n) for n in range(1, 7)]
    rates = {k: RATES[k] for k in bench.needed_rates(["01", "02", "06"])}
    bounds = {"rates": rates, "errors": {}, "greedy": 0.03, "stages": bench.stage_bounds(rates, 4, 0.03)}
    out = tmp_path / "cpu-test-2c"
    (out).mkdir()
    (out / "sweep.png").write_text("stale")  # an earlier run's file is replaced, not kept
    written = bench.write_results(str(out), _meta(), stages, sweep, bounds)
    assert set(written) == set(bench.OUTPUT_FILES)
    rows = _read_csv(out / "fps.csv")
    assert list(rows[0]) == bench.FPS_COLUMNS
    assert [r["stage"] for r in rows] == ["01", "02", "06"]
    assert rows[0]["fps"] == "40.00" and rows[0]["ratio_to_01"] == "1.000" and rows[0]["article_fps"] == "154"
    assert rows[1]["ratio_to_01"] == "1.250" and rows[1]["article_ratio"] == f"{227 / 154:.3f}"
    # 02's bound with g = 0.03: 1 / (1 + 0.06 + (4 + 50) / 4 ms) = 1 / 14.56 ms = 68.68 f/s
    assert float(rows[1]["bound_fps"]) == pytest.approx(68.68, abs=0.01)
    assert float(rows[1]["efficiency"]) == pytest.approx(50 / 68.68, abs=0.001)
    assert rows[2]["fps"] == "" and rows[2]["status"] == "failed" and rows[2]["article_fps"] == ""
    sweep_rows = _read_csv(out / "sweep.csv")
    assert list(sweep_rows[0]) == bench.SWEEP_COLUMNS
    assert [r["N"] for r in sweep_rows] == ["1", "2", "3", "4", "5", "6"]
    assert sweep_rows[3]["ratio_to_N1"] == f"{44 / 41:.3f}" and sweep_rows[3]["article_fps"] == "227"
    bound_rows = {r["name"]: r for r in _read_csv(out / "bounds.csv")}
    assert float(bound_rows["env_old"]["value"]) == 1000.0 and bound_rows["env_old"]["unit"].startswith("agent steps/s")
    assert "bound_02" in bound_rows and "greedy_fraction" in bound_rows
    readme = (out / "README.md").read_text()
    for text in ("abc1234-dirty", "python -m lib.bench --frames 4000", "Test CPU, 2 cores", "torch 2.x",
                 "0.25, 1.50 on 2 cores", "| 02 | play steps | 50.0 | 1.25 | 227 | 1.47 |",
                 "| 4 | 44.0 | 1.07 | 227 | 1.47 |",
                 bench.BOUND_FORMULAS["02"], "stage 06: failed: `boom`", "optimistic", "ratios.png",
                 "sweep.png"):  # fmt: skip
        assert text in readme, text
    meta = json.loads((out / "meta.json").read_text())
    assert meta["commit"] == "abc1234-dirty" and meta["hardware"]["cores"] == 2 and len(meta["runs"]) == 9
    assert (out / "sweep.png").read_bytes()[:4] == b"\x89PNG"


def test_write_results_without_sweep(tmp_path):
    bounds = {"rates": {}, "errors": {"env_old": "RuntimeError: x"}, "greedy": 0.03, "stages": {}}
    meta = _meta({"sweep": False, "stages": ["01"]})
    written = bench.write_results(str(tmp_path), meta, [_record("01", 40.0, 1)], None, bounds)
    assert "sweep.csv" not in written and not (tmp_path / "sweep.csv").exists()
    readme = (tmp_path / "README.md").read_text()
    assert "Not run (--no-sweep)" in readme and "env_old: not measured" in readme


# -- stage subprocesses, with stand-in scripts ------------------------------------------------

FAKE_STAGE = textwrap.dedent(
    """
    import argparse, json, os, signal, subprocess, sys, time
    p = argparse.ArgumentParser()
    p.add_argument("--run-dir"); p.add_argument("--max-frames", type=int); p.add_argument("--mode", default="MODE")
    args, _ = p.parse_known_args()
    folder = os.path.join(args.run_dir, "01-pong-seed0-x")
    os.makedirs(folder)
    def finish(fps, interrupted=None):
        with open(os.path.join(folder, "summary.json"), "w") as f:
            json.dump({"fps": fps, "frames": args.max_frames, "train_frames": 40, "seconds": 2.0}, f)
        print(f"RESULT stage=01 game=pong frames={args.max_frames} seconds=2.0 fps={fps} solved=no "
              "mean_reward=nan", flush=True)
    if args.mode == "ok":
        print("PROGRESS stage=01 frame=30 phase=fill fps=0.0", flush=True)
        print("PROGRESS stage=01 frame=60 phase=train fps=12.5", flush=True)
        finish(12.34)
    elif args.mode == "fail":
        print("Traceback (most recent call last):", file=sys.stderr)
        print("RuntimeError: the play process died", file=sys.stderr)
        sys.exit(1)
    else:  # hang, with a helper process in the same group, until SIGTERM
        helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        with open(os.path.join(args.run_dir, "pids"), "w") as f:
            f.write(f"{os.getpid()} {helper.pid}")
        def on_term(*_):
            finish(7.0, "SIGTERM")
            sys.exit(143)
        signal.signal(signal.SIGTERM, on_term)
        print("PROGRESS stage=01 frame=60 phase=train fps=7.0", flush=True)
        time.sleep(60)
    """
)

SETTINGS = {"device": "cpu", "seed": 0, "replay_initial": 50, "frames": 50}


@pytest.fixture
def fake_stage(tmp_path, monkeypatch):
    script = tmp_path / "fake_stage.py"
    script.write_text(FAKE_STAGE)
    monkeypatch.setitem(bench.STAGES, "01", (str(script), "basic"))

    def spec(mode):
        return {"stage": "01", "label": "stage 01", "args": ["--mode", mode], "frames": 50, "steps": 1, "index": 1,
                "total": 1}  # fmt: skip

    return spec


def test_run_stage_ok(fake_stage, tmp_path):
    lines = []
    record = bench.run_stage(fake_stage("ok"), SETTINGS, str(tmp_path / "runs"), log=lines.append)
    assert record["status"] == "ok" and record["fps"] == 12.34 and record["train_frames"] == 40
    assert record["frames"] == 100 and record["seconds"] == 2.0
    assert "[1/1] stage 01: frame 60/100 train 12.5 f/s" in lines
    assert any("filling" in line for line in lines)


def test_run_stage_failure_keeps_last_stderr_line(fake_stage, tmp_path):
    record = bench.run_stage(fake_stage("fail"), SETTINGS, str(tmp_path / "runs"), log=lambda _: None)
    assert record["status"] == "failed" and record["error"] == "RuntimeError: the play process died"
    assert record["fps"] is None


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(")")[-1].split()[0] != "Z"


def test_run_stage_interrupt_ends_the_group(fake_stage, tmp_path):
    """Ctrl-C in the bench (here: raised by the log call of the first PROGRESS line) ends the
    stage's whole process group, and the record of the stopped stage travels with the exception."""
    run_dir = tmp_path / "runs"

    def log(line):
        if "frame 60" in line:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt) as exc:
        bench.run_stage(fake_stage("hang"), SETTINGS, str(run_dir), log=log)
    record = exc.value.record
    assert record["status"] == "interrupted" and record["fps"] == 7.0
    stage_pid, helper_pid = map(int, (run_dir / "pids").read_text().split())
    deadline = time.monotonic() + 5
    while _alive(helper_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(stage_pid) and not _alive(helper_pid)


def test_failed_stage_does_not_stop_the_bench(tmp_path, monkeypatch, capsys):
    """01 fails, 02 still runs; the results are written and the exit code is 1."""
    for stage, mode in (("01", "fail"), ("02", "ok")):
        script = tmp_path / f"fake_{stage}.py"
        script.write_text(FAKE_STAGE.replace('default="MODE"', f'default="{mode}"'))
        monkeypatch.setitem(bench.STAGES, stage, (str(script), bench.STAGES[stage][1]))
    monkeypatch.setattr(bench, "measure_bounds", lambda settings, names, log, into: into)
    out = tmp_path / "results"
    with pytest.raises(SystemExit) as e:
        bench.main(["--device", "cpu", "--stages", "01,02", "--no-sweep", "--out", str(out), "--tag", "t"])
    assert e.value.code == 1
    rows = _read_csv(out / "t" / "fps.csv")
    assert [(r["stage"], r["status"], r["fps"]) for r in rows] == [("01", "failed", ""), ("02", "ok", "12.34")]
    assert "RuntimeError: the play process died" in (out / "t" / "README.md").read_text()
    assert "[2/2] stage 02 N=4: 12.3 f/s" in capsys.readouterr().out


# -- command line -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["--bogus"],
        ["--frames", "0"],
        ["--frames", "ten"],
        ["--stages", "01,08"],
        ["--stages", ""],
        ["--device", "tpu"],
        ["--bound-seconds", "-1"],
        ["--envs", "0"],
        ["--tag", "a/b"],
        ["--replay-initial", "200000"],
        ["--resume", "no/such/checkpoint.pt"],
    ],
)
def test_bad_flags_exit_2(argv, capsys, tmp_path, monkeypatch):
    def must_not_run(*args, **kwargs):
        raise AssertionError("bad flags got past validation")

    monkeypatch.setattr(bench, "measure_bounds", must_not_run)
    with pytest.raises(SystemExit) as e:
        bench.main(argv + ["--out", str(tmp_path)])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("dqn-bench: error:") and "\n" not in err and "Traceback" not in err


def test_parse_stages():
    assert bench.parse_stages("7, 1,05,01") == ["01", "05", "07"]


# -- one real run ------------------------------------------------------------------------------


def test_end_to_end_tiny(tmp_path):
    out = tmp_path / "results"
    cmd = [sys.executable, "-m", "lib.bench", "--device", "cpu", "--stages", "01", "--no-sweep", "--frames", "50",
           "--replay-initial", "100", "--bound-seconds", "0.5", "--out", str(out)]  # fmt: skip
    # One torch thread: on a busy 2-core machine, two OpenMP threads that wait on each other
    # make a train step 20x slower; this test checks the plumbing, not the speed.
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, cwd=bench.ROOT, capture_output=True, text=True, timeout=180, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (folder,) = out.iterdir()
    assert folder.name.startswith("cpu-")
    for name in ("fps.csv", "bounds.csv", "README.md", "meta.json", "ratios.png"):
        assert (folder / name).is_file(), name
    assert not (folder / "sweep.csv").exists()
    (row,) = _read_csv(folder / "fps.csv")
    assert row["stage"] == "01" and row["status"] == "ok" and float(row["fps"]) > 0
    assert float(row["bound_fps"]) > 0
    assert "total wall time" in proc.stdout


def test_end_to_end_resumed_from_another_stage(tmp_path):
    """--resume: stage 06 saves a checkpoint (fused Adam, channels_last weights); the bench runs
    stage 05 from a copy of it, past the checkpoint's frame, and the original stays untouched."""
    from tests.conftest import run_folder, run_stage

    runs = tmp_path / "runs"
    proc, code = run_stage("06", "--run-dir", runs, "--max-frames", 300, "--replay-initial", 100, "--quiet",
                           "--save-every", 300)  # fmt: skip
    assert code == 0, proc.stderr
    ckpt = run_folder(runs) / "checkpoint.pt"
    before = ckpt.read_bytes()
    out = tmp_path / "results"
    cmd = [sys.executable, "-m", "lib.bench", "--device", "cpu", "--stages", "05", "--no-sweep", "--frames", "40",
           "--replay-initial", "100", "--bound-seconds", "0.2", "--out", str(out), "--resume", str(ckpt)]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, cwd=bench.ROOT, capture_output=True, text=True, timeout=180, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (folder,) = out.iterdir()
    assert folder.name.endswith("-resumed")
    (row,) = _read_csv(folder / "fps.csv")
    assert row["status"] == "ok" and int(row["train_frames"]) > 0
    meta = json.loads((folder / "meta.json").read_text())
    assert meta["settings"]["start_frame"] == 300 and meta["settings"]["resume_stage"] == "06"
    readme = (folder / "README.md").read_text()
    assert "resumed a copy of" in readme and "frame 300" in readme
    bounds = {r["name"]: float(r["value"]) for r in _read_csv(folder / "bounds.csv")}
    assert bounds["greedy_fraction"] == pytest.approx(0.98 * 420.5 / 100_000, abs=5e-4)  # frames 401..440
    assert ckpt.read_bytes() == before

    # A solved run's checkpoint would stop every stage at its first game: refused in one line.
    import torch

    state = torch.load(ckpt, weights_only=True)
    state["rewards"] = [21.0] * 100
    solved = tmp_path / "solved.pt"
    torch.save(state, solved)
    proc = subprocess.run(cmd[:-1] + [str(solved)], cwd=bench.ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "solved already" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1

"""lib.bench: tag slugs, bound formulas from the registry, the parts measured with each stage's
own code, output parsing, rounds (plan, medians, spreads, per-round ratios, drift), the
efficiency flag, the results folder, stage subprocess handling (with stand-in stage scripts),
bad flags, and two real tiny end-to-end runs."""

import csv
import dataclasses
import json
import os
import re
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from lib.bench import bounds, command, launch, machine, parts, report, rounds
from lib.run import procs
from lib.run.scripts import load_script
from lib.run.stages import ROOT, STAGES
from tests.conftest import run_folder, run_inprocess

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
    assert machine.slugify(name) == slug


def test_default_tag():
    assert machine.default_tag("cpu", "Intel(R) Xeon(R) Processor", 2) == "cpu-intel-xeon-2c"
    assert machine.default_tag("cuda", "Intel(R) Xeon(R) Processor", 16, "NVIDIA H200") == "gpu-nvidia-h200"
    # One model name, three CPUs this project ran on: the widest units tell them apart.
    epyc = "AMD EPYC"
    assert machine.default_tag("cpu", epyc, 2, isa=machine.cpu_isa({"avx2", "fma"})) == "cpu-amd-epyc-avx2-2c"
    zen4 = {"avx2", "avx512f", "avx512_bf16"}
    assert machine.default_tag("cpu", epyc, 2, isa=machine.cpu_isa(zen4)) == "cpu-amd-epyc-avx512bf16-2c"
    spr = {"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"}
    assert (
        machine.default_tag("cpu", "Intel(R) Xeon(R) Processor", 2, isa=machine.cpu_isa(spr)) == "cpu-intel-xeon-amx-2c"
    )
    assert machine.cpu_isa(set()) is None and machine.cpu_isa({"avx512f"}) == "avx512"
    assert machine.cpu_isa(machine.cpu_flags()) == machine.hardware("cpu")["isa"]


# -- bounds -----------------------------------------------------------------------------------

# Rates picked so that each part takes a round time per call:
#   env_old 1 ms, env_new 0.5 ms, env_vector 0.25 ms per agent step (a step of K=4 games: 1 ms),
#   act (batch 1) 2 ms, act of the vector stage (K=4 states) 4 ms,
#   learn (sample + train_step): fp32 batch 32: 1 + 20 ms, fp32 batch 128: 4 + 50 ms, bf16 batch 128: 4 + 25 ms.
ENV = {"env_old": 1000.0, "env_new": 2000.0, "env_vector": 4000.0}
LEARN = {"01": 1 / 0.021, "02": 1 / 0.054, "03": 1 / 0.054, "04": 1 / 0.054, "05": 1 / 0.054, "06": 1 / 0.029,
         "07": 1 / 0.029}  # fmt: skip


def rates_of(stage_id, **changes):
    form = bounds.bound_form(STAGES[stage_id], 4)
    rates = {form.env: ENV[form.env], form.act: 250.0 if form.play == "vector" else 500.0, form.learn: LEARN[stage_id]}
    rates.update({getattr(form, part): value for part, value in changes.items()})
    return form, rates


def bound(stage_id, greedy=1.0, greedy_any=1.0, **changes):
    form, rates = rates_of(stage_id, **changes)
    return bounds.bound_fps(form, rates, greedy, greedy_any, envs=4)


def test_stage_bounds_by_hand():
    # 01: 1 / (1 + 2 + 21 / 1 ms) = 1 / 24 ms
    assert bound("01") == pytest.approx(1 / 0.024)
    # 02: 1 / (1 + 2 + 54 / 4 ms) = 1 / 16.5 ms
    assert bound("02") == pytest.approx(1 / 0.0165)
    # 03, 04: min(1 / 3 ms = 333.3, 4 / 54 ms = 74.07): the train side sets the pace
    assert bound("03") == bound("04") == pytest.approx(4 / 0.054)
    # 05: min(1 / 2.5 ms = 400, 74.07)
    assert bound("05") == pytest.approx(4 / 0.054)
    # 06: min(400, 4 / 29 ms = 137.9)
    assert bound("06") == pytest.approx(4 / 0.029)
    # 07: min(1 / (0.25 + 1/4 * 4) ms = 800, 137.9)
    assert bound("07") == pytest.approx(4 / 0.029)


def test_stage_bounds_play_side_and_greedy_share():
    # 01 with half the actions greedy: 1 / (1 + 0.5 * 2 + 21 ms) = 1 / 23 ms
    assert bound("01", greedy=0.5) == pytest.approx(1 / 0.023)
    # 06 with a 5 ms learn step: min(1 / (0.5 + 0.5 * 2) ms = 666.7, 4 / 5 ms = 800): the play side sets the pace
    assert bound("06", greedy=0.5, learn=200.0) == pytest.approx(1 / 0.0015)
    # 07 with g_K = 1: min(1 / (0.25 + 1/4 * 4) ms = 800, 800)
    assert bound("07", learn=200.0) == pytest.approx(800.0)
    # 07 forwards only on vector steps with a greedy game: g_K = 0.25 -> 1 / (0.25 + 0.25/4 * 4) ms
    assert bound("07", greedy_any=0.25, learn=1e6) == pytest.approx(2000.0)


def test_stage_bounds_missing_part():
    form, rates = rates_of("07")
    del rates["env_vector"]
    assert bounds.bound_fps(form, rates, 1.0, 1.0, 4) is None
    assert bound("06") is not None


def test_bound_forms_and_formulas_come_from_the_registry():
    for stage in STAGES.values():
        form = bounds.bound_form(stage, 4)
        assert form.parts == (f"env_{stage.wrappers}", f"act_{stage.id}", f"learn_{stage.id}")
        assert form.steps == (4 if "steps" in stage.knobs else 1) and form.batch == 32 * form.steps
        assert stage.play in bounds.COMBINE
    text = {sid: bounds.formula(bounds.bound_form(STAGES[sid], 4)) for sid in STAGES}
    assert text["01"] == "1 / (t_env_old + g·t_act_01 + t_learn_01(32) / 1)"
    assert text["02"] == "1 / (t_env_old + g·t_act_02 + t_learn_02(128) / 4)"
    assert text["05"] == "min(1 / (t_env_new + g·t_act_05), 4 / t_learn_05(128))"
    assert text["07"] == "min(1 / (t_env_vector + g_K/K·t_act_07), 4 / t_learn_07(128))"


def test_greedy_fraction():
    # epsilon(f) = 1 - 0.98 f / 100000 below 100k frames, so 1 - epsilon = 0.98 f / 1e5; the
    # mean over f = 1001 .. 5000 is 0.98 * 3000.5 / 1e5 = 0.0294049.
    assert bounds.greedy_fraction(1000, 4000) == pytest.approx(0.0294049)
    # Resumed past the schedule (--resume), every frame has epsilon 0.02.
    assert bounds.greedy_fraction(1000, 4000, start=900_000) == pytest.approx(0.98)
    # K = 4 envs: a vector step forwards unless all four explore. Frame 1: epsilon = 1 - 0.98e-5,
    # 1 - epsilon^4 = 3.92e-5 (to first order); past the schedule 1 - 0.02^4 = 0.99999984.
    assert bounds.greedy_fraction(0, 1, envs=4) == pytest.approx(3.92e-5, rel=1e-4)
    assert bounds.greedy_fraction(1000, 4000, start=900_000, envs=4) == pytest.approx(1 - 0.02**4)


# -- the parts, measured with each stage's own code ---------------------------------------------

TINY_PARTS = {"device": "cpu", "bound_seconds": 0.01, "seed": 0, "envs": 2, "steps": 1, "replay_initial": 30,
              "frames": 20}  # fmt: skip


@pytest.fixture
def few_windows(monkeypatch):
    """Parts timed in four windows of one call at least: the code each part runs, not its rate, is under test."""
    monkeypatch.setattr(parts, "WINDOWS", 2)
    monkeypatch.setattr(parts, "MIN_CALLS", 1)
    monkeypatch.setattr(parts, "WARMUP_WINDOWS", (2, 2))


@pytest.mark.parametrize("stage_id", list(STAGES))
def test_parts_run_the_stages_own_build_train_step_and_stager(stage_id, monkeypatch, few_windows):
    """Each part of a bound runs the code of the stage it bounds: a stand-in for that stage's
    build and train_step is called, and for the stages that sample into pinned buffers (the
    registry's ``sampling``) a stand-in for the PinnedStager."""
    module, stage = load_script(stage_id), STAGES[stage_id]
    calls = {"build": 0, "train_step": 0, "stager": 0}

    def counted(name, fn):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(module, "build", counted("build", module.build))
    monkeypatch.setattr(module, "train_step", counted("train_step", module.train_step))

    class Stager(parts.PinnedStager):
        def sample(self, buffer, batch_size):
            calls["stager"] += 1
            return super().sample(buffer, batch_size)

    monkeypatch.setattr(parts, "PinnedStager", Stager)
    measured = parts.PartMeter(TINY_PARTS).measure(stage_id, log=lambda _: None)
    assert measured["errors"] == {}
    assert set(measured["parts"]) == set(bounds.bound_form(STAGES[stage_id], 1).parts)
    assert all(rate > 0 for rate in measured["parts"].values())
    assert all(low <= measured["parts"][n] <= high for n, (low, high) in measured["spreads"].items())
    assert set(measured["spreads"]) == set(measured["parts"])
    # The learn part's floor: the stage's train step (batch 32*N) at the matmul rate measured here.
    learn = bounds.bound_form(STAGES[stage_id], TINY_PARTS["steps"]).learn
    assert list(measured["floors"]) == [learn] and measured["floors"][learn] > 0
    assert calls["build"] == 2  # the act part's net and the learn part's learner
    assert calls["train_step"] >= 4  # two warm-up windows and two timed ones
    assert (calls["stager"] >= 4) == (stage.sampling == "pinned")


def test_a_part_the_machine_cannot_run_leaves_the_stage_unbounded(monkeypatch, few_windows):
    module = load_script("01")

    def out_of_memory(*args, **kwargs):
        raise RuntimeError("CUDA out of memory\nmore detail")

    monkeypatch.setattr(module, "train_step", out_of_memory)
    lines = []
    measured = parts.PartMeter(TINY_PARTS).measure("01", log=lines.append)
    assert measured["errors"] == {"learn_01": "RuntimeError: CUDA out of memory"}
    assert set(measured["parts"]) == {"env_old", "act_01"}
    assert lines == ["[bounds 01] learn_01: FAILED (RuntimeError: CUDA out of memory)"]


def test_a_failing_bound_fails_fast(tmp_path, monkeypatch):
    """A bug in a bound (here a test's guard) ends the bench at once with the exception, before
    any stage run, instead of being recorded and followed by every stage's run."""
    module = load_script("01")

    def guard(*args, **kwargs):
        raise AssertionError("train_step must not run here")

    def must_not_run(*args, **kwargs):
        pytest.fail("a stage ran after a failing bound")

    monkeypatch.setattr(module, "train_step", guard)
    monkeypatch.setattr(launch, "run_stage", must_not_run)
    started = time.monotonic()
    with pytest.raises(AssertionError, match="must not run here"):
        command.main(["--device", "cpu", "--stages", "01", "--no-sweep", "--bound-seconds", "0.01", "--out",
                      str(tmp_path)])  # fmt: skip
    assert time.monotonic() - started < 30
    assert list(tmp_path.iterdir()) == []


def test_train_step_timing_bad_input_and_a_tiny_run(capsys):
    from lib.bench import trainstep

    bad = (["--capture", "graph", "--device", "cpu"], ["--batch", "0", "--device", "cpu"], ["--batch", "6"], ["--nope"],
           ["--device", "cpu", "--precision", "bf16,fp16"])  # fmt: skip
    for argv in bad:
        assert trainstep.main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("python -m lib.bench.trainstep: error:"), err
    argv = [
        "--device",
        "cpu",
        "--capture",
        "none",
        "--batch",
        "4",
        "--iters",
        "1",
        "--replay-size",
        "64",
        "--envs",
        "2",
        "--precision",
        "bf16,fp32",
    ]
    assert trainstep.main(argv) == 0
    out = capsys.readouterr().out.splitlines()
    lines = [line for line in out if line.startswith("TRAINSTEP")]
    assert [line.split(" ms=")[0] for line in lines] == [
        f"TRAINSTEP capture=none precision={p} device=cpu batch=4" for p in ("bf16", "fp32")
    ]
    # which form ran as a graph, after each line: the eager form is not
    assert [line for line in out if not line.startswith("TRAINSTEP")] == [
        f"GRAPH capture=none precision={p}: not graphed: eager" for p in ("bf16", "fp32")
    ]
    # Each line carries the step's floor: its arithmetic (batch 4: 4/128 of 8.731 GFLOP) over the
    # matmul rate measured in this process, and the ratio of the measured ms to it.
    for line in lines:
        f = dict(field.split("=") for field in line.split()[1:])
        assert float(f["gflop"]) == pytest.approx(8.731492352 * 4 / 128, abs=1e-3)
        floor = 1000 * float(f["gflop"]) / float(f["matmul_gflops"])
        assert float(f["floor_ms"]) == pytest.approx(floor, rel=0.01, abs=0.01)
        assert float(f["ratio"]) == pytest.approx(float(f["ms"]) / float(f["floor_ms"]), rel=0.01, abs=0.01)
        # the floor's arithmetic is the convolutions': bf16, or a CPU's IEEE fp32
        assert f["floor_math"] == {"bf16": "bf16", "fp32": "ieee"}[f["precision"]] and f["graphed"] == "no"


def test_the_fp32_floor_is_timed_as_tf32_where_cudnn_runs_convolutions_as_tf32(monkeypatch):
    """On CUDA cuDNN runs fp32 convolutions as TF32 by default: the floor's matmul is timed as
    TF32 too (cuBLAS told so while it is timed, and put back), and says so; IEEE where cuDNN's
    TF32 is off, and on a CPU."""
    import torch

    from lib.bench import floor

    assert floor.floor_math("cpu", "fp32") == "ieee" and floor.floor_math("cpu", "bf16") == "bf16"
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", True)
    assert floor.floor_math("cuda", "fp32") == "tf32"
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    assert floor.floor_math("cuda", "fp32") == "ieee"
    # the timing itself, on the CPU standing in for a device whose convolutions are TF32
    monkeypatch.setattr(floor, "floor_math", lambda device, precision: "tf32")
    seen, matmul = [], torch.matmul
    monkeypatch.setattr(
        torch, "matmul", lambda *a, **k: (seen.append(torch.backends.cuda.matmul.allow_tf32), matmul(*a, **k))[1]
    )
    was = torch.backends.cuda.matmul.allow_tf32
    assert floor.matmul_rate("cpu", "fp32", seconds=0.01) > 0
    assert seen and set(seen) == {True} and torch.backends.cuda.matmul.allow_tf32 == was


def test_train_step_timing_fills_one_ring_at_full_size_within_its_budget(capsys, monkeypatch):
    # results/gpu_check.sh times four forms (eager and graph, bf16 and fp32) one after another at
    # the default ring (100,000 slots in 16 rings), whose fill, 6,250 vector steps of Python, is
    # the step's largest cost besides the train steps themselves: it is paid once, and each
    # form's learner gets the filled ring in one copy. Here on CPU at those sizes, with two
    # learners (bf16, fp32) and a small batch (the train step's own cost is not the point), the
    # whole of it stays within what gpu_check.sh gives that step less its kill grace. Counted in
    # this process's CPU seconds, which bound its wall time where it has a core to itself (it
    # waits for nothing else), as on the GPU's host; on this shared machine the wall time is
    # not the code's (38 s wall for 11 s of CPU, at a load average of 10 on 2 cores).
    from lib.bench import trainstep
    from tests.test_gpu_check import SCRIPT

    text = SCRIPT.read_text()
    budget = int(re.search(r"\[timing\]=(\d+)", text)[1]) - int(re.search(r"start timing (\d+)", text)[1])
    fills, fill = [], trainstep.fill_rings
    monkeypatch.setattr(trainstep, "fill_rings", lambda ring, *rest: (fills.append(ring.capacity), fill(ring, *rest)))
    started = time.process_time()
    argv = ["--device", "cpu", "--capture", "none", "--precision", "bf16,fp32", "--batch", "8", "--iters", "2"]
    assert trainstep.main(argv) == 0
    cpu_seconds = time.process_time() - started
    assert fills == [100_000]  # the parser's default: the size a GPU run times at
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("TRAINSTEP")]
    assert [line.split(" device=")[0] for line in lines] == [
        f"TRAINSTEP capture=none precision={p}" for p in ("bf16", "fp32")
    ]
    assert cpu_seconds < budget == 35, cpu_seconds


# -- parsing ----------------------------------------------------------------------------------


def test_parse_result_line():
    r = launch.parse_result_line(
        "RESULT stage=02 game=pong frames=5000 seconds=95.2 fps=52.1 solved=no mean_reward=nan\n"
    )
    assert r["stage"] == "02" and r["frames"] == 5000 and r["fps"] == 52.1 and r["seconds"] == 95.2
    assert r["solved"] is False
    r = launch.parse_result_line(
        "RESULT stage=01 game=pong frames=10 seconds=1.0 fps=0.0 solved=yes mean_reward=19.500 interrupted=SIGINT"
    )
    assert r["solved"] is True and r["mean_reward"] == 19.5 and r["interrupted"] == "SIGINT"
    assert launch.parse_result_line("stage 01: PongNoFrameskip-v4 on cpu, 2 threads") is None


def test_parse_progress_line():
    p = launch.parse_progress_line("PROGRESS stage=02 frame=2400 phase=train fps=52.1")
    assert p == {"stage": "02", "frame": 2400, "phase": "train", "fps": 52.1}
    assert launch.progress_text("[3/13] stage 02 N=4", p, 5000) == "[3/13] stage 02 N=4: frame 2400/5000 train 52.1 f/s"
    p = launch.parse_progress_line("PROGRESS stage=03 frame=4 phase=fill fps=0.0")
    assert "filling" in launch.progress_text("[1/1] stage 03 N=4", p, 100)
    assert launch.parse_progress_line("PROGRESS stage=02 frame=x") is None
    assert launch.parse_progress_line("RESULT stage=02") is None


# -- rounds -----------------------------------------------------------------------------------


def test_plan_runs_interleaves_rounds():
    settings = {"stages": ["01", "02", "07"], "envs": 4, "steps": 4, "frames": 100, "sweep": True,
                "sweep_frames": 50, "repeat": 2}  # fmt: skip
    runs = rounds.plan_runs(settings)
    one_round = ["stage 01", "stage 02 N=4", "stage 07 N=4 K=4", "sweep 02 N=1", "sweep 02 N=2", "sweep 02 N=3",
                 "sweep 02 N=4", "sweep 02 N=5", "sweep 02 N=6"]  # fmt: skip
    assert [r["label"] for r in runs] == one_round * 2
    assert [r["round"] for r in runs] == [1] * 9 + [2] * 9
    assert runs[2]["args"] == ["--steps", "4", "--envs", "4"] and runs[0]["args"] == []
    assert [r["frames"] for r in runs[:9]] == [100] * 3 + [50] * 6
    assert runs[-1]["index"] == runs[-1]["total"] == 18
    assert runs[9]["prefix"] == "[10/18] round 2/2 stage 01"
    assert rounds.plan_runs(dict(settings, repeat=1, sweep=False))[1]["prefix"] == "[2/3] stage 02 N=4"


def _record(stage, fps, rnd=1, steps=4, status="ok", error=None, bound_fps=None, kind="stage"):
    measured = None if bound_fps is None else {"parts": {}, "errors": {}, "fps": bound_fps}
    return {"kind": kind, "round": rnd, "stage": stage, "label": f"stage {stage}", "steps": steps, "fps": fps,
            "train_frames": 4000, "frames": 5000, "seconds": 100.0, "status": status, "error": error,
            "bound": measured}  # fmt: skip


def test_medians_spreads_and_per_round_ratios():
    records = [
        _record("01", 40.0, 1), _record("02", 60.0, 1, bound_fps=64.0), _record("03", 50.0, 1),
        _record("01", 50.0, 2), _record("02", 70.0, 2, bound_fps=70.0), _record("03", None, 2, status="failed"),
        _record("01", 45.0, 3), _record("02", 72.0, 3, bound_fps=75.0), _record("03", 54.0, 3),
    ]  # fmt: skip
    figures = {f["stage"]: f for f in rounds.stage_figures(records)}
    assert list(figures) == ["01", "02", "03"]
    one, two, three = figures["01"], figures["02"], figures["03"]
    assert (one["fps"].median, one["fps"].low, one["fps"].high, one["fps"].n) == (45.0, 40.0, 50.0, 3)
    # 02 / 01 per round: 60/40 = 1.5, 70/50 = 1.4, 72/45 = 1.6: median 1.5, where the ratio of
    # the medians would be 70/45 = 1.556.
    assert (two["ratio"].median, two["ratio"].low, two["ratio"].high) == pytest.approx((1.5, 1.4, 1.6))
    # f/s over the bound beside it: 60/64 = 0.9375, 70/70 = 1, 72/75 = 0.96
    assert (two["efficiency"].median, two["efficiency"].low, two["efficiency"].high) == pytest.approx(
        (0.96, 0.9375, 1.0)
    )
    assert two["bound"].median == 70.0 and not two["over_bound"] and two["status"] == "ok"
    # 03 failed in round 2: two rounds count, ratios 50/40 = 1.25 and 54/45 = 1.2
    assert three["rounds"] == 2 and three["status"] == "2/3 ok" and three["efficiency"] is None
    assert (three["ratio"].median, three["ratio"].n) == (pytest.approx(1.225), 2)


def test_weights_age_over_rounds():
    """Each stage's weights' age (summary.json's ``weights_age``): the mean's median and min-max over
    rounds, the largest of any round, the torn reads over all rounds' forwards; 01-02 report 0; a
    run on CUDA reports its torn reads as null, and the table says they are not measurable."""
    from lib.bench.markdown import age_table
    from lib.run.probes.weights_age import ONE_PROCESS_AGE

    def age(mean, largest, torn, forwards):
        return {"mean": mean, "max": largest, "actions": 1000, "forwards": forwards, "torn_reads": torn}

    records = [
        dict(_record("02", 60.0, 1), weights_age=ONE_PROCESS_AGE), dict(_record("02", 61.0, 2), weights_age=ONE_PROCESS_AGE),
        dict(_record("03", 50.0, 1), weights_age=age(1.7, 3, 0, 900)),
        dict(_record("03", 52.0, 2), weights_age=age(1.5, 4, 2, 1000)),
        dict(_record("03", 51.0, 3), weights_age=age(1.6, 3, 1, 950)),
        dict(_record("04", 55.0, 1), weights_age=age(2.2, 3, None, 500)),
        dict(_record("04", 56.0, 2), weights_age=age(2.3, 3, None, 510)),
    ]  # fmt: skip
    figures = {f["stage"]: f for f in rounds.stage_figures(records)}
    three = figures["03"]
    assert (three["age"].median, three["age"].low, three["age"].high) == (1.6, 1.5, 1.7)
    assert (three["age_max"], three["torn_reads"], three["forwards"]) == (4, 3, 2850)
    assert figures["02"]["age"].median == 0 and figures["02"]["forwards"] is None
    lines = age_table(list(figures.values()))
    assert figures["04"]["torn_reads"] is None and figures["04"]["forwards"] == 1010
    assert lines[-4:] == ["| 02 | 0.00 (0.00-0.00) | 0 | — |", "| 03 | 1.60 (1.50-1.70) | 4 | 3 / 2850 |",
                          "| 04 | 2.25 (2.20-2.30) | 3 | not measurable (CUDA) / 1010 |", ""]  # fmt: skip


def test_sweep_ratios_per_round():
    records = [_record("02", fps, rnd, steps=n, kind="sweep")
               for rnd, row in ((1, (40.0, 50.0)), (2, (50.0, 55.0))) for n, fps in zip((1, 4), row)]  # fmt: skip
    n1, n4 = rounds.sweep_figures(records)
    assert n1["N"] == 1 and n1["fps"].median == 45.0 and n1["ratio"].median == 1.0
    # 50/40 = 1.25 and 55/50 = 1.1: median 1.175
    assert n4["N"] == 4 and n4["ratio"].median == pytest.approx(1.175) and n4["ratio"].low == pytest.approx(1.1)


def _bounded(stage, fps, rnd, bound, low, high, unsteady=()):
    """A run beside a bound measured in windows: its median, slowest and fastest f/s."""
    record = _record(stage, fps, rnd)
    record["bound"] = {"parts": {}, "spreads": {}, "errors": {}, "fps": bound, "fps_low": low, "fps_high": high,
                       "unsteady": list(unsteady)}  # fmt: skip
    return record


def test_a_run_above_its_bound_beyond_the_bounds_spread_is_flagged(tmp_path):
    """One round, as the quick bench runs: 02 at 157% of its bound and 04 at 120%, each above the
    top of its bound's spread, are flagged (status "above bound", not "ok"); 03 at 102%, inside
    its bound's spread, is not. Over three rounds 05 beats its bound in one: "in 1/3"."""
    one = [_record("01", 40.0, 1), _bounded("02", 62.8, 1, 40.0, 38.0, 42.0), _bounded("03", 41.0, 1, 40.0, 38.0, 42.0),
           _bounded("04", 48.0, 1, 40.0, 39.0, 41.0)]  # fmt: skip
    figures = {f["stage"]: f for f in rounds.stage_figures(one)}
    assert [figures[s]["over_bound"] for s in ("02", "03", "04")] == [True, False, True]
    assert [figures[s]["status"] for s in ("01", "02", "03", "04")] == ["ok", "above bound", "ok", "above bound"]
    assert figures["02"]["efficiency"].median == pytest.approx(1.57)
    assert figures["02"]["bound_spread"] == pytest.approx(0.1)
    table = report.console_table(one)
    line = next(line for line in table if "02 play steps" in line)
    assert "157% ABOVE BOUND" in line and line.endswith("above bound")
    assert next(line for line in table if "03 parallel" in line).endswith(" ok")
    report.write_results(str(tmp_path), _meta({"stages": ["01", "02", "03", "04"], "sweep": False, "repeat": 1}), one)
    readme = (tmp_path / "README.md").read_text()
    problems = readme.split("## Measurement problems")[1].split("##")[0]
    assert "- stage 02, round 1: 62.8 f/s, 157% of its bound 40.0, whose fastest windows allow 42.0." in problems
    assert "stage 04, round 1" in problems and "stage 03" not in problems
    assert "157% **above bound**" in readme
    rows = {r["stage"]: r for r in _read_csv(tmp_path / "fps.csv")}
    assert [rows[s]["over_bound"] for s in ("01", "02", "03")] == ["", "yes", "no"]
    assert rows["02"]["status"] == "above bound" and rows["02"]["bound_spread"] == "0.100"

    three = [r for rnd, fps in ((1, 39.0), (2, 43.0), (3, 40.0)) for r in (_record("01", 40.0, rnd),
             _bounded("05", fps, rnd, 40.0, 38.0, 42.0))]  # fmt: skip
    five = {f["stage"]: f for f in rounds.stage_figures(three)}["05"]
    assert five["over_bound"] and five["above_rounds"] == 1 and five["status"] == "above bound in 1/3"

    # A bound from before the windows has no spread: 5% (BOUND_TOLERANCE) stands in for it.
    old = [_record("01", 40.0, 1), _record("05", 52.0, 1, bound_fps=50.0), _record("06", 53.0, 1, bound_fps=50.0)]
    figures = {f["stage"]: f for f in rounds.stage_figures(old)}
    assert not figures["05"]["over_bound"] and figures["06"]["over_bound"]


def test_an_unsteady_bound_gives_no_efficiency(tmp_path):
    """A bound with a part whose windows spread beyond bounds.UNSTEADY is not trusted: no
    efficiency from its round, whatever the run's f/s, and the report says which part and how much."""
    form = bounds.bound_form(STAGES["02"], 4)
    measured = {"parts": {"env_old": 1000.0, "act_02": 500.0, "learn_02": 10.0},
                "spreads": {"env_old": [990.0, 1010.0], "act_02": [495.0, 505.0], "learn_02": [6.8, 10.5]}}  # fmt: skip
    judged = bounds.bound_spread(form, measured, 0.0, 0.0, 4)
    assert judged["unsteady"] == ["learn_02"]  # (10.5 - 6.8) / 10 = 37% > 25%
    # inline: 1 / (t_env + t_learn / 4): 1 / (1 ms + 25 ms) at the median, 1 / (1/990 s + 1/(4*6.8) s) at the slowest
    assert judged["fps"] == pytest.approx(1 / 0.026)
    assert judged["fps_low"] == pytest.approx(1 / (1 / 990 + 1 / 27.2))
    assert judged["fps_high"] == pytest.approx(1 / (1 / 1010 + 1 / 42.0))
    steady = dict(measured, spreads=dict(measured["spreads"], learn_02=[9.0, 11.0]))
    assert bounds.bound_spread(form, steady, 0.0, 0.0, 4)["unsteady"] == []

    records = [_record("01", 40.0, 1), _record("02", 60.0, 1)]
    records[1]["bound"] = dict(measured, errors={}, **judged)
    (two,) = [f for f in rounds.stage_figures(records) if f["stage"] == "02"]
    assert two["efficiency"] is None and two["unsteady_rounds"] == 1 and not two["over_bound"]
    assert two["status"] == "ok" and two["bound"].median == pytest.approx(1 / 0.026)
    report.write_results(str(tmp_path), _meta({"stages": ["01", "02"], "sweep": False, "repeat": 1}), records)
    readme = (tmp_path / "README.md").read_text()
    assert "| unsteady bound | 1 | ok |" in readme
    assert "- stage 02, round 1: bound not trusted, its windows spread more than 25% of the median: " \
           "learn_02 6.8-10.5/s (37%); no efficiency from this round." in readme  # fmt: skip
    (row,) = [r for r in _read_csv(tmp_path / "fps.csv") if r["stage"] == "02"]
    assert row["efficiency"] == "" and row["unsteady_rounds"] == "1"
    assert "unsteady bound" in next(line for line in report.console_table(records) if "02 play" in line)


def test_a_part_is_timed_after_its_warm_up_in_windows(monkeypatch):
    """On a simulated clock: a train step of 0.1 s whose first three calls take 0.5, 0.3 and
    0.2 s (kernels and memory made on first use). Five seconds of timing is five windows of one
    second, after warm-up windows until two agree: 10 calls/s with no spread, none of the cold
    calls counted. A step that takes 0.2 s and 0.1 s in turn, three calls each, timed for one
    second (windows of 0.2 s, so of three calls each), shows it in its spread (5-10/s), and its
    warm-up, never steady, stops once it has lasted that second."""
    clock, calls = [0.0], []
    monkeypatch.setattr(parts.time, "perf_counter", lambda: clock[0])

    def step_costing(cost):
        def step():
            calls.append(cost(len(calls)))
            clock[0] += calls[-1]

        return step

    cold = {0: 0.5, 1: 0.3, 2: 0.2}
    rate = parts.measure_rate(step_costing(lambda i: cold.get(i, 0.1)), 5.0)
    assert (rate.median, rate.low, rate.high, rate.spread) == pytest.approx((10.0, 10.0, 10.0, 0.0))
    # warm-up windows: 3 calls in 1.0 s, then 10 calls/s twice (they agree); then five timed windows
    assert 3 + 2 * 10 + 5 * 10 <= len(calls) <= 3 + 7 * 11

    calls.clear()
    rate = parts.measure_rate(step_costing(lambda i: 0.2 if (i // 3) % 2 == 0 else 0.1), 1.0)
    assert (rate.low, rate.high) == pytest.approx((5.0, 10.0)) and rate.spread > bounds.UNSTEADY
    # warm-up windows of 0.6, 0.3 and 0.6 s (past the second), then the five timed ones
    assert len(calls) == 3 * (3 + parts.WINDOWS)


# Speeds on a 2-core CPU (f/s), and a machine that gets 1% faster every minute (the issue behind
# the rounds: a machine that ran 20-50% faster within minutes).
TRUE_FPS = {"01": 48.0, "02": 63.0, "03": 63.0, "04": 60.0, "05": 63.0, "06": 170.0, "07": 160.0}
TRUE_SWEEP = {1: 45.0, 2: 54.0, 3: 58.0, 4: 62.0, 5: 60.0, 6: 60.0}
DRIFT_PER_SECOND = 0.01 / 60


def simulate(repeat, frames):
    """The bench's own plan and loop with stand-in runs on a simulated clock: each stage run
    reads its true f/s times the machine's speed at its middle; each bound is 5% above the
    true f/s at the time it is measured (9 s, right before its stage)."""
    settings = {"stages": list(TRUE_FPS), "repeat": repeat, "frames": frames, "sweep_frames": frames // 2,
                "sweep": True, "steps": 4, "envs": 4}  # fmt: skip
    clock = [0.0]

    def speed():
        return 1.0 + DRIFT_PER_SECOND * clock[0]

    def measure_bound(spec):
        clock[0] += 9.0
        return {"parts": {}, "errors": {}, "fps": 1.05 * TRUE_FPS[spec["stage"]] * speed()}

    def launch_run(spec):
        true = TRUE_FPS[spec["stage"]] if spec["kind"] == "stage" else TRUE_SWEEP[spec["steps"]]
        clock[0] += 8.0 + spec["frames"] / (2 * true * speed())  # start-up and warm-up, half the run
        fps = true * speed()
        clock[0] += spec["frames"] / (2 * fps)
        return dict(launch.new_record(spec), fps=fps, status="ok", train_frames=spec["frames"], seconds=1.0)

    records = []
    rounds.run_rounds(rounds.plan_runs(settings), launch_run, measure_bound, records)
    figures = rounds.stage_figures(records)
    ratio_error = max(abs(f["ratio"].median / (TRUE_FPS[f["stage"]] / TRUE_FPS["01"]) - 1) for f in figures)
    efficiency_error = max(abs(1.05 * f["efficiency"].median - 1) for f in figures)
    sweep = rounds.sweep_figures(records)
    sweep_error = max(abs(f["ratio"].median / (TRUE_SWEEP[f["N"]] / TRUE_SWEEP[1]) - 1) for f in sweep)
    return clock[0], ratio_error, sweep_error, efficiency_error


def test_interleaved_rounds_keep_ratios_true_on_a_drifting_machine():
    """Three rounds of the full bench's budgets against one pass in stage order with the same
    frames per stage: on a machine that speeds up 1% a minute, the rounds keep every ratio to
    01 (and to N=1) within 5% of the true one, the single pass does not (stage 07 runs about
    ten minutes after 01 there, against four within a round). The bound measured beside each
    run keeps the efficiency true in both."""
    seconds, ratio_error, sweep_error, efficiency_error = simulate(repeat=3, frames=2400)
    assert 20 * 60 < seconds < 30 * 60  # the full bench's budgets on this machine: under 30 minutes
    assert ratio_error < 0.05 and sweep_error < 0.05 and efficiency_error < 0.01
    _, ratio_error, sweep_error, efficiency_error = simulate(repeat=1, frames=3 * 2400)
    assert ratio_error > 0.10 and efficiency_error < 0.02


# -- the results folder -----------------------------------------------------------------------


def _meta(settings_extra=None):
    settings = {"device": "cpu", "quick": False, "repeat": 2, "frames": 4000, "sweep_frames": 2000,
                "replay_initial": 1000, "stages": ["01", "02", "06"], "sweep": True, "seed": 0, "envs": 4, "steps": 4,
                "bound_seconds": 3.0, "out": "results"}  # fmt: skip
    settings.update(settings_extra or {})
    return {
        "tag": "cpu-test-2c", "command": "python -m lib.bench --frames 4000", "argv": ["--frames", "4000"],
        "date": "2026-01-01T00:00:00+00:00", "commit": "abc1234-dirty", "status": "complete", "wall_seconds": 900.0,
        "hardware": {"cpu": "Test CPU", "cores": 2, "memory_gib": 8.0, "gpu": None},
        "versions": {"python": "3.11", "torch": "2.x", "gymnasium": "1.x", "ale-py": "0.12", "numpy": "2",
                     "opencv": "4"},
        "settings": settings, "load_average": {"start": 0.25, "end": 1.5},
        "bounds": {"greedy": 0.03, "greedy_any": 0.1},
    }  # fmt: skip


def _read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _with_parts(record, stage_id):
    form, rates = rates_of(stage_id)
    record["bound"] = {"parts": rates, "errors": {}, "fps": bounds.bound_fps(form, rates, 0.03, 0.1, 4)}
    return record


def test_write_results(tmp_path):
    records = []
    for rnd, (f1, f2) in enumerate(((40.0, 50.0), (44.0, 57.2)), start=1):
        records += [_with_parts(_record("01", f1, rnd, steps=1), "01"), _with_parts(_record("02", f2, rnd), "02"),
                    _record("06", None, rnd, status="failed", error="boom")]  # fmt: skip
        records += [_record("02", 40.0 + n + rnd, rnd, steps=n, kind="sweep") for n in range(1, 7)]
    out = tmp_path / "cpu-test-2c"
    out.mkdir()
    (out / "sweep.png").write_text("stale")  # an earlier run's file is replaced, not kept
    written = report.write_results(str(out), _meta(), records)
    assert set(written) == set(report.OUTPUT_FILES)
    rows = _read_csv(out / "fps.csv")
    assert list(rows[0]) == report.FPS_COLUMNS
    assert [r["stage"] for r in rows] == ["01", "02", "06"]
    assert rows[0]["fps"] == "42.00" and rows[0]["fps_min"] == "40.00" and rows[0]["fps_max"] == "44.00"
    assert rows[0]["ratio_to_01"] == "1.000" and rows[0]["article_fps"] == "154" and rows[0]["rounds"] == "2"
    # 02 / 01 in each round: 1.25 and 1.3
    assert (rows[1]["ratio_to_01"], rows[1]["ratio_min"], rows[1]["ratio_max"]) == ("1.275", "1.250", "1.300")
    assert rows[1]["article_ratio"] == f"{227 / 154:.3f}"
    # 02 over the stage before it, 01, in the same round; 01 has none, 06 (after 05, not run) none
    assert (rows[1]["ratio_to_prev"], rows[1]["ratio_prev_min"], rows[1]["ratio_prev_max"]) == (
        "1.275",
        "1.250",
        "1.300",
    )
    assert rows[0]["ratio_to_prev"] == "" and rows[2]["ratio_to_prev"] == ""
    # 02's bound with g = 0.03: 1 / (1 + 0.06 + 54 / 4 ms) = 1 / 14.56 ms = 68.68 f/s
    assert float(rows[1]["bound_fps"]) == pytest.approx(68.68, abs=0.01)
    assert float(rows[1]["efficiency"]) == pytest.approx(53.6 / 68.68, abs=0.001)
    assert rows[2]["fps"] == "" and rows[2]["status"] == "failed" and rows[2]["article_fps"] == ""
    sweep_rows = _read_csv(out / "sweep.csv")
    assert list(sweep_rows[0]) == report.SWEEP_COLUMNS
    assert [r["N"] for r in sweep_rows] == ["1", "2", "3", "4", "5", "6"]
    # N=4 / N=1: 45/42 and 46/43
    assert sweep_rows[3]["ratio_to_N1"] == f"{(45 / 42 + 46 / 43) / 2:.3f}" and sweep_rows[3]["article_fps"] == "227"
    assert sweep_rows[3]["fps_min"] == "45.00" and sweep_rows[3]["rounds"] == "2"
    bound_rows = {(r["stage"], r["name"]): r for r in _read_csv(out / "bounds.csv")}
    assert list(next(iter(bound_rows.values()))) == report.BOUNDS_COLUMNS
    env = bound_rows[("01", "env_old")]
    assert float(env["value"]) == 1000.0 and env["rounds"] == "2" and env["unit"].startswith("agent steps/s")
    assert "stage 02's sampling and train_step, batch 128" in bound_rows[("02", "learn_02")]["unit"]
    assert ("02", "bound_02") in bound_rows and ("", "greedy_fraction") in bound_rows
    readme = (out / "README.md").read_text()
    for text in ("abc1234-dirty", "python -m lib.bench --frames 4000", "Test CPU, 2 cores", "torch 2.x",
                 "0.25, 1.50 on 2 cores", "Rounds: 2, interleaved", "| 02 | play steps | 53.6 (50.0-57.2) | 1.27 (1.25-1.30) | 1.27 (1.25-1.30) | 227 | 1.47 |",
                 "| 4 | 45.5 (45.0-46.0) | 1.07 (1.07-1.07) | 227 | 1.47 | 2 |",
                 bounds.formula(bounds.bound_form(STAGES["02"], 4)), "round 1, stage 06: failed: `boom`", "optimistic",
                 "ratios.png", "sweep.png", "| 01 | learn_01 |"):  # fmt: skip
        assert text in readme, text
    meta = json.loads((out / "meta.json").read_text())
    assert meta["commit"] == "abc1234-dirty" and meta["hardware"]["cores"] == 2 and len(meta["runs"]) == 18
    assert (out / "sweep.png").read_bytes()[:4] == b"\x89PNG"


def test_write_results_one_round_without_sweep(tmp_path):
    record = _record("01", 40.0, steps=1)
    record["bound"] = {"parts": {}, "errors": {"env_old": "RuntimeError: x"}, "fps": None}
    meta = _meta({"sweep": False, "stages": ["01"], "repeat": 1})
    written = report.write_results(str(tmp_path), meta, [record])
    assert "sweep.csv" not in written and not (tmp_path / "sweep.csv").exists()
    readme = (tmp_path / "README.md").read_text()
    assert "Not run (--no-sweep)" in readme and "stage 01 env_old: not measured in 1 round(s)" in readme
    assert "carries no spread" in readme and "| 01 | basic | 40.0 | 1.00 |" in readme


def _time(bound, play, trainer, frames=4000, wall=40.0):
    """A summary's time by part (lib.run.timing), parts in seconds per 1,000 frames."""
    procs = {"trainer": {"wall_seconds": wall, "per_1000_frames": trainer}}
    if play is not None:
        procs["play"] = {"wall_seconds": wall, "per_1000_frames": play}
    return {"window": "train", "frames": frames, "bound": bound, "processes": procs}


def test_report_shows_each_runs_time_by_part_beside_its_bounds_terms(tmp_path):
    """The README's "Time by part": the run's own parts beside the bound's terms, ms per frame.
    03's bound terms with g = 0.03 (rates_of): env 1.00, act 0.03 * 2 = 0.06, step 54 / 4 = 13.50 ms;
    its bound 74.07 f/s is 13.50 ms per frame. Two rounds of the run: its step is the median of 9 and 11 ms."""
    records = []
    for rnd, step in ((1, 9.0), (2, 11.0)):
        rec = _with_parts(_record("03", 60.0, rnd), "03")
        play = {"env": 1.2, "act": 0.1, "put": 8.5, "other": 0.0}
        trainer = {"get": 0.4, "write": 0.05, "step": step, "log": 0.05, "other": 0.0}
        rec["time"] = _time("trainer:step", play, trainer)
        records.append(rec)
    records.append(dict(_record("01", 40.0), time=_time("trainer:step", None, {"env": 1.0, "step": 20.0})))
    report.write_results(str(tmp_path), _meta({"stages": ["01", "03"], "sweep": False}), records)
    readme = (tmp_path / "README.md").read_text()
    assert "## Time by part" in readme
    row = next(line for line in readme.splitlines() if line.startswith("| 03 | trainer:step |"))
    assert row == (
        "| 03 | trainer:step | 1.20 / 1.00 | 0.10 / 0.06 | 10.00 / 13.50 | put 8.50, get 0.40 | 10.00 / 13.50 |"
    )
    # 01 ran without a measured bound: its own parts, and nothing to hold them against.
    assert "| 01 | trainer:step | 1.00 / — | — / — | 20.00 / — | — | 10.00 / — |" in readme


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


def fake_script(tmp_path, monkeypatch, stage, mode="MODE"):
    script = tmp_path / f"fake_{stage}.py"
    script.write_text(FAKE_STAGE.replace('default="MODE"', f'default="{mode}"'))
    monkeypatch.setitem(STAGES, stage, dataclasses.replace(STAGES[stage], script=str(script)))


@pytest.fixture
def fake_stage(tmp_path, monkeypatch):
    fake_script(tmp_path, monkeypatch, "01")

    def spec(mode):
        return {"kind": "stage", "round": 1, "stage": "01", "label": "stage 01", "args": ["--mode", mode],
                "frames": 50, "steps": 1, "prefix": "[1/1] stage 01"}  # fmt: skip

    return spec


def test_run_stage_ok(fake_stage, tmp_path):
    lines = []
    record = launch.run_stage(fake_stage("ok"), SETTINGS, str(tmp_path / "runs"), log=lines.append)
    assert record["status"] == "ok" and record["fps"] == 12.34 and record["train_frames"] == 40
    assert record["frames"] == 100 and record["seconds"] == 2.0 and record["round"] == 1
    assert "[1/1] stage 01: frame 60/100 train 12.5 f/s" in lines
    assert any("filling" in line for line in lines)


def test_run_stage_failure_keeps_last_stderr_line(fake_stage, tmp_path):
    record = launch.run_stage(fake_stage("fail"), SETTINGS, str(tmp_path / "runs"), log=lambda _: None)
    assert record["status"] == "failed" and record["error"] == "RuntimeError: the play process died"
    assert record["fps"] is None


def test_run_stage_interrupt_ends_the_group(fake_stage, tmp_path):
    """Ctrl-C in the bench (here: raised by the log call of the first PROGRESS line) ends the
    stage's whole process group, and the record of the stopped stage travels with the exception."""
    run_dir = tmp_path / "runs"

    def log(line):
        if "frame 60" in line:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt) as exc:
        launch.run_stage(fake_stage("hang"), SETTINGS, str(run_dir), log=log)
    record = exc.value.record
    assert record["status"] == "interrupted" and record["fps"] == 7.0
    stage_pid, helper_pid = map(int, (run_dir / "pids").read_text().split())
    deadline = time.monotonic() + 5
    while not procs.exited(helper_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert procs.exited(stage_pid) and procs.exited(helper_pid)


class FakeMeter:
    """Stands in for parts.PartMeter: no parts, so no bound."""

    def __init__(self, settings):
        self.settings = settings

    def measure(self, stage_id, log=print):
        return {"parts": {}, "errors": {}}

    def form(self, stage_id):
        return bounds.bound_form(STAGES[stage_id], self.settings["steps"])


def test_failed_stage_does_not_stop_the_bench(tmp_path, monkeypatch, capsys):
    """01 fails, 02 still runs, in both rounds; the results are written and the exit code is 1."""
    fake_script(tmp_path, monkeypatch, "01", "fail")
    fake_script(tmp_path, monkeypatch, "02", "ok")
    monkeypatch.setattr(parts, "PartMeter", FakeMeter)
    out = tmp_path / "results"
    with pytest.raises(SystemExit) as e:
        command.main(["--device", "cpu", "--stages", "01,02", "--no-sweep", "--repeat", "2", "--out", str(out),
                      "--tag", "t"])  # fmt: skip
    assert e.value.code == 1
    rows = _read_csv(out / "t" / "fps.csv")
    assert [(r["stage"], r["status"], r["fps"], r["rounds"]) for r in rows] == [
        ("01", "failed", "", "0"), ("02", "ok", "12.34", "2")
    ]  # fmt: skip
    assert "RuntimeError: the play process died" in (out / "t" / "README.md").read_text()
    printed = capsys.readouterr().out
    assert "[4/4] round 2/2 stage 02 N=4: 12.3 f/s" in printed
    assert "02 play steps" in printed.split("dqn-bench: wrote")[0].splitlines()[-1]


# -- command line -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["--bogus"],
        ["--frames", "0"],
        ["--frames", "ten"],
        ["--repeat", "0"],
        ["--stages", "01,09"],
        ["--stages", ""],
        ["--device", "tpu"],
        ["--bound-seconds", "-1"],
        ["--envs", "0"],
        ["--seed", "-1"],
        ["--tag", "a/b"],
        ["--replay-initial", "200000"],
        ["--resume", "no/such/checkpoint.pt"],
    ],
)
def test_bad_flags_exit_2(argv, capsys, tmp_path, monkeypatch):
    def must_not_run(*args, **kwargs):
        raise AssertionError("bad flags got past validation")

    monkeypatch.setattr(parts, "PartMeter", must_not_run)
    monkeypatch.setattr(launch, "run_stage", must_not_run)
    with pytest.raises(SystemExit) as e:
        command.main(argv + ["--out", str(tmp_path / "out")])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("dqn-bench: error:") and "\n" not in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_settings_defaults():
    args = command.make_parser().parse_args(["--stages", "7, 1,05,01"])
    settings = command.resolve_settings(args, cuda=False)
    assert settings["stages"] == ["01", "05", "07"]
    assert (settings["repeat"], settings["frames"], settings["sweep_frames"], settings["bound_seconds"]) == (
        3, 2400, 1200, 3.0
    )  # fmt: skip
    quick = command.resolve_settings(command.make_parser().parse_args(["--quick"]), cuda=False)
    assert (quick["repeat"], quick["frames"]) == (1, 600)
    # A quick bench writes under runs/, which git ignores; a full one, or an explicit --out, into results/.
    assert (settings["out"], quick["out"]) == ("results", os.path.join("runs", "bench"))
    args = command.make_parser().parse_args(["--quick", "--out", "results"])
    assert command.resolve_settings(args, cuda=False)["out"] == "results"
    args = command.make_parser().parse_args(["--quick", "--repeat", "2"])
    assert command.resolve_settings(args, cuda=False)["repeat"] == 2


# -- real runs --------------------------------------------------------------------------------


def test_end_to_end_tiny(tmp_path):
    """``python -m lib.bench``: stage 01 in two rounds, each after its real bound."""
    out = tmp_path / "results"
    cmd = [sys.executable, "-m", "lib.bench", "--device", "cpu", "--stages", "01", "--no-sweep", "--repeat", "2",
           "--frames", "20", "--replay-initial", "40", "--bound-seconds", "0.05", "--out", str(out)]  # fmt: skip
    # One torch thread: on a busy 2-core machine, two OpenMP threads that wait on each other
    # make a train step 20x slower; this test checks the plumbing, not the speed.
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, check=False, cwd=ROOT, capture_output=True, text=True, timeout=180, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (folder,) = out.iterdir()
    assert folder.name.startswith("cpu-")
    for name in ("fps.csv", "bounds.csv", "README.md", "meta.json", "ratios.png"):
        assert (folder / name).is_file(), name
    assert not (folder / "sweep.csv").exists()
    (row,) = _read_csv(folder / "fps.csv")
    meta = json.loads((folder / "meta.json").read_text())
    assert [(r["round"], r["status"]) for r in meta["runs"]] == [(1, "ok"), (2, "ok")]
    # 20 frames against a bound timed in 0.05 s windows: on a busy machine a round may beat its
    # bound by more than the bound's spread. The status must say exactly which rounds did, read
    # here from each round's own figures: f/s above the top of a steady bound (every part at its
    # fastest window, or the bound plus 5 % where it has no windows).
    above = 0
    for r in meta["runs"]:
        bound = r["bound"]
        high = bound.get("fps_high") or bound["fps"] * 1.05
        above += bool(not bound.get("unsteady") and r["fps"] > high)
    status = "ok" if not above else "above bound" + ("" if above == 2 else f" in {above}/2")
    assert row["stage"] == "01" and row["status"] == status and row["rounds"] == "2"
    assert 0 < float(row["fps_min"]) <= float(row["fps"]) <= float(row["fps_max"])
    # Windows of 0.01 s on a busy machine may spread beyond bounds.UNSTEADY: then no efficiency.
    assert float(row["bound_fps"]) > 0 and (row["unsteady_rounds"] == "2") == (row["efficiency"] == "")
    assert all(set(r["bound"]["parts"]) == {"env_old", "act_01", "learn_01"} for r in meta["runs"])
    assert "Rounds: 2, interleaved" in (folder / "README.md").read_text()
    assert "[2/2] round 2/2 stage 01: bound" in proc.stdout and "total wall time" in proc.stdout
    # Each run's own time by part (its summary.json) is kept and shown beside its bound's terms.
    assert all(r["time"]["bound"].startswith("trainer:") for r in meta["runs"])
    assert "| 01 | trainer:" in (folder / "README.md").read_text().split("## Time by part")[1]
    # The bounds table reads the train step against its arithmetic floor: "<floor> ms (<ratio>x)".
    (learn,) = [
        line for line in (folder / "README.md").read_text().splitlines() if line.startswith("| 01 | learn_01 |")
    ]
    ms, floor, ratio = map(float, re.search(r"\| ([\d.]+) ms \| ([\d.]+) ms \(([\d.]+)x\) \|$", learn).groups())
    assert floor > 0 and ratio == pytest.approx(ms / floor, abs=0.05 + 0.01 * ms / floor), learn  # as printed, rounded


def test_end_to_end_resumed_from_another_stage(tmp_path, monkeypatch, capsys):
    """--resume: stage 06 saves a checkpoint (fused Adam, channels_last weights); the bench runs
    stage 05 from a copy of it, past the checkpoint's frame, and the original stays untouched."""
    runs = tmp_path / "runs"
    res = run_inprocess("06", "--run-dir", runs, "--max-frames", 120, "--replay-initial", 100, "--quiet",
                        "--save-every", 120)  # fmt: skip
    assert res.code == 0, res.stderr
    ckpt = run_folder(runs) / "checkpoint.pt"
    before = ckpt.read_bytes()
    out = tmp_path / "results"
    argv = ["--device", "cpu", "--stages", "05", "--no-sweep", "--repeat", "1", "--frames", "20", "--replay-initial", "50",
            "--bound-seconds", "0.05", "--out", str(out), "--resume", str(ckpt)]  # fmt: skip
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert command.main(argv) == 0
    (folder,) = out.iterdir()
    assert folder.name.endswith("-resumed")
    (row,) = _read_csv(folder / "fps.csv")
    # The run trained; its bound, from windows of 0.05 s, may read below it on a busy machine.
    assert row["status"] in ("ok", "above bound") and int(row["train_frames"]) > 0
    meta = json.loads((folder / "meta.json").read_text())
    assert meta["settings"]["start_frame"] == 120 and meta["settings"]["resume_stage"] == "06"
    readme = (folder / "README.md").read_text()
    assert "resumed a copy of" in readme and "frame 120" in readme
    assert meta["bounds"]["greedy"] == pytest.approx(0.98 * 180.5 / 100_000)  # frames 171..190
    assert "one round, so these figures carry no spread" in capsys.readouterr().out
    assert ckpt.read_bytes() == before

    # A solved run's checkpoint would stop every stage at its first game: refused in one line.
    state = torch.load(ckpt, weights_only=True)
    state["rewards"] = [21.0] * 100
    solved = tmp_path / "solved.pt"
    torch.save(state, solved)
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        command.main(argv[:-1] + [str(solved)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "solved already" in err and len(err.strip().splitlines()) == 1


# -- the README's stage table (lib.bench.table) ------------------------------------------------


def _bench_folder(path, per_round: list[dict], argv=(), **meta_changes):
    """A results folder as the bench writes it: ``per_round`` = one {stage: f/s} per round."""
    records = [_record(stage, fps, rnd, steps=1 if stage == "01" else 4)
               for rnd, row in enumerate(per_round, start=1) for stage, fps in row.items()]  # fmt: skip
    stages = sorted({stage for row in per_round for stage in row})
    meta = _meta({"stages": stages, "sweep": False, "repeat": len(per_round), "frames": 2400})
    meta.update(argv=list(argv), **meta_changes)
    report.write_results(str(path), meta, records)


def _one_pass_folder(path, fps: dict, commit: str):
    """A folder from before the bench ran in rounds: no rounds, no ratio_to_prev, no repeat."""
    path.mkdir(parents=True)
    lines = ["stage,name,fps,ratio_to_01,status"] + [f"{s},{STAGES[s].name},{v},,ok" for s, v in fps.items()]
    (path / "fps.csv").write_text("\n".join(lines) + "\n")
    meta = {"date": "2026-11-29T22:00:00+00:00", "commit": commit, "argv": ["--device", "cuda", "--frames", "6000"],
            "hardware": {"cpu": "Intel(R) Xeon(R) Processor", "cores": 16, "gpu": "NVIDIA H200"},
            "versions": {"torch": "2.11.0+cu130"},
            "settings": {"device": "cuda", "quick": False, "frames": 6000, "envs": 16, "steps": 4}}  # fmt: skip
    (path / "meta.json").write_text(json.dumps(meta))


def test_stage_table_from_results_folders(tmp_path, capsys):
    """Two machines: one bench of three rounds, and two one-pass benches of another machine
    joined with '+'. Every ratio is the median of per-round ratios (the folder's own), a stage
    whose "vs previous" min-max covers 1.00 is marked, a one-pass pair across folders is their
    quotient and marked as such, and the machines table says what machine, bench, learner,
    commit, date and torch each column comes from. The narrow table has one column a machine;
    the full one adds each stage's f/s and "vs previous" with its spread."""
    from lib.bench import table

    # 02/01 per round: 60/40, 70/50, 72/45 = 1.5, 1.4, 1.6; 03/02: 57/60, 72/70, 70/72 = 0.95, 1.029, 0.972
    _bench_folder(tmp_path / "results" / "cpu-a", [{"01": 40.0, "02": 60.0, "03": 57.0},
                  {"01": 50.0, "02": 70.0, "03": 72.0}, {"01": 45.0, "02": 72.0, "03": 70.0}])  # fmt: skip
    _one_pass_folder(tmp_path / "results" / "gpu-b" / "run1", {"01": 20.0, "02": 30.0}, "c76cb80")
    _one_pass_folder(tmp_path / "results" / "gpu-b" / "run2", {"03": 33.0}, "c76cb80")
    specs = ["results/cpu-a@amx", "results/gpu-b/run1+results/gpu-b/run2"]
    text = table.render(specs, str(tmp_path))
    rows = {line.split(" | ")[0][2:]: line for line in text.splitlines() if line.startswith("| ")}
    assert rows["stage"] == "| stage | adds | article | Test AMX | H200 |"
    assert rows["01 basic"] == "| 01 basic | the plain loop | 1.00 | 1.00 | 1.00 |"
    assert rows["02 play steps"] == "| 02 play steps | 4 env steps a train step | 1.47 | 1.50 | 1.50 |"
    # 03/01 per round: 1.425, 1.44, 1.556; across the two one-pass folders: 33/20 (marked ‡)
    assert rows["03 parallel"] == "| 03 parallel | play in its own process | 2.56 | 1.44 † | 1.65 ‡ |"
    assert rows["04 cuda async"] == "| 04 cuda async | copies without waiting | 2.64 | — | — |"
    assert all(len(line.split(" | ")) <= 8 for line in text.splitlines() if line.startswith("| "))
    assert rows["Test AMX"] == (
        "| Test AMX | 2-core Test, AMX | full, 3 x 2,400 |  | 2.x | 2026-01-01 | abc1234-dirty "
        "| [`cpu-a`](results/cpu-a/README.md) |"
    )
    assert rows["H200"].startswith(
        "| H200 | NVIDIA H200, 16 host cores | custom, 1 x 6,000; 01-02 and 03 from two benches |  | 2.11.0+cu130 |"
    )
    assert rows["H200"].endswith(
        " | [`gpu-b/run1`](results/gpu-b/run1/README.md) + [`gpu-b/run2`](results/gpu-b/run2/README.md) |"
    )
    # A column's folders under one folder with its own README: that folder is the link.
    (tmp_path / "results" / "gpu-b" / "README.md").write_text("both runs\n")
    text = table.render(specs, str(tmp_path))
    assert "| [`gpu-b`](results/gpu-b/README.md) |" in text and max(len(line) for line in text.splitlines()) <= 200

    full = table.render_full(specs, str(tmp_path))
    rows = {line.split(" | ")[0][2:]: line for line in full.splitlines() if line.startswith("| ")}
    assert rows["stage"] == (
        "| stage | article: vs 01 (f/s) | vs previous | Test AMX: vs 01 (f/s) | vs previous "
        "| H200: vs 01 (f/s) | vs previous |"
    )
    assert rows["01 basic"] == "| 01 basic | 1.00 (154) |  | 1.00 (45.0) |  | 1.00 (20.0) |  |"
    assert (
        rows["02 play steps"]
        == "| 02 play steps | 1.47 (227) | 1.47 | 1.50 (70.0) | 1.50 (1.40-1.60) | 1.50 (30.0) | 1.50 |"
    )
    assert (
        rows["03 parallel"]
        == "| 03 parallel | 2.56 (395) | 1.74 | 1.44 (70.0) | 0.97 (0.95-1.03) † | 1.65 (33.0) ‡ | 1.10 ‡ |"
    )
    assert rows["04 cuda async"] == "| 04 cuda async | 2.64 (406) | 1.03 | — |  | — |  |"
    assert "| H200 | NVIDIA H200, 16 host cores |" in full

    # Rounds of two benches are not paired: a column joining benches of three rounds is refused;
    # nor are a folder's recorded units overridden, nor two columns given one name.
    _bench_folder(tmp_path / "results" / "cpu-c", [{"04": 50.0}] * 3)
    _bench_folder(tmp_path / "results" / "cpu-d", [{"01": 50.0}], hardware=dict(_meta()["hardware"], isa="avx2"))
    for argv, words in (
        ([str(tmp_path / "results" / "cpu-a") + "+" + str(tmp_path / "results" / "cpu-c")],
         "only one-round benches are paired"),
        ([str(tmp_path / "results" / "cpu-d") + "@amx"], "its meta.json records avx2"),
        ([str(tmp_path / "results" / "cpu-a"), str(tmp_path / "results" / "cpu-c")], "two columns would be named"),
    ):  # fmt: skip
        assert table.main(argv) == 2
        err = capsys.readouterr().err
        assert words in err and len(err.strip().splitlines()) == 1, err


def test_stage_table_update_and_bad_input(tmp_path, capsys):
    """--update rewrites only what lies between a page's markers, from the folders the opening
    one names; a missing folder, a page without markers, or no folders at all: one line, exit 2."""
    from lib.bench import table

    _bench_folder(tmp_path / "results" / "cpu-a", [{"01": 40.0, "02": 60.0}])
    page = tmp_path / "README.md"
    page.write_text(
        "intro\n\n<!-- stage table from: results/cpu-a -->\n| stale |\n<!-- end of stage table -->\n\nafter\n"
    )
    assert table.main(["--update", str(page)]) == 0
    text = page.read_text()
    assert text.startswith("intro\n\n<!-- stage table from: results/cpu-a -->\n\n| stage |") and text.endswith(
        ".\n\n<!-- end of stage table -->\n\nafter\n"
    )
    assert "| stale |" not in text and table.table_of(text) == table.render(["results/cpu-a"], str(tmp_path))
    assert "| 02 play steps | 4 env steps a train step | 1.47 | 1.50 |" in text
    # A page's "full" marker gets the full table; --update takes several pages at once.
    other = tmp_path / "docs" / "measurements.md"
    other.parent.mkdir()
    other.write_text("<!-- full stage table from: ../results/cpu-a -->\n<!-- end of stage table -->\n")
    assert table.main(["--update", str(page), str(other)]) == 0
    assert page.read_text() == text
    assert "| 02 play steps | 1.47 (227) | 1.47 | 1.50 (60.0) | 1.50 |" in other.read_text()
    assert "[`cpu-a`](../results/cpu-a/README.md)" in other.read_text()

    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "meta.json").write_text('{"date": "2026-12-01", "hardware": {}, "versions": {}}')
    (tmp_path / "half" / "fps.csv").write_text("stage,fps\n01,40.0\n")
    for argv, words in (
        ([str(tmp_path / "no-such")], "not a bench's results folder"),
        ([str(tmp_path / "half")], "lacks commit, settings"),
        (["--update", str(tmp_path / "results" / "cpu-a" / "README.md")], "markers"),
        (["--update", str(tmp_path / "missing.md")], "--update"),
        ([], "give FOLDER arguments or --update PAGE"),
    ):
        assert table.main(argv) == 2
        err = capsys.readouterr().err
        assert words in err and len(err.strip().splitlines()) == 1, err
        assert err.startswith("python -m lib.bench.table: error:") and "Traceback" not in err


def test_stage_table_marks_an_interrupted_bench(tmp_path):
    """A bench cut short (meta.json "status": "interrupted") used to read as a finished one, the
    stages it never reached "not run": they read "interrupted", and so does its bench row."""
    from lib.bench import table

    folder = tmp_path / "results" / "cpu-i"
    _bench_folder(folder, [{"01": 40.0, "02": 60.0}], status="interrupted")
    meta = json.loads((folder / "meta.json").read_text())
    meta["settings"]["stages"] = ["01", "02", "03"]  # cut short in 03; 04 was never planned
    (folder / "meta.json").write_text(json.dumps(meta))
    full = table.render_full(["results/cpu-i"], str(tmp_path))
    rows = {line.split(" | ")[0][2:]: line for line in full.splitlines()}
    assert rows["02 play steps"].split(" | ")[3] == "1.50 (60.0)"
    assert rows["03 parallel"].split(" | ")[3] == "interrupted"
    assert rows["04 cuda async"].split(" | ")[3] == "—"
    narrow = table.render(["results/cpu-i"], str(tmp_path))
    cells = {line.split(" | ")[0][2:]: line.rstrip(" |").split(" | ") for line in narrow.splitlines()}
    assert cells["02 play steps"][3] == "1.50" and cells["03 parallel"][3] == "interrupted"
    assert "interrupted, 1 x 2,400" in full and "interrupted, 1 x 2,400" in narrow


def test_a_stage_cut_off_during_its_bound_reads_interrupted_in_the_exit_table_and_the_table(tmp_path):
    """Ctrl-C while 03's bound is measured: the bench's own exit table used to say "not run" for
    03 where ``lib.bench.table`` on the same folder says "interrupted"; both say "interrupted"."""
    from lib.bench import table

    settings = {"stages": ["01", "02", "03"], "envs": 4, "steps": 4, "frames": 2400, "sweep": False,
                "sweep_frames": 1200, "repeat": 1}  # fmt: skip
    runs = rounds.plan_runs(settings)

    def measure_bound(spec):
        if spec["stage"] == "03":
            raise KeyboardInterrupt
        return None

    records = []
    with pytest.raises(KeyboardInterrupt):
        rounds.run_rounds(runs, lambda spec: _record(spec["stage"], 40.0, steps=spec["steps"]), measure_bound,
                          records)  # fmt: skip
    records = rounds.all_records(runs, records, interrupted=True)
    exit_rows = {line.split()[0]: line for line in report.console_table(records) if line.strip()[:2] in STAGES}
    assert exit_rows["03"].rstrip().endswith(" interrupted") and exit_rows["02"].rstrip().endswith(" ok")
    meta = _meta(settings)
    meta["status"] = "interrupted"
    report.write_results(str(tmp_path / "results" / "cpu-i"), meta, records)
    full = table.render_full(["results/cpu-i"], str(tmp_path))
    rows = {line.split(" | ")[0][2:]: line for line in full.splitlines()}
    assert rows["03 parallel"].split(" | ")[3] == "interrupted"


def test_a_second_bench_on_a_results_folder_is_refused_naming_its_holder(tmp_path):
    """A bench holds its results folder as a run holds its run folder (lib.run.runlock): two on
    one --out and --tag used to both write it, the last one winning."""
    from lib.run import runlock

    folder = tmp_path / "out" / "t"
    folder.mkdir(parents=True)
    lock = runlock.claim(str(folder), "test", kind="bench")  # this process is the first bench
    try:
        done = subprocess.run([sys.executable, "-m", "lib.bench", "--quick", "--device", "cpu", "--out",
                               str(tmp_path / "out"), "--tag", "t"], cwd=ROOT, capture_output=True, text=True,
                              timeout=120)  # fmt: skip
    finally:
        lock.release()
    assert done.returncode == 2 and done.stdout == "", done.stdout
    assert done.stderr.splitlines() == [
        f"dqn-bench: error: --out {tmp_path / 'out'}: the bench folder {folder} is in use by process {os.getpid()} "
        "(one bench writes into it at a time)"
    ]

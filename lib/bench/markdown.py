"""The Markdown report of a results folder (its README.md): how the figures were made, the
stage table beside the article's, measurement problems, the sweep, the bounds, and each run's time by
part beside its bound's terms."""

from __future__ import annotations

from lib.bench.bounds import UNSTEADY, bound_form, formula, part_seconds, part_unit
from lib.bench.parts import MIN_CALLS, STEADY, WINDOWS
from lib.bench.rounds import BASELINE, above_bound, part_figures, spread
from lib.run.stages import ARTICLE_HW, ARTICLE_SWEEP, STAGES
from lib.run.timing import WAITS


def ratio(a, b):
    return a / b if a is not None and b else None


def article_ratio(stage_id: str) -> float | None:
    return ratio(STAGES[stage_id].article_fps, STAGES[BASELINE].article_fps)


def spread_text(s, digits: int = 1, scale: float = 1.0, suffix: str = "") -> str:
    """'47.9 (46.1-48.3)': the median, and the min-max when more than one round gave one."""
    if s is None:
        return "—"
    text = f"{s.median * scale:.{digits}f}{suffix}"
    return text + (f" ({s.low * scale:.{digits}f}-{s.high * scale:.{digits}f})" if s.n > 1 else "")


def efficiency_text(f: dict, above: str = "**above bound**") -> str:
    """A stage's efficiency over the rounds whose bound is trusted, flagged where a run beat its
    bound; "unsteady bound" where no round's bound is trusted."""
    if f["efficiency"] is None and f["unsteady_rounds"]:
        return "unsteady bound"
    return spread_text(f["efficiency"], 0, 100, "%") + (f" {above}" if f["over_bound"] else "")


def _md(value, digits: int = 1, suffix: str = "", scale: float = 1.0) -> str:
    return "—" if value is None else f"{value * scale:.{digits}f}{suffix}"


def _rounds_line(s: dict) -> str:
    if s["repeat"] == 1:
        return (
            "- Rounds: 1, so every figure is a single measurement and carries no spread over rounds (a bound "
            "carries its own, from its parts' timed windows); `--repeat 3` (the full bench's default) shows how "
            "much they move"
        )
    order = "every selected stage" + (", then the sweep" if s["sweep"] else "") + ", then again"
    return (
        f"- Rounds: {s['repeat']}, interleaved ({order}); each figure is the median over rounds with its min-max "
        "in brackets, each ratio taken within a round first"
    )


def header(meta: dict) -> list[str]:
    s, hw, load = meta["settings"], meta["hardware"], meta.get("load_average", {})
    lines = [f"# DQN speed-up benchmark: {meta['tag']}", ""]
    if meta.get("status") == "interrupted":
        lines += ["**Interrupted: the figures below are what was collected before the stop.**", ""]
    gpu = f", GPU {hw['gpu']}" if hw.get("gpu") else ""
    lines += [
        f"- Command: `{meta['command']}`",
        f"- Date: {meta['date']}; total wall time {meta['wall_seconds'] / 60:.1f} min",
        f"- Commit: {meta['commit']}",
        (
            f"- Hardware: {hw['cpu']}"
            + (f" ({hw['isa']})" if hw.get("isa") else "")
            + f", {hw['cores']} cores, {_md(hw.get('memory_gib'), 1, ' GiB')} memory{gpu}; "
            f"device {s['device']}"
        ),
        "- Versions: " + ", ".join(f"{k} {v}" for k, v in meta["versions"].items()),
        f"- Allocator: {s.get('malloc', 'not recorded (this bench predates the setting)')}",
        (
            f"- Load average (1 min) at start and end: {_md(load.get('start'), 2)}, {_md(load.get('end'), 2)} "
            f"on {hw['cores']} cores (other work slows the stages down)"
        ),
        _rounds_line(s),
        f"- Budgets: {s['replay_initial']} warm-up transitions, then {s['frames']} training frames per stage run"
        + (f" and {s['sweep_frames']} per sweep run" if s["sweep"] else "")
        + f"; seed {s['seed']}; N={s['steps']}, K={s['envs']} envs"
        + (f", learner {s['precision']}" if "precision" in s else "")
        + " where a stage has the knob; "
        f"{s['bound_seconds']:g} s per part of a bound, measured right before each stage run",
    ]
    if s.get("resume"):
        lines.append(
            f"- Every stage resumed a copy of `{s['resume']}` (saved by stage {s.get('resume_stage')} at frame "
            f"{s['start_frame']}, epsilon {s['start_epsilon']:.2f}): trained weights, late-training speed"
        )
    return lines + [
        "",
        "A frame is one agent step (4 emulator frames). f/s is the steady-state training speed after",
        f"the replay buffer filled. The article's figures are from a {ARTICLE_HW}; compare the ratios",
        'to stage 01, not the f/s. "vs previous" is a stage\'s f/s over the stage before it in the same',
        "round: what the one optimisation it adds buys.",
        "",
    ]


def stage_table(figures: list[dict]) -> list[str]:
    lines = [
        "## Stages",
        "",
        "| stage | name | f/s | vs 01 | vs previous | article f/s | article vs 01 | bound f/s | efficiency | rounds "
        "| status |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for f in figures:
        stage = STAGES[f["stage"]]
        efficiency = efficiency_text(f)
        article = "—" if stage.article_fps is None else str(stage.article_fps)
        lines.append(
            f"| {f['stage']} | {stage.name} | {spread_text(f['fps'])} | {spread_text(f['ratio'], 2)} | "
            f"{spread_text(f['ratio_prev'], 2)} | {article} | "
            f"{_md(article_ratio(f['stage']), 2)} | {spread_text(f['bound'])} | {efficiency} | {f['rounds']} | "
            f"{f['status']} |"
        )
    return lines + ["", "![Each stage as a ratio to stage 01, ours and the article's](ratios.png)", ""]


def age_table(figures: list[dict]) -> list[str]:
    """The weights each stage acts with: how many train steps older than stage 02's (0 in 01-02,
    one process), and the forwards that read weights Adam was writing."""
    lines = [
        "## The weights an action uses",
        "",
        "Age in train steps behind stage 02's weights at the same frame (mean over rounds (min-max), and the "
        "largest); torn reads: greedy forwards during an optimizer step. On CUDA the host sees when a train step "
        "and a forward are launched, not when the device runs them: the age counts the train steps launched, and "
        "torn reads are not measurable.",
        "",
        "| stage | mean age | max age | torn reads / forwards |",
        "|---|---|---|---|",
    ]
    for f in figures:
        if f.get("age") is None:
            continue
        torn = "not measurable (CUDA)" if f["torn_reads"] is None else f["torn_reads"]
        torn = "—" if f["forwards"] is None else f"{torn} / {f['forwards']}"
        lines.append(f"| {f['stage']} | {spread_text(f['age'], 2)} | {f['age_max']} | {torn} |")
    return lines + [""]


def problems(figures: list[dict], records: list[dict]) -> list[str]:
    """Runs faster than their bound beyond its spread, bounds not trusted, and runs that failed or were stopped."""
    lines = []
    runs = [r for r in records if r["kind"] == "stage" and r["status"] == "ok"]
    above = [r for r in runs if above_bound(r)]
    unsteady = [r for r in runs if (r.get("bound") or {}).get("unsteady")]
    if above or unsteady:
        lines += ["## Measurement problems", ""]
    for r in above:
        b = r["bound"]
        top = "" if b.get("fps_high") is None else f", whose fastest windows allow {b['fps_high']:.1f}"
        lines.append(
            f"- stage {r['stage']}, round {r['round']}: {r['fps']:.1f} f/s, {100 * r['fps'] / b['fps']:.0f}% of its "
            f"bound {b['fps']:.1f}{top}. A stage cannot run faster than its parts allow: the two were not measured "
            "alike (a part timed before it warmed up, other work on the machine, a CPU clock that changed), so read "
            "neither figure as a result."
        )
    for r in unsteady:
        b, parts = r["bound"], []
        for name in b["unsteady"]:
            low, high = b["spreads"][name]
            parts.append(f"{name} {low:.1f}-{high:.1f}/s ({100 * (high - low) / b['parts'][name]:.0f}%)")
        lines.append(
            f"- stage {r['stage']}, round {r['round']}: bound not trusted, its windows spread more than "
            f"{100 * UNSTEADY:.0f}% of the median: {', '.join(parts)}; no efficiency from this round."
        )
    if above or unsteady:
        lines.append("")
    failed = [r for r in records if r["status"] != "ok" and r.get("error")]
    if failed:
        lines += ["Failed or stopped runs:", ""]
        lines += [f"- round {r['round']}, {r['label']}: {r['status']}: `{r['error']}`" for r in failed]
        lines.append("")
    return lines


def sweep_table(sweep: list[dict] | None) -> list[str]:
    lines = ["## Play-steps sweep (stage 02, --steps N)", ""]
    if sweep is None:
        return lines + ["Not run (--no-sweep).", ""]
    lines += ["| N | f/s | vs N=1 | article f/s | article vs N=1 | rounds |", "|---|---|---|---|---|---|"]
    for f in sweep:
        article = ARTICLE_SWEEP.get(f["N"])
        lines.append(
            f"| {f['N']} | {spread_text(f['fps'])} | {spread_text(f['ratio'], 2)} | {article} | "
            f"{_md(ratio(article, ARTICLE_SWEEP[1]), 2)} | {f['rounds']} |"
        )
    return lines + ["", "![f/s against N as a ratio to N=1, ours and the article's](sweep.png)", ""]


def parts_table(records: list[dict], settings: dict) -> list[str]:
    parts = part_figures(records)
    lines = ["## Bounds", ""]
    if any(p["rate"] for p in parts):
        lines += [
            "Measured in the bench's own process on the same device, right before each stage's run, with that",
            "stage's own code (its `build`, `train_step` and acting):",
            "",
            "| stage | part | rate | windows' spread | unit | time per call | floor (ratio) |",
            "|---|---|---|---|---|---|---|",
        ]
        for p in (p for p in parts if p["rate"]):
            unit = part_unit(bound_form(STAGES[p["stage"]], settings["steps"]), p["name"], settings["envs"])
            ms = 1000 / p["rate"].median
            floor = f"{p['floor']:.2f} ms ({ms / p['floor']:.1f}x)" if p.get("floor") else ""
            lines.append(
                f"| {p['stage']} | {p['name']} | {spread_text(p['rate'])} | {_md(p['spread'], 0, '%', 100)} | {unit} "
                f"| {ms:.3f} ms | {floor} |"
            )
        lines += [
            "",
            f"Each part is timed in {WINDOWS} windows (together the bench's seconds per part, each of at least "
            f"{MIN_CALLS} calls) after a warm-up that ends when two windows in a row agree within "
            f"{100 * STEADY:.0f}% (or it has lasted as long): its rate is the windows' median. The windows' spread is (max - min) / median, "
            f"the largest of any round; above {100 * UNSTEADY:.0f}% the bound is not trusted. A train step's floor is its",
            "arithmetic (`lib.model.train_step_flops`) at the rate of a 2048x2048 matmul in the stage's precision, measured",
            "in the same process (`python -m lib.bench.trainstep`); its ratio is the time per call over that floor.",
        ]
        lines.append("")
    failed = [p for p in parts if p["errors"]]
    for p in failed:
        lines.append(
            f"- stage {p['stage']} {p['name']}: not measured in {len(p['errors'])} round(s): `{p['errors'][-1]}`"
        )
    return lines + ([""] if failed else [])


def bound_notes(meta: dict) -> list[str]:
    s, bounds = meta["settings"], meta["bounds"]
    lines = [
        "Each stage's bound is the best f/s it could reach on this machine, from those parts",
        "(t_x = 1 / rate of part x; a vector stage's env rate counts agent steps):",
        "",
    ]
    lines += [f"- {sid}: `{formula(bound_form(STAGES[sid], s['steps']))}`" for sid in s["stages"]]
    lines += [
        "",
        f"g = {_md(bounds.get('greedy'), 3)} is the share of the measured frames that act greedily (1 - epsilon):",
        "resumed late in training, nearly every action comes from the net."
        if s.get("resume")
        else "short bench runs sit at the start of the epsilon schedule, where most actions are random and skip the "
        "forward pass.",
        f"g_K = {_md(bounds.get('greedy_any'), 3)} is the share of a vector stage's steps where at least one of its",
        f"K={s['envs']} games acts greedily (1 - epsilon^K): only those run its batched forward pass.",
        "Efficiency = measured f/s / bound, taken in each round against the bound measured beside that run.",
        "A bound's spread comes from its parts at their slowest and fastest windows. A run faster than the",
        "top of that spread is flagged as a measurement problem (status `above bound`): no stage runs faster",
        "than its parts allow. A bound with an unsteady part gives no efficiency. The bounds leave out what ties the parts together: the Queue",
        "between the processes, target syncs, Python glue; and they assume the parts do not slow each",
        "other down.",
    ]
    if s["device"] == "cpu":
        lines += [
            f"On a CPU the parallel stages' two processes share the same {meta['hardware']['cores']} cores, while",
            "each part was measured alone, so the parallel bounds are optimistic there.",
        ]
    return lines + [""]


def _run_parts(record: dict) -> dict:
    """A run's time by part as the bound's terms (ms per frame): env and act from the side that
    plays, the train step (and the device's, on CUDA), the waits, and the trainer's wall."""
    times = record["time"]
    procs = {p: e["per_1000_frames"] for p, e in times["processes"].items()}
    side, trainer = procs.get("play", procs["trainer"]), procs["trainer"]
    return {
        "env": side.get("env"),
        "act": side.get("act"),
        "step": trainer.get("step"),
        "device": procs.get("device", {}).get("step"),
        "put": procs.get("play", {}).get("put"),
        "lag_wait": procs.get("play", {}).get("lag_wait"),
        "stalled": procs.get("play", {}).get("stalled"),
        "get": trainer.get("get"),
        "pace": trainer.get("pace"),
        "wall": times["processes"]["trainer"]["wall_seconds"] * 1000.0 / times["frames"],
    }


def time_table(records: list[dict], meta: dict) -> list[str]:
    """Each stage's runs' own time by part beside the terms of the bound measured before them."""
    s, b = meta["settings"], meta["bounds"]
    rows = []
    for stage_id in s["stages"]:
        runs = [r for r in records if r["kind"] == "stage" and r["stage"] == stage_id and r["status"] == "ok"]
        runs = [r for r in runs if r.get("time") and r["time"]["frames"] > 0]
        if not runs:
            continue
        form = bound_form(STAGES[stage_id], s["steps"])
        run = [_run_parts(r) for r in runs]
        bench = [
            part_seconds(form, r["bound"]["parts"], b.get("greedy") or 0.0, b.get("greedy_any") or 0.0, s["envs"])
            for r in runs
            if r.get("bound")
        ]
        bench_wall = [1000.0 / r["bound"]["fps"] for r in runs if (r.get("bound") or {}).get("fps")]

        def cell(key, values=run):
            s = spread(v[key] for v in values)
            return _md(s and s.median, 2)

        step = cell("step") + (f" (device {cell('device')})" if any(v["device"] is not None for v in run) else "")
        waits = ", ".join(f"{w} {cell(w)}" for w in WAITS if any(v[w] is not None for v in run))
        bounds_seen = sorted({r["time"]["bound"] for r in runs})
        rows.append(
            f"| {stage_id} | {', '.join(bounds_seen)} | {cell('env')} / {cell('env', bench)} | "
            f"{cell('act')} / {cell('act', bench)} | {step} / {cell('step', bench)} | {waits or '—'} | "
            f"{cell('wall')} / {_md(spread(bench_wall) and spread(bench_wall).median, 2)} |"
        )
    if not rows:
        return []
    return [
        "## Time by part",
        "",
        "Each run's own timers (`lib.run.timing`, over its training frames; the TIME line and `summary.json`) beside",
        "the terms of the bound measured right before it, all in ms per frame (seconds per 1,000 frames),",
        "medians over rounds: run / bench. The bench's terms are t_env, the greedy-weighted t_act and t_learn / N; the run's",
        "env and act are its play side's, its step is sampling and the train step (on CUDA the device's",
        "time for it in brackets), its waits are Queue put and get, the device pacer, the play process's",
        "wait for the trainer at `--lag zero` (lag_wait) and its silence (stalled), and its wall is",
        "the trainer's wall time per frame, to hold against the bound's 1 / bound f/s. The run's bound is the",
        "busiest process's largest part that is not a wait (`process:part`).",
        "",
        "| stage | run's bound | env | act | train step | run's waits | wall / bound |",
        "|---|---|---|---|---|---|---|",
        *rows,
        "",
    ]


def render_readme(meta: dict, figures: list[dict], sweep: list[dict] | None, records: list[dict]) -> str:
    lines = header(meta) + stage_table(figures) + age_table(figures) + problems(figures, records) + sweep_table(sweep)
    lines += parts_table(records, meta["settings"]) + bound_notes(meta) + time_table(records, meta)
    return "\n".join(lines)

"""Rounds: the plan of runs, running it, and the figures over rounds.

A round is every selected stage in order, each right after its bound's parts were measured,
then stage 02 with N = 1..6 (the sweep); the bench runs R rounds one after the other. A
machine whose speed drifts during the bench then moves every stage of a round alike, and a
ratio taken within a round (stage / 01, N / N=1, f/s / bound) keeps little of the drift.
Each figure is reported as the median over rounds with its min and max.
"""

from __future__ import annotations

import dataclasses
import math
import statistics

from lib.bench.launch import new_record
from lib.run.knobs import KNOBS
from lib.run.stages import ARTICLE_SWEEP, STAGES

BASELINE = next(iter(STAGES))  # the registry's first stage: every stage's ratio is taken to it
SWEEP_STAGE = next(s.id for s in STAGES.values() if "steps" in s.knobs)  # the stage that brings N: the sweep's


def stage_spec(stage_id: str, settings: dict) -> dict:
    """One stage's run: its own knobs (registry) at the bench's N and K."""
    stage, args, label = STAGES[stage_id], [], f"stage {stage_id}"
    steps = settings["steps"] if "steps" in stage.knobs else KNOBS["steps"].unset
    if "steps" in stage.knobs:
        args, label = args + ["--steps", str(steps)], label + f" N={steps}"
    if "envs" in stage.knobs:
        args, label = args + ["--envs", str(settings["envs"])], label + f" K={settings['envs']}"
    if "precision" in stage.knobs and "precision" in settings:  # a bench from before the knob ran bf16
        args, label = args + ["--precision", settings["precision"]], label + f" {settings['precision']}"
    return {
        "kind": "stage",
        "stage": stage_id,
        "label": label,
        "args": args,
        "frames": settings["frames"],
        "steps": steps,
    }


def plan_runs(settings: dict) -> list[dict]:
    """Every run in order: R rounds of the selected stages, then the sweep."""
    runs = []
    for r in range(1, settings["repeat"] + 1):
        for stage_id in settings["stages"]:
            runs.append(dict(stage_spec(stage_id, settings), round=r))
        if settings["sweep"]:
            for n in ARTICLE_SWEEP:
                runs.append(
                    {
                        "kind": "sweep",
                        "round": r,
                        "stage": SWEEP_STAGE,
                        "label": f"sweep {SWEEP_STAGE} N={n}",
                        "args": ["--steps", str(n)],
                        "frames": settings["sweep_frames"],
                        "steps": n,
                    }
                )
    for i, spec in enumerate(runs, start=1):
        where = f" round {spec['round']}/{settings['repeat']}" if settings["repeat"] > 1 else ""
        spec.update(index=i, total=len(runs), prefix=f"[{i}/{len(runs)}]{where} {spec['label']}")
    return runs


def run_rounds(runs: list[dict], launch, bound, records: list[dict]) -> None:
    """Run the plan in order: for a stage, ``bound(spec)`` (its parts, measured right before
    it) then ``launch(spec)`` (its record); a sweep run is launched alone. Records go into
    ``records`` as they come, so that an interrupt keeps them; a run stopped by Ctrl-C leaves
    the record that travels with the exception (``exc.record``)."""
    for spec in runs:
        measured = bound(spec) if spec["kind"] == "stage" else None
        try:
            record = launch(spec)
        except BaseException as exc:
            partial = getattr(exc, "record", None)
            if partial is not None:
                records.append(dict(partial, bound=measured))
            raise
        records.append(dict(record, bound=measured))


def all_records(runs: list[dict], records: list[dict], interrupted: bool = False) -> list[dict]:
    """One record per planned run, in plan order: those that ran, and for the rest "not run", or,
    in a bench cut short (``interrupted``), "interrupted" (a stage cut off while its bound was
    measured, and those after it), the word ``lib.bench.table`` reads for them."""
    done = {(r["kind"], r["round"], r["stage"], r["steps"]): r for r in records}
    unrun = {"status": "interrupted"} if interrupted else {}
    return [done.get((s["kind"], s["round"], s["stage"], s["steps"])) or {**new_record(s), **unrun} for s in runs]


@dataclasses.dataclass(frozen=True)
class Spread:
    """A figure over rounds: median, min, max, and how many rounds gave one."""

    median: float
    low: float
    high: float
    n: int


def spread(values) -> Spread | None:
    vals = [v for v in values if v is not None and math.isfinite(v)]
    if not vals:
        return None
    return Spread(statistics.median(vals), min(vals), max(vals), len(vals))


def _ok_fps(record: dict) -> float | None:
    return record["fps"] if record["status"] == "ok" else None


def _bound_of(record: dict) -> float | None:
    return (record.get("bound") or {}).get("fps")


def ratios(records: list[dict], base: dict) -> Spread | None:
    """f/s over the base run of the same round ({round: f/s}), over rounds."""
    return spread(_ok_fps(r) / base[r["round"]] for r in records if _ok_fps(r) and base.get(r["round"]))


def status_over_rounds(records: list[dict]) -> str:
    """ "ok" when every round's run counted; else the last one's status, or "k/R ok"."""
    ok = sum(r["status"] == "ok" for r in records)
    if records and ok == len(records):
        return "ok"
    if ok:
        return f"{ok}/{len(records)} ok"
    ran = [r for r in records if r["status"] != "not run"]
    return ran[-1]["status"] if ran else "not run"


# A bound measured before its parts were timed in windows has no spread of its own: it is taken
# to be this far off, so that an efficiency within it of 100% in a round reads as agreement.
BOUND_TOLERANCE = 0.05


def _trusted_bound(record: dict) -> float | None:
    """The bound beside a run, unless one of its parts was unsteady while timed (``bounds.UNSTEADY``)."""
    measured = record.get("bound") or {}
    return None if measured.get("unsteady") else measured.get("fps")


def _bound_high(record: dict) -> float:
    """The top of a trusted bound's spread: every part at its fastest window."""
    measured = record["bound"]
    return measured.get("fps_high") or measured["fps"] * (1 + BOUND_TOLERANCE)


def above_bound(record: dict) -> bool:
    """A run faster than its trusted bound by more than the bound's spread: a stage cannot run
    faster than its parts allow, so the two were not measured alike (a part timed cold, other
    work on the machine during one of them)."""
    return bool(_ok_fps(record) and _trusted_bound(record) and _ok_fps(record) > _bound_high(record))


def _bound_spread(record: dict) -> float | None:
    """(max - min) / median of a bound within its one measurement; None without windows."""
    measured = record.get("bound") or {}
    if not (measured.get("fps") and measured.get("fps_low") and measured.get("fps_high")):
        return None
    return (measured["fps_high"] - measured["fps_low"]) / measured["fps"]


def _status(runs: list[dict], above: int) -> str:
    """``status_over_rounds``, and "above bound" (in k/R rounds where not all) for runs that beat their bound."""
    status = status_over_rounds(runs)
    if not above:
        return status
    where = "" if above == len(runs) else f" in {above}/{len(runs)}"
    return ("above bound" if status == "ok" else f"{status}, above bound") + where


def _group(records: list[dict], kind: str, key: str) -> dict:
    groups = {}
    for r in records:
        if r["kind"] == kind:
            groups.setdefault(r[key], []).append(r)
    return groups


def previous_stage(stage_id: str) -> str | None:
    """The stage this one layers its optimisation on: the one before it in the registry."""
    ids = list(STAGES)
    at = ids.index(stage_id)
    return ids[at - 1] if at > 0 else None


def stage_figures(records: list[dict]) -> list[dict]:
    """Per stage, in plan order: f/s, ratio to the baseline 01 and to the previous stage (per
    round: what the one optimisation it adds buys), bound and efficiency (per round: f/s over
    the bound measured beside it, where that bound is trusted), each a Spread or None; the
    rounds whose run beat its bound by more than the bound's spread (``above_bound``: flagged
    in the status) and those whose bound was unsteady (no efficiency from them)."""
    groups = _group(records, "stage", "stage")
    fps_by_round = {stage_id: {r["round"]: _ok_fps(r) for r in runs} for stage_id, runs in groups.items()}
    base = fps_by_round.get(BASELINE, {})
    out = []
    for stage_id, runs in groups.items():
        prev = previous_stage(stage_id)
        ok = [r for r in runs if _ok_fps(r)]
        efficiency = spread(_ok_fps(r) / _trusted_bound(r) for r in ok if _trusted_bound(r))
        above = sum(above_bound(r) for r in ok)
        spreads = [x for x in map(_bound_spread, ok) if x is not None]
        out.append(
            {
                "stage": stage_id,
                "fps": spread(_ok_fps(r) for r in runs),
                "ratio": ratios(runs, base),
                "ratio_prev": ratios(runs, fps_by_round[prev]) if prev in fps_by_round else None,
                "bound": spread(_bound_of(r) for r in runs),
                "bound_spread": max(spreads, default=None),  # the largest within one measurement
                "efficiency": efficiency,  # over the rounds whose bound is trusted
                "over_bound": above > 0,
                "above_rounds": above,
                "unsteady_rounds": sum(bool(_bound_of(r)) and not _trusted_bound(r) for r in ok),
                "train_frames": spread(r["train_frames"] for r in ok),
                "seconds": spread(r["seconds"] for r in ok),
                "rounds": len(ok),
                "status": _status(runs, above),
                **weights_age(ok),
            }
        )
    return out


def weights_age(runs: list[dict]) -> dict:
    """The weights' age over rounds (``lib.parallel.WeightsAge``): the mean age's spread, the
    largest age, and the torn reads over the greedy forwards of all rounds (None where a round
    could not measure them: on CUDA)."""
    ages = [r["weights_age"] for r in runs if r.get("weights_age")]
    forwards = [a["forwards"] for a in ages if a.get("forwards") is not None]
    torn = [a["torn_reads"] for a in ages]
    return {
        "age": spread(a["mean"] for a in ages),
        "age_max": max((a["max"] for a in ages), default=None),
        "torn_reads": sum(torn) if torn and None not in torn else None,
        "forwards": sum(forwards) if forwards else None,
    }


def sweep_figures(records: list[dict]) -> list[dict]:
    """Per N: f/s and ratio to N=1 (per round), each a Spread or None."""
    groups = _group(records, "sweep", "steps")
    base = {r["round"]: _ok_fps(r) for r in groups.get(1, [])}
    return [
        {
            "N": n,
            "fps": spread(_ok_fps(r) for r in runs),
            "ratio": ratios(runs, base),
            "rounds": sum(_ok_fps(r) is not None for r in runs),
            "status": status_over_rounds(runs),
        }
        for n, runs in groups.items()
    ]


def part_figures(records: list[dict]) -> list[dict]:
    """Per stage and part: its rate over rounds, the largest spread of its windows within one
    measurement ((max - min) / median; None for a bench from before the windows), and the
    errors of the rounds it failed in."""
    out = {}
    for r in records:
        measured = (r.get("bound") if r["kind"] == "stage" else None) or {}
        for name, rate in measured.get("parts", {}).items():
            part = out.setdefault((r["stage"], name), {"rates": [], "spreads": [], "errors": [], "floors": []})
            part["rates"].append(rate)
            if measured.get("floors", {}).get(name):
                part["floors"].append(measured["floors"][name])
            low, high = measured.get("spreads", {}).get(name, (None, None))
            if low is not None:
                part["spreads"].append((high - low) / rate)
        for name, error in measured.get("errors", {}).items():
            out.setdefault((r["stage"], name), {"rates": [], "spreads": [], "errors": [], "floors": []})[
                "errors"
            ].append(error)
    return [
        {
            "stage": stage_id,
            "name": name,
            "rate": spread(v["rates"]),
            "spread": max(v["spreads"], default=None),
            "errors": v["errors"],
            "floor": statistics.median(v["floors"]) if v["floors"] else None,  # ms, train steps only
        }
        for (stage_id, name), v in out.items()
    ]

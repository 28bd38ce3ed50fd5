"""Seed statistics of runs, and whether stages learn alike.

Runs are grouped by game and stage (from summary.json, else from a folder name
``<stage>-<game>-seed<N>...``), one sample per run. Per stage: the mean of ``reward_100``
over its seeds with a 95% bootstrap band (seeds resampled with replacement, percentile
interval), against frames and against minutes (``python -m lib.analysis.curves ... --seeds`` draws it). Curves are steps (a run's value
holds until its next game ends) and are compared where every seed has one: from the latest
first point to the earliest last point, a solved run holding its last value. Minutes here
count training time over all of a run's sittings, the time between them left out
(``lib.analysis.run_folders.stitched``). The table gives, per stage and level,
the mean frames and minutes to reach it with a 95% bootstrap interval over seeds ("k/n seeds"
where only k of n seeds reached it). Below it, one line gives per stage reward_100 at the
most frames every run has reached (a solved run holding its last value), mean and interval.

The verdict line tests, for every pair of stages, the difference between their mean frames to
reach each level that every seed of every stage reached, with a two-sided permutation test
(exact over every split of the seeds where there are at most 200,000 splits); where no level
was reached by all, it tests reward_100 at the most frames every run has reached instead.
The stages differ per frame when some comparison's p is below 0.05 shared among the
comparisons (Bonferroni); otherwise they learn alike as far as their seeds show, unless so
few seeds cannot show a difference at all (3 seeds a stage allow no p below 0.1): then the
line says it cannot tell, with the smallest p.
Overlapping bootstrap intervals are not the test: over 2 or 3 seeds a percentile interval
spans little more than the seeds' range, and two stages of three seeds that learn alike have
ranges that miss each other 1 time in 10.

This module does not import torch.
"""

from __future__ import annotations

import bisect
import itertools
import math

from lib.analysis import reference
from lib.analysis.run_folders import (
    NEVER,
    first_reach,
    load_curve,
    played_frames,
    resumes,
    run_identity,
    unreadable,
    unreadable_lines,
)

BOOTSTRAP = 2000  # resamples of the seeds for a 95% interval
BAND_POINTS = 200  # points of a mean curve


def bootstrap_mean(values, n_boot: int = BOOTSTRAP, seed: int = 0):
    """values: (seeds, points). Mean over seeds and its 95% percentile-bootstrap interval at
    each point, resampling whole seeds with replacement; returns (mean, lo, hi) arrays."""
    import numpy as np

    values = np.asarray(values, dtype=float)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, values.shape[0], size=(n_boot, values.shape[0]))
    means = values[idx].mean(axis=1)
    lo, hi = np.percentile(means, [2.5, 97.5], axis=0)
    return values.mean(axis=0), lo, hi


def _common_span(curves) -> tuple[float, float] | None:
    """(start, end) that every curve (x, y, holds) covers: from the latest first point to the
    earliest last point, a curve that ``holds`` (a solved run) standing after its last point;
    None where there is no such stretch or no curve."""
    if not curves:
        return None
    start = max(c[0][0] for c in curves)
    open_ends = [c[0][-1] for c in curves if not c[2]]
    end = min(open_ends) if open_ends else max(c[0][-1] for c in curves)
    return None if end < start else (start, end)


def seed_band(curves: list[tuple[list, list, bool]], points: int = BAND_POINTS):
    """curves: (x, reward_100, holds) per seed; ``holds``: the run ended solved, so its last
    value stands after its last point. Returns (grid, mean, lo, hi), or None where the seeds'
    curves have no stretch in common."""
    import numpy as np

    curves = [c for c in curves if c[0]]
    span = _common_span(curves)
    if span is None:
        return None
    start, end = span
    grid = np.linspace(start, end, points if end > start else 1)
    rows = []
    for x, y, _ in curves:
        at = np.searchsorted(np.asarray(x, dtype=float), grid, side="right") - 1
        rows.append(np.asarray(y, dtype=float)[at])
    return (grid, *bootstrap_mean(np.vstack(rows)))


def _interval(values: list[float]) -> tuple[float, float, float]:
    mean, lo, hi = bootstrap_mean([[v] for v in values])
    return float(mean[0]), float(lo[0]), float(hi[0])


def seed_stats(runs: list[str], levels: list[float]) -> dict:
    """Per (game, stage): each seed's curve, the mean band against frames and minutes, and
    for each level the seeds that reached it with the mean frames and minutes and intervals."""
    groups: dict = {}
    skipped = []
    for folder in runs:
        who = run_identity(folder)
        if who is None:
            skipped.append(folder)
            continue
        frames, minutes, values = load_curve(folder)
        entry = {"seed": who["seed"], "folder": folder, "frames": frames, "minutes": minutes, "values": values,
                 "holds": who["solved"], "resumes": resumes(folder), "played": played_frames(folder)}  # fmt: skip
        groups.setdefault((who["game"], who["stage"]), []).append(entry)
    stats = {"groups": {}, "skipped": skipped, "unreadable": unreadable(runs)}
    for key in sorted(groups):
        seeds = sorted(groups[key], key=lambda e: e["seed"])
        group = {"seeds": seeds, "levels": {}}
        for axis in ("frames", "minutes"):
            group[axis] = seed_band([(e[axis], e["values"], e["holds"]) for e in seeds])
        for level in levels:
            hits = [first_reach(e["frames"], e["minutes"], e["values"], level) for e in seeds]
            hits = [h for h in hits if h is not None]
            cell = {"n": len(seeds), "reached": len(hits), "frames": None, "minutes": None, "values": None}
            if hits and len(hits) == len(seeds):
                cell["values"] = [h[0] for h in hits]
                cell["frames"] = _interval(cell["values"])
                cell["minutes"] = _interval([h[1] for h in hits])
            group["levels"][level] = cell
        group["at"] = {
            f: [reference.value_at(e["frames"], e["values"], f, e["played"]) for e in seeds]
            for f in reference.AT_FRAMES
        }
        stats["groups"][key] = group
    return stats


def at_common_frame(stats: dict, game: str):
    """(F, {stage: [reward_100 per seed]}) of ``game`` at F, the most frames that every run of
    every stage has reached (a solved run holds its last value); None where the runs have no
    frame in common."""
    seeds = [e for (g_game, _), g in stats["groups"].items() if g_game == game for e in g["seeds"]]
    if not all(e["frames"] for e in seeds):
        return None  # a run without a curve yet
    span = _common_span([(e["frames"], e["values"], e["holds"]) for e in seeds])
    if span is None:
        return None
    common = span[1]
    at = {}
    for (g_game, stage), group in stats["groups"].items():
        if g_game == game:
            at[stage] = [e["values"][bisect.bisect_right(e["frames"], common) - 1] for e in group["seeds"]]
    return common, at


ALPHA = 0.05  # the verdict's level, shared by all its comparisons (Bonferroni)
EXACT_SPLITS = 200_000  # up to this many ways to split the seeds, the permutation test is exact
PERMUTATIONS = 20_000  # else this many random splits


def permutation_p(a, b, seed: int = 0) -> float:
    """Two-sided p-value of the difference between the means of ``a`` and ``b`` (one value per
    seed): the share of the ways to split the pooled values into groups of their sizes whose
    means differ at least as much. Exact (every split) where the splits are few, else from
    random splits ((hits + 1) / (draws + 1))."""
    import numpy as np

    pooled = np.asarray(list(a) + list(b), dtype=float)
    n, k = len(pooled), len(a)
    observed = abs(float(np.mean(a)) - float(np.mean(b)))
    tol = 1e-9 * max(1.0, observed)
    if math.comb(n, k) <= EXACT_SPLITS:
        groups = np.array(list(itertools.combinations(range(n), k)), dtype=np.int64)
        hits = int((_split_gaps(pooled, groups, k) >= observed - tol).sum())
        return hits / len(groups)
    rng = np.random.default_rng(seed)
    groups = np.argsort(rng.random((PERMUTATIONS, n)), axis=1)[:, :k]
    hits = int((_split_gaps(pooled, groups, k) >= observed - tol).sum())
    return (hits + 1) / (PERMUTATIONS + 1)


def _split_gaps(pooled, groups, k: int):
    first = pooled[groups].sum(axis=1)
    return abs(first / k - (pooled.sum() - first) / (len(pooled) - k))


def smallest_p(n_a: int, n_b: int) -> float:
    """The smallest p-value ``permutation_p`` can give groups of these sizes."""
    return min(1.0, 2 / math.comb(n_a + n_b, n_a))


def verdict(stats: dict, game: str, levels: list[float]) -> str:
    """One line: do the stages of ``game`` learn alike per frame (the rule in this module's doc)?"""
    import numpy as np

    stages = {stage: g for (g_game, stage), g in stats["groups"].items() if g_game == game}
    names = ", ".join(sorted(stages))
    if len(stages) < 2:
        return f"Verdict ({game}): one stage only ({names}), nothing to compare."
    compared, partial = [], []
    for level in levels:
        cells = {stage: g["levels"][level] for stage, g in stages.items()}
        if all(c["frames"] is not None for c in cells.values()):
            compared.append((f"frames to reach {level:g}", {stage: c["values"] for stage, c in cells.items()}))
        elif any(c["reached"] for c in cells.values()):
            partial.append(level)
    note = f" ({', '.join(f'{lv:g}' for lv in partial)}: not reached by every seed, not compared)" if partial else ""
    if not compared:
        note = f"; no level was reached by every seed of every stage{note}"
        common = at_common_frame(stats, game)
        if common is None:
            return f"Verdict ({game}): cannot tell{note}, and the runs have no frame in common."
        compared = [(f"reward_100 at {common[0]} frames", common[1])]
    order = sorted(stages)
    tests = [(what, a, b, values) for what, values in compared for i, a in enumerate(order) for b in order[i + 1 :]]
    alpha = ALPHA / len(tests)
    p, what, a, b = min((permutation_p(v[a], v[b]), what, a, b) for what, a, b, v in tests)
    values = dict(compared)[what]
    if p < alpha:
        return (
            f"Verdict ({game}): the stages differ per frame: {what}, stage {a} {np.mean(values[a]):.1f} and stage "
            f"{b} {np.mean(values[b]):.1f} (means over seeds), permutation test p = {p:.3f}, below {alpha:.3g} "
            f"({ALPHA:g} shared by {len(tests)} comparison(s)){note}."
        )
    whats = " and ".join(w for w, _ in compared)
    floor = max(smallest_p(len(v[a]), len(v[b])) for _, a, b, v in tests)
    if floor >= alpha:
        seeds = "/".join(str(len(stages[s]["seeds"])) for s in order)
        return (
            f"Verdict ({game}): cannot tell: {seeds} seeds are too few for a permutation test to show a "
            f"difference (the least p they allow is {floor:.2f}, the test needs {alpha:.3g}); in {whats}, the "
            f"smallest p is {p:.2f}{note}."
        )
    return (
        f"Verdict ({game}): stages {names} learn alike per frame as far as these seeds show: in {whats}, no "
        f"difference passes a permutation test at {ALPHA:g} (smallest p {p:.2f}){note}."
    )


def _common_line(stats: dict, game: str) -> list[str]:
    common = at_common_frame(stats, game)
    if common is None:
        return []
    frames, values = common
    cells = {stage: _interval(v) for stage, v in values.items()}
    each = "; ".join(f"stage {stage} {m:.1f} [{lo:.1f}, {hi:.1f}]" for stage, (m, lo, hi) in sorted(cells.items()))
    return ["", f"reward_100 at {frames} frames, the most every run has reached (mean [95% interval]): {each}."]


def _reference_row(levels: list[float]) -> str:
    """The 2017 run as a row of the frames-to-level table: its frames, and its minutes on its GTX 1080 Ti."""
    reached, _ = reference.marks(*reference.curve(), levels)
    cells = [reference.LABEL, "one run"]
    for hit in reached:
        cells += [NEVER, NEVER] if hit is None else [str(hit[0]), f"{hit[1]:.1f}"]
    return "| " + " | ".join(cells) + " |"


def _at_frames_table(stats: dict, game: str) -> list[str]:
    """reward_100 at each of ``reference.AT_FRAMES`` per stage (mean [95% interval] over the seeds
    that played that far, "k/n seeds" where not all did), and the 2017 run's for Pong."""
    head = ["stage", "seeds"] + [f"reward_100 at {f // 1000}k" for f in reference.AT_FRAMES]
    lines = [
        "",
        "| " + " | ".join(head) + " |",
        "|" + "|".join(["---"] * 2 + ["---:"] * len(reference.AT_FRAMES)) + "|",
    ]
    for (g_game, stage), group in stats["groups"].items():
        if g_game != game:
            continue
        cells = [f"stage {stage}", ",".join(str(e["seed"]) for e in group["seeds"])]
        for f in reference.AT_FRAMES:
            got = [v for v in group["at"][f] if v is not None]
            if got and len(got) == len(group["at"][f]):
                mean, lo, hi = _interval(got)
                cells.append(f"{mean:.1f} [{lo:.1f}, {hi:.1f}]")
            else:
                cells.append(f"{len(got)}/{len(group['at'][f])} seeds" if got else NEVER)
        lines.append("| " + " | ".join(cells) + " |")
    if game == reference.GAME:
        _, at = reference.marks(*reference.curve(), [])
        lines.append("| " + " | ".join([reference.LABEL, "one run"] + [f"{v:.1f}" for v in at]) + " |")
    return lines


def _cell(cell: dict, axis: str, digits: int) -> str:
    if cell[axis] is not None:
        mean, lo, hi = cell[axis]
        return f"{mean:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"
    return f"{cell['reached']}/{cell['n']} seeds" if cell["reached"] else NEVER


def seed_markdown(stats: dict, levels: list[float]) -> str:
    """Per game: the table of frames and minutes to each level (mean [95% interval] over
    seeds) and the verdict line."""
    out = []
    games = sorted({game for game, _ in stats["groups"]})
    for game in games:
        head = ["stage", "seeds"]
        for level in levels:
            head += [f"frames to {level:g}", f"minutes to {level:g}"]
        lines = [f"{game}: mean over seeds [95% bootstrap interval]", "",
                 "| " + " | ".join(head) + " |", "|" + "|".join(["---"] * 2 + ["---:"] * (2 * len(levels))) + "|"]  # fmt: skip
        for (g_game, stage), group in stats["groups"].items():
            if g_game != game:
                continue
            cells = [f"stage {stage}", ",".join(str(e["seed"]) for e in group["seeds"])]
            for level in levels:
                cells += [_cell(group["levels"][level], "frames", 0), _cell(group["levels"][level], "minutes", 1)]
            lines.append("| " + " | ".join(cells) + " |")
        if game == reference.GAME:
            lines.append(_reference_row(levels))
        lines += _at_frames_table(stats, game)
        lines += [*_common_line(stats, game), "", verdict(stats, game, levels)]
        out.append("\n".join(lines))
    for folder in stats["skipped"]:
        out.append(f"Not counted: {folder} (no summary.json and not named <stage>-<game>-seed<N>).")
    out += unreadable_lines(stats.get("unreadable", []))
    return "\n\n".join(out)


# How a resume is marked on a curve's frames axis: (gid, marker, filled, what the legend says),
# by whether its replay ring came back (None: the run's files do not say).
RESUME_MARKS = {
    True: ("resume-ring", "^", False, "resumed with its replay ring"),
    False: ("resume-refilled", "^", True, "resumed, replay buffer refilled"),
    None: ("resume-unknown", "x", True, "resumed (ring not recorded)"),
}


def mark_resumes(ax, resumed: list[tuple[int, bool | None]], color) -> set:
    """A marker at the foot of ``ax`` (frames on x) at each resume's frame, in the run's
    ``color``: a hollow triangle where its ring came back, a filled one where the buffer was
    refilled. Returns the kinds drawn, for ``resume_legend``."""
    kinds = set()
    for ring, (gid, marker, filled, _) in RESUME_MARKS.items():
        frames = [f for f, r in resumed if r is ring]
        if frames:
            ax.plot(frames, [0.0] * len(frames), marker=marker, linestyle="none", markersize=9, color=color,
                    markerfacecolor=color if filled else "none", transform=ax.get_xaxis_transform(), clip_on=False,
                    gid=gid)  # fmt: skip
            kinds.add(ring)
    return kinds


def resume_legend(ax, kinds: set) -> None:
    """Legend entries (in black) for the kinds of resume marks ``ax`` shows."""
    for ring in (True, False, None):
        if ring in kinds:
            _, marker, filled, label = RESUME_MARKS[ring]
            ax.plot([], [], marker=marker, linestyle="none", color="black",
                    markerfacecolor="black" if filled else "none", label=label)  # fmt: skip


def plot_seeds(stats: dict, levels: list[float], out: str) -> None:
    """Per game a row of two panels (frames, minutes): per stage the mean over seeds and its band,
    and at the foot of the frames panel a mark at each seed's resumes (``mark_resumes``)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    games = sorted({game for game, _ in stats["groups"]}) or ["—"]
    fig = Figure(figsize=(12, 4.5 * len(games)), layout="constrained")
    axes = fig.subplots(len(games), 2, sharey=True, squeeze=False)
    for row, game in zip(axes, games):
        kinds = set()
        for (g_game, stage), group in stats["groups"].items():
            if g_game != game:
                continue
            color = None
            n = len(group["seeds"])
            label = f"stage {stage} ({n} seed{'' if n == 1 else 's'})"
            for ax, axis in zip(row, ("frames", "minutes")):
                band = group[axis]
                if band is None:
                    continue
                grid, mean, lo, hi = band
                (line,) = ax.plot(grid, mean, label=label, color=color)
                color = line.get_color()
                ax.fill_between(grid, lo, hi, color=color, alpha=0.2, linewidth=0)
            for entry in group["seeds"]:  # each seed's resumes, in its stage's colour
                kinds |= mark_resumes(row[0], entry.get("resumes") or [], color)
        if game == reference.GAME:
            reference.draw(row[0])  # frames only: its minutes are another machine's
        resume_legend(row[0], kinds)
        for ax in row:
            for level in levels:
                ax.axhline(level, color="grey", linewidth=0.6, linestyle=":")
            ax.grid(alpha=0.3)
        row[0].set_xlabel("frames (agent steps)")
        row[1].set_xlabel("training minutes")
        row[0].set_ylabel(f"{game}: reward_100, mean over seeds (95% band)")
        if row[0].get_legend_handles_labels()[0]:
            row[0].legend(loc="best")
    fig.savefig(out, format="png", dpi=100)

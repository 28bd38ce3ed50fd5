"""The two charts of a results folder: each stage as a ratio to stage 01, and the play-steps
sweep as a ratio to N=1, ours beside the article's, with our min-max over rounds as error bars."""

from __future__ import annotations

import os

from matplotlib.figure import Figure  # no pyplot: no GUI backend, nothing global

from lib.bench.rounds import BASELINE
from lib.run.stages import ARTICLE_HW, ARTICLE_SWEEP, STAGES


def _error_bars(figures: list) -> list[list[float]]:
    """[[below], [above]] the medians, from each Spread's min and max."""
    return [[s.median - s.low for s in figures], [s.high - s.median for s in figures]]


def draw_ratios(path: str, stage_rows: list[dict], tag: str) -> None:
    fig = Figure(figsize=(8, 4.5))
    ax = fig.subplots()
    width = 0.38
    ours = [(i, r["ratio"]) for i, r in enumerate(stage_rows) if r["ratio"] is not None]
    if ours:
        bars = ax.bar(
            [i - width / 2 for i, _ in ours],
            [s.median for _, s in ours],
            width,
            label=f"ours ({tag})",
            color="tab:blue",
            yerr=_error_bars([s for _, s in ours]),
            capsize=3,
        )
        ax.bar_label(bars, fmt="%.2f", fontsize=8)
    base = STAGES[BASELINE].article_fps
    article = [
        (i, STAGES[r["stage"]].article_fps / base)
        for i, r in enumerate(stage_rows)
        if STAGES[r["stage"]].article_fps is not None
    ]
    if article:
        bars = ax.bar(
            [i + width / 2 for i, _ in article],
            [v for _, v in article],
            width,
            label=f"article ({ARTICLE_HW})",
            color="tab:gray",
        )
        ax.bar_label(bars, fmt="%.2f", fontsize=8)
    ax.set_xticks(range(len(stage_rows)), [f"{r['stage']}\n{STAGES[r['stage']].name}" for r in stage_rows], fontsize=8)
    ax.axhline(1.0, color="black", linewidth=0.6)
    ax.set_ylabel("f/s as a ratio to stage 01 (median, min-max)")
    ax.set_title("Speed-up of each stage over stage 01")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def draw_sweep(path: str, sweep_rows: list[dict], tag: str) -> None:
    fig = Figure(figsize=(6, 4))
    ax = fig.subplots()
    ours = [(r["N"], r["ratio"]) for r in sweep_rows if r["ratio"] is not None]
    if ours:
        ax.errorbar(
            [n for n, _ in ours],
            [s.median for _, s in ours],
            yerr=_error_bars([s for _, s in ours]),
            fmt="o-",
            capsize=3,
            label=f"ours ({tag})",
        )
    base = ARTICLE_SWEEP[1]
    ax.plot(list(ARTICLE_SWEEP), [v / base for v in ARTICLE_SWEEP.values()], "s--", label=f"article ({ARTICLE_HW})")
    ax.set_xlabel("play steps per train step N (batch 32*N)")
    ax.set_ylabel("f/s as a ratio to N=1 (median, min-max)")
    ax.set_title("Stage 02 play-steps sweep")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def draw_charts(out_dir: str, stage_rows: list[dict], sweep_rows: list[dict] | None, tag: str) -> list[str]:
    """Draw ratios.png (and sweep.png with a sweep); returns the files written."""
    draw_ratios(os.path.join(out_dir, "ratios.png"), stage_rows, tag)
    if sweep_rows is None:
        return ["ratios.png"]
    draw_sweep(os.path.join(out_dir, "sweep.png"), sweep_rows, tag)
    return ["ratios.png", "sweep.png"]

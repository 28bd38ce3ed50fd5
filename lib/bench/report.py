"""A bench's results folder: fps.csv, sweep.csv, bounds.csv, meta.json, the Markdown report
(README.md) and the charts; and the table the bench prints at its end."""

from __future__ import annotations

import csv
import json
import os
import sys

from lib.bench import charts
from lib.bench.bounds import bound_form, part_unit
from lib.bench.markdown import article_ratio, efficiency_text, ratio, render_readme, spread_text
from lib.bench.rounds import part_figures, stage_figures, sweep_figures
from lib.run.stages import ARTICLE_SWEEP, STAGES

FPS_COLUMNS = [
    "stage", "name", "fps", "fps_min", "fps_max", "ratio_to_01", "ratio_min", "ratio_max", "ratio_to_prev",
    "ratio_prev_min", "ratio_prev_max", "article_fps", "article_ratio", "bound_fps", "bound_min", "bound_max",
    "efficiency", "efficiency_min", "efficiency_max", "over_bound", "bound_spread", "unsteady_rounds", "rounds", "train_frames", "seconds", "status",
    "age_mean", "age_min", "age_max", "torn_reads", "forwards",
]  # fmt: skip
SWEEP_COLUMNS = [
    "N", "fps", "fps_min", "fps_max", "ratio_to_N1", "ratio_min", "ratio_max", "article_fps", "article_ratio",
    "rounds", "status",
]  # fmt: skip
BOUNDS_COLUMNS = ["stage", "name", "value", "value_min", "value_max", "spread", "rounds", "unit"]
OUTPUT_FILES = ("fps.csv", "sweep.csv", "bounds.csv", "README.md", "meta.json", "ratios.png", "sweep.png")
DIGITS = {
    "ratio": 3,
    "efficiency": 3,
    "seconds": 1,
    "value": 3,
    "spread": 3,
}  # columns that name one of these; others 2


def _spread_cells(prefix: str, s, median_name: str | None = None) -> dict:
    """A Spread as CSV cells: <median_name or prefix>, <prefix>_min, <prefix>_max."""
    return {median_name or prefix: s and s.median, f"{prefix}_min": s and s.low, f"{prefix}_max": s and s.high}


def fps_rows(figures: list[dict]) -> list[dict]:
    rows = []
    for f in figures:
        stage = STAGES[f["stage"]]
        efficiency = f["efficiency"]
        rows.append(
            {
                "stage": f["stage"],
                "name": stage.name,
                **_spread_cells("fps", f["fps"]),
                **_spread_cells("ratio", f["ratio"], "ratio_to_01"),
                **_spread_cells("ratio_prev", f["ratio_prev"], "ratio_to_prev"),
                "article_fps": stage.article_fps,
                "article_ratio": article_ratio(f["stage"]),
                **_spread_cells("bound", f["bound"], "bound_fps"),
                **_spread_cells("efficiency", efficiency),
                "over_bound": None if efficiency is None else ("yes" if f["over_bound"] else "no"),
                "bound_spread": f["bound_spread"],
                "unsteady_rounds": f["unsteady_rounds"],
                "rounds": f["rounds"],
                "train_frames": f["train_frames"] and int(f["train_frames"].median),
                "seconds": f["seconds"] and f["seconds"].median,
                "status": f["status"],
                "age_mean": f["age"] and f["age"].median,
                "age_min": f["age"] and f["age"].low,
                "age_max": f["age_max"],
                "torn_reads": f["torn_reads"],
                "forwards": f["forwards"],
            }
        )
    return rows


def sweep_rows(figures: list[dict]) -> list[dict]:
    return [
        {
            "N": f["N"],
            **_spread_cells("fps", f["fps"]),
            **_spread_cells("ratio", f["ratio"], "ratio_to_N1"),
            "article_fps": ARTICLE_SWEEP.get(f["N"]),
            "article_ratio": ratio(ARTICLE_SWEEP.get(f["N"]), ARTICLE_SWEEP[1]),
            "rounds": f["rounds"],
            "status": f["status"],
        }
        for f in figures
    ]


def bounds_rows(records: list[dict], figures: list[dict], settings: dict, bounds: dict) -> list[dict]:
    """bounds.csv: each stage's parts and bound over rounds, then the greedy shares."""
    envs = settings["envs"]
    parts = part_figures(records)
    rows = []
    for f in figures:
        form = bound_form(STAGES[f["stage"]], settings["steps"])
        for p in (p for p in parts if p["stage"] == f["stage"] and p["rate"] is not None):
            rows.append(
                {
                    "stage": f["stage"],
                    "name": p["name"],
                    **_spread_cells("value", p["rate"]),
                    "spread": p["spread"],
                    "rounds": p["rate"].n,
                    "unit": part_unit(form, p["name"], envs),
                }
            )
        if f["bound"] is not None:
            rows.append(
                {
                    "stage": f["stage"],
                    "name": f"bound_{f['stage']}",
                    **_spread_cells("value", f["bound"]),
                    "spread": f["bound_spread"],
                    "rounds": f["bound"].n,
                    "unit": "f/s (best this stage could reach here)",
                }
            )
    for key, name, unit in (
        ("greedy", "greedy_fraction", "share of frames acting greedily (g)"),
        ("greedy_any", "greedy_any_of_k", f"share of vector steps with a greedy game among {envs} (g_K)"),
    ):
        if bounds.get(key) is not None:
            rows.append({"stage": "", "name": name, "value": bounds[key], "unit": unit})
    return rows


def _cell(value, digits: int = 2) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _digits(column: str) -> int:
    return next((d for key, d in DIGITS.items() if key in column), 2)


def write_csv(path: str, columns: list[str], rows: list[dict]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        for row in rows:
            writer.writerow([_cell(row.get(c), _digits(c)) for c in columns])


def write_results(out_dir: str, meta: dict, records: list[dict]) -> list[str]:
    """Write the whole results folder; returns the files written. Files of an earlier run that
    this one does not produce are removed, so the folder never mixes two runs."""
    os.makedirs(out_dir, exist_ok=True)
    for name in OUTPUT_FILES:
        if os.path.isfile(os.path.join(out_dir, name)):
            os.remove(os.path.join(out_dir, name))
    settings = meta["settings"]
    figures = stage_figures(records)
    sweep = sweep_figures(records) if settings["sweep"] else None
    write_csv(os.path.join(out_dir, "fps.csv"), FPS_COLUMNS, fps_rows(figures))
    written = ["fps.csv"]
    if sweep is not None:
        write_csv(os.path.join(out_dir, "sweep.csv"), SWEEP_COLUMNS, sweep_rows(sweep))
        written.append("sweep.csv")
    write_csv(
        os.path.join(out_dir, "bounds.csv"), BOUNDS_COLUMNS, bounds_rows(records, figures, settings, meta["bounds"])
    )
    with open(os.path.join(out_dir, "meta.json"), "w") as f:
        json.dump(dict(meta, runs=records), f, indent=2)
    with open(os.path.join(out_dir, "README.md"), "w") as f:
        f.write(render_readme(meta, figures, sweep, records))
    written += ["bounds.csv", "meta.json", "README.md"]
    try:
        written += charts.draw_charts(out_dir, figures, sweep, meta["tag"])
    except (OSError, ValueError, RuntimeError) as e:  # the tables, written already, matter more than the pictures
        print(f"dqn-bench: warning: charts not drawn: {type(e).__name__}: {e}", file=sys.stderr)
    return written


def console_table(records: list[dict]) -> list[str]:
    """The stage table the bench prints at its end, beside the article's figures."""
    lines = [
        f"  {'stage':<18} {'f/s':<20} {'vs 01':<18} {'vs prev':<18} {'article':>7} {'vs 01':>6}  {'of bound':<22} status"
    ]
    for f in stage_figures(records):
        stage = STAGES[f["stage"]]
        article = "—" if stage.article_fps is None else str(stage.article_fps)
        art_ratio = article_ratio(f["stage"])
        efficiency = efficiency_text(f, "ABOVE BOUND")
        lines.append(
            f"  {f['stage'] + ' ' + stage.name:<18} {spread_text(f['fps']):<20} {spread_text(f['ratio'], 2):<18} "
            f"{spread_text(f['ratio_prev'], 2):<18} {article:>7} {'—' if art_ratio is None else f'{art_ratio:.2f}':>6}  "
            f"{efficiency:<22} {f['status']}"
        )
    return lines

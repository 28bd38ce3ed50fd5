"""Learning curves of finished or running training runs, and when each reached a level.

``python -m lib.analysis.curves RUN_DIR [RUN_DIR ...] --out PNG [--levels -15 0 18] [--labels ...] [--seeds]``

Runs are grouped by game (summary.json's, else the folder name's ``<stage>-<game>-seed<N>``): one
row of panels and one table per game, each under its game's name where there are several, and
a run's label then names its game ("stage 01, Breakout"). Each game has its own levels: Pong's
-19 ... 18 for Pong (and for a run whose game is not recorded), none for a game without known
levels (``reference.levels_of``), unless ``--levels`` gives them, for every game.

Reads the TensorBoard event files of each run folder and draws ``reward_100`` (the mean
score of the last 100 games) against frames (agent steps, the scalars' step) and against
wall-clock minutes of training (event wall time minus the writer's start, so that replay
warm-up counts; over a resumed run's sittings as its ``run_seconds`` counts them, the time
between sittings left out: ``lib.analysis.run_folders.stitched``) in two side-by-side panels, one line per
run. A folder without event files of its own stands for its sub-folders that have some (a
``--run-dir`` root).

Lines are labelled by the run's stage from summary.json (written when a run ends), else by
the folder name; ``--labels`` overrides both, in the order the runs are listed. Runs with the
same label (the seeds of one stage) share its colour and differ in their dashes.

``--article`` draws, on Pong's frames panel, the article's frames to solve for the stages it gives
them (``lib.run.stages.article_solve_frames``: stage 01 and stage 05), as shaded spans at the solve
level, and lists them under the table, so that a run is read against the 2017 figures.

It also writes, next to the PNG with the same stem and ``.md``, and prints, a Markdown
table of each run's last point (frames, ``reward_100``) and of the frames and minutes at which
``reward_100`` first rose to (>=) each level from below it, "—" where it never did (the first
points, means of a game or two, reach nothing: ``lib.analysis.run_folders.first_reach``).

``--seeds`` groups the runs by game and stage and draws, per stage, the mean of ``reward_100``
over its seeds with a 95% bootstrap band, with the table of frames and minutes to each level
and a verdict on whether the stages learn alike (``lib.analysis.seed_stats`` says how).

Bad input (a missing folder, a folder with no runs, an output that cannot be written) ends
the program with one line on stderr and exit code 2, as do runs none of which has a point yet.
Runs without points among others are left out, named in one line on stderr and under the table
(200 runs just started would otherwise fill the legend). An event file that cannot be read to
its end (random bytes, a record that fails its checksum; TensorBoard's reader stops there
without a word) is named on stderr and under the table, and the points read before it are
used. This module does not import torch.
"""

from __future__ import annotations

import os
import sys

from lib.analysis import reference
from lib.analysis.run_folders import (
    NEVER,
    TAG,
    find_runs,
    load_curve,
    played_frames,
    resumes,
    run_identity,
    run_label,
    unreadable,
    unreadable_lines,
)
from lib.analysis.seed_stats import mark_resumes, plot_seeds, resume_legend, seed_markdown, seed_stats
from lib.run import cli
from lib.run.cli import UsageError
from lib.run.stages import ARTICLE_HW, ARTICLE_SOLVE_MINUTES, STAGES, article_solve_frames


def markdown_table(rows: list[tuple[str, str, tuple | None, list, list]], levels: list[float]) -> str:
    """rows: (label, folder name, the last point as (frames, reward_100) or None, [first_reach
    result per level], [reward_100 at each of ``reference.AT_FRAMES``, None where the run stopped
    short]). The last point says where a run that never reached a level stands."""
    head = ["run", "folder", "last point: frames", "reward_100 there"]
    for level in levels:
        head += [f"frames to {level:g}", f"minutes to {level:g}"]
    head += [f"reward_100 at {f // 1000}k" for f in reference.AT_FRAMES]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] * 2 + ["---:"] * (len(head) - 2)) + "|"]
    for label, name, last, reached, at in rows:
        cells = [label, name] + ([NEVER, NEVER] if last is None else [str(last[0]), f"{last[1]:.2f}"])
        for hit in reached:
            cells += [NEVER, NEVER] if hit is None else [str(hit[0]), f"{hit[1]:.1f}"]
        cells += [NEVER if v is None else f"{v:.2f}" for v in at]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def reference_row(levels: list[float]) -> tuple:
    """The 2017 run as a row of ``markdown_table`` (its minutes are on its GTX 1080 Ti)."""
    frames, minutes, values = reference.curve()
    reached, at = reference.marks(frames, minutes, values, levels)
    return reference.LABEL, "results/reference-2017-basic-dqn", (frames[-1], values[-1]), reached, at


DASHES = ("-", "--", ":", "-.")  # the first, second, ... run of one label


def article_text() -> str:
    """The article's frames to solve, one line per stage that has them, for under a table."""
    parts = []
    for stage, (low, high) in ARTICLE_SOLVE_MINUTES.items():
        first, last = article_solve_frames(stage)
        parts.append(
            f"stage {stage}: {first:,}-{last:,} frames ({low}-{high} minutes at {STAGES[stage].article_fps} f/s)"
        )
    return f"The article's frames to solve ({ARTICLE_HW}): " + "; ".join(parts) + "."


def draw_article(ax, solve_level: float = 18.0) -> None:
    """The article's frames to solve as shaded spans in a band around ``solve_level`` of ``ax``."""
    for k, stage in enumerate(ARTICLE_SOLVE_MINUTES):
        first, last = article_solve_frames(stage)
        low = solve_level - 1.5 + 1.5 * k  # the two spans overlap in frames: one above the other
        ax.fill_between([first, last], [low, low], [low + 1.5, low + 1.5], color="grey", alpha=0.25 + 0.2 * k,
                        linewidth=0, label=f"article, stage {stage}: {first / 1e3:.0f}k-{last / 1e3:.0f}k frames to solve")  # fmt: skip


def plot(groups: list[tuple[str | None, list, list[float], bool, bool]], out: str) -> None:
    """groups: per game (game, curves, levels, article, with_reference), one row of two panels
    each, the row's y axis naming its game where there are several. curves: (label, frames,
    minutes, reward_100, resumes) per run; each resume is marked at the foot of the frames panel
    (``lib.analysis.seed_stats.mark_resumes``); ``article``: the article's frames to solve on the
    frames panel (``draw_article``); ``with_reference``: the 2017 run's curve on the frames panel
    (``reference.draw``; its minutes are another machine's)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 4.5 * len(groups)), layout="constrained")
    axes = fig.subplots(len(groups), 2, sharey="row", squeeze=False)
    for (by_frames, by_minutes), (game, curves, levels, article, with_reference) in zip(axes, groups):
        kinds, colors, seen = set(), {}, {}
        for label, frames, minutes, values, resumed in curves:
            nth = seen[label] = seen.get(label, -1) + 1
            style = {"color": colors.get(label), "linestyle": DASHES[nth % len(DASHES)]}
            (line,) = by_frames.plot(frames, values, label=label if nth == 0 else None, **style)
            colors[label] = line.get_color()
            by_minutes.plot(minutes, values, label=label if nth == 0 else None, **{**style, "color": colors[label]})
            kinds |= mark_resumes(by_frames, resumed, colors[label])
        resume_legend(by_frames, kinds)
        if article:
            draw_article(by_frames)
        if with_reference:
            reference.draw(by_frames)
        for ax in (by_frames, by_minutes):
            for level in levels:
                ax.axhline(level, color="grey", linewidth=0.6, linestyle=":")
            ax.grid(alpha=0.3)
        by_frames.set_xlabel("frames (agent steps)")
        by_minutes.set_xlabel("wall-clock minutes")
        whose = f"{_game_name(game)}: " if len(groups) > 1 else ""
        by_frames.set_ylabel(f"{whose}reward_100 (mean score of the last 100 games)")
        by_frames.legend(loc="best")
    fig.savefig(out, format="png", dpi=100)


def _check_output(out: str) -> None:
    """The PNG's folder must exist or be creatable, and be writable; nothing is created here."""
    target = os.path.abspath(out)
    if os.path.isdir(target):
        raise UsageError(f"--out {out}: is a folder")
    cli.check_writable_dir(os.path.dirname(target), "--out")


def _parse(argv):
    p = cli.Parser(prog="curves", description="reward_100 against frames and wall-clock minutes, per run")
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run folder, or a folder of run folders")
    p.add_argument("--out", required=True, metavar="PNG", help="the figure; the table goes next to it as .md")
    p.add_argument(
        "--levels",
        nargs="+",
        type=float,
        default=None,
        help="reward_100 levels, for every game (default: each game's own: Pong's -19 ... 18, none for another)",
    )
    p.add_argument("--labels", nargs="+", default=None, help="one label per run, in order")
    p.add_argument(
        "--seeds", action="store_true", help="one line per stage: the mean over its seeds with a 95%% bootstrap band"
    )
    p.add_argument("--article", action="store_true", help="draw and list the article's frames to solve (01, 05)")
    p.add_argument(
        "--no-reference", action="store_true", help="leave out the 2017 basic DQN's run (drawn and tabled for Pong)"
    )
    return p.parse_args(argv)


def _main(argv) -> int:
    args = _parse(argv)
    _check_output(args.out)
    runs = find_runs(args.runs)
    if args.seeds:
        if args.article:
            raise UsageError("--article: draws on the per-run chart, not with --seeds")
        if args.no_reference:
            raise UsageError("--no-reference: with --seeds the 2017 run is drawn for Pong")
        return _seeds_main(args, runs)
    if args.labels is not None and len(args.labels) != len(runs):
        raise UsageError(f"--labels: {len(args.labels)} labels for {len(runs)} runs ({', '.join(runs)})")
    games = [_game(r) for r in runs]
    several = len(set(games)) > 1
    if args.labels is not None:
        labels = args.labels
    else:  # where games differ, a label names its run's game: "stage 01" is in both
        labels = [run_label(r) + (f", {_game_name(g)}" if several else "") for r, g in zip(runs, games)]

    bad = unreadable_lines(unreadable(runs))
    for line in bad:
        print(f"curves: {line}", file=sys.stderr)
    by_game, empty = {}, []  # game -> (curves, rows), in the order the games first come
    for folder, label, game in zip(runs, labels, games):
        frames, minutes, values = load_curve(folder)
        if not frames:
            empty.append(folder)
            continue
        levels = _levels(args, game)
        curves, rows = by_game.setdefault(game, ([], []))
        curves.append((label, frames, minutes, values, resumes(folder)))
        reached, at = reference.marks(frames, minutes, values, levels, played_frames(folder))
        rows.append((label, os.path.basename(os.path.normpath(folder)), (frames[-1], values[-1]), reached, at))
    if not by_game:
        raise UsageError(f"no run has {TAG} points yet: {_names(empty)}")
    if empty:
        bad.append(f"Left out, without {TAG} points yet: {_names(empty)}.")
        print(f"curves: {bad[-1]}", file=sys.stderr)

    notes = [article_text()] if args.article else []
    groups, tables = [], []
    for game, (curves, rows) in by_game.items():
        levels = _levels(args, game)
        pong = game in (reference.GAME, None)
        with_reference = not args.no_reference and pong
        if with_reference:
            rows.append(reference_row(levels))
        groups.append((game, curves, levels, args.article and pong, with_reference))
        table = markdown_table(rows, levels)
        if with_reference:
            table += f"\n\n{reference.LABEL}: its minutes are its own machine's ({reference.FOLDER_NAME})."
        tables.append(f"{_game_name(game)}:\n\n{table}" if len(by_game) > 1 else table)
    text = "\n\n".join([*tables, *notes, *bad])
    return _write(args.out, text, lambda: plot(groups, args.out))


def _levels(args, game: str | None) -> list[float]:
    """``--levels`` where given (for every game), else the game's own (``reference.levels_of``)."""
    return list(args.levels) if args.levels is not None else list(reference.levels_of(game))


def _game(folder: str) -> str | None:
    who = run_identity(folder)
    return who["game"] if who else None


def _game_name(game: str | None) -> str:
    return "game not recorded" if game is None else game.capitalize()


def _names(folders: list[str], most: int = 5) -> str:
    """'a, b, c' of the folders' names; past ``most``, how many more."""
    names = [os.path.basename(os.path.normpath(f)) for f in folders]
    more = f" and {len(names) - most} more" if len(names) > most else ""
    return f"{len(names)} run{'s' if len(names) > 1 else ''} ({', '.join(names[:most])}{more})"


def _write(out: str, text: str, draw) -> int:
    """The figure (``draw`` writes it to ``out``) and the table beside it as .md; both printed."""
    md_path = os.path.splitext(out)[0] + ".md"
    try:
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        draw()
        with open(md_path, "w") as f:
            f.write(text + "\n")
    except OSError as e:
        raise UsageError(f"--out {out}: cannot write ({e.strerror or e})")
    print(text)
    print(f"\nwrote {out} and {md_path}")
    return 0


def _seeds_main(args, runs: list[str]) -> int:
    if args.labels is not None:
        raise UsageError("--labels: with --seeds, lines are labelled by stage")
    games = {_game(r) for r in runs}
    if args.levels is None:  # one set of levels for all the tables: Pong's only where all runs are Pong's
        args.levels = list(reference.levels_of(games.pop())) if len(games) == 1 else []
    stats = seed_stats(runs, args.levels)
    for line in unreadable_lines(stats["unreadable"]):
        print(f"curves: {line}", file=sys.stderr)
    if not stats["groups"]:
        raise UsageError(
            f"--seeds: no stage run among {', '.join(runs)} (no summary.json, no <stage>-<game>-seed<N> name)"
        )
    return _write(args.out, seed_markdown(stats, args.levels), lambda: plot_seeds(stats, args.levels, args.out))


def main(argv=None) -> int:
    try:
        return _main(argv)
    except UsageError as e:
        return cli.usage_exit("curves", e)


if __name__ == "__main__":
    sys.exit(main())

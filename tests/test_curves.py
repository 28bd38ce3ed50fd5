"""lib.analysis.curves: first-reach table from hand-written TensorBoard runs, the PNG with a run's resumes
marked, and bad input."""

import json
import os
import shutil
import time

import pytest
from matplotlib.figure import Figure
from torch.utils.tensorboard import SummaryWriter

from lib.analysis import curves
from lib.analysis.run_folders import event_file_problem
from lib.run import stages

# (frames, reward_100) per run; point k (from 1) is logged k minutes after the writer starts.
RUN_01 = [(1000, -21.0), (2000, -16.0), (3000, -15.0), (4000, -5.0), (5000, 0.5), (6000, 10.0)]
RUN_05 = [(500, -20.0), (1500, -14.0), (2500, 2.0), (3500, 18.0), (4500, 19.0)]
# First reach (>=) of -15, 0, 18, as (frames, minutes):
#   01: -15 at point 3 (3000, 3.0); 0 at point 5 (5000, 5.0); 18 never.
#   05: -15 at point 2 (1500, 2.0); 0 at point 3 (2500, 3.0); 18 at point 4 (3500, 4.0).
EXPECTED = {
    "stage 01": ["3000", "3.0", "5000", "5.0", "—", "—"],
    "stage 05": ["1500", "2.0", "2500", "3.0", "3500", "4.0"],
}


def _write_run(folder, stage, points):
    os.makedirs(folder)
    writer = SummaryWriter(folder)  # writes its first event (the run's time zero) now
    t0 = time.time()
    for k, (step, value) in enumerate(points, start=1):
        writer.add_scalar("reward_100", value, step, walltime=t0 + 60.0 * k)
        writer.add_scalar("reward", value, step, walltime=t0 + 60.0 * k)
    writer.close()
    with open(os.path.join(folder, "summary.json"), "w") as f:
        json.dump({"stage": stage, "game": "pong"}, f)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    parent = tmp_path_factory.mktemp("runs")
    _write_run(str(parent / "01-pong-seed0-20260101-000000"), "01", RUN_01)
    _write_run(str(parent / "05-pong-seed0-20260101-000000"), "05", RUN_05)
    return parent


def _rows(table: str) -> dict:
    rows = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0].startswith("stage"):
            rows[cells[0]] = cells[4:-4]  # the levels' cells; then reward_100 at 100k-400k
    return rows


def _last_points(table: str) -> dict:
    """label -> [last point's frames, reward_100 there]."""
    return {
        cells[0]: cells[2:4]
        for cells in ([c.strip() for c in line.strip().strip("|").split("|")] for line in table.splitlines())
        if cells[0].startswith("stage")
    }


def _exit_code(argv, capsys):
    code = curves.main(argv)
    err = capsys.readouterr().err
    return code, err


def test_parent_folder_png_and_table(runs, tmp_path, capsys):
    out = tmp_path / "fig" / "pong.png"  # a missing folder under a writable one is made
    assert curves.main([str(runs), "--out", str(out), "--levels", "-15", "0", "18"]) == 0
    printed = capsys.readouterr().out
    data = out.read_bytes()
    assert len(data) > 1000 and data[:8] == b"\x89PNG\r\n\x1a\n"
    table = (tmp_path / "fig" / "pong.md").read_text()
    assert table.strip() in printed
    assert "frames to -15 | minutes to -15 | frames to 0 | minutes to 0 | frames to 18 | minutes to 18" in table
    assert _rows(table) == EXPECTED
    # Pong runs are tabled beside the 2017 run: its frames to each level, reward_100 at 100k-400k.
    (row,) = [line for line in table.splitlines() if line.startswith("| 2017 basic DQN")]
    assert row.split(" | ")[4:] == ["245115", "25.5", "467912", "49.5", "827369", "87.4", "-19.22", "-16.86",
                                    "-12.04", "-5.26 |"]  # fmt: skip
    # The last points: 01 at (6000, 10.0), 05 at (4500, 19.0).
    assert _last_points(table) == {"stage 01": ["6000", "10.00"], "stage 05": ["4500", "19.00"]}


def test_run_folders_levels_and_labels(runs, tmp_path, capsys):
    out = tmp_path / "two.png"
    folders = [str(runs / "05-pong-seed0-20260101-000000"), str(runs / "01-pong-seed0-20260101-000000")]
    assert curves.main(folders + ["--out", str(out), "--levels", "-14", "--labels", "stage B", "stage A"]) == 0
    table = (tmp_path / "two.md").read_text()
    # -14: run 05 at (1500, 2.0); run 01 at (4000, 4.0).
    assert _rows(table) == {"stage B": ["1500", "2.0"], "stage A": ["4000", "4.0"]}
    assert table.index("stage B") < table.index("stage A")  # order as given


def test_label_falls_back_to_folder_name(tmp_path, capsys):
    folder = tmp_path / "no-summary"
    _write_run(str(folder), "01", RUN_01)
    os.remove(folder / "summary.json")
    assert curves.main([str(folder), "--out", str(tmp_path / "x.png"), "--levels", "-15", "0", "18"]) == 0
    assert "| no-summary | no-summary | 6000 | 10.00 | 3000 |" in capsys.readouterr().out


@pytest.mark.parametrize(
    "case", ["missing folder", "no runs", "output under a file", "output is a folder", "labels count", "no --out"]
)
def test_bad_input_exits_2_with_one_line(case, runs, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    (tmp_path / "a-file").write_text("x")
    argv = {
        "missing folder": [str(tmp_path / "nope"), "--out", str(tmp_path / "x.png")],
        "no runs": [str(tmp_path / "empty"), "--out", str(tmp_path / "x.png")],
        "output under a file": [str(runs), "--out", str(tmp_path / "a-file" / "x.png")],
        "output is a folder": [str(runs), "--out", str(tmp_path)],
        "labels count": [str(runs), "--out", str(tmp_path / "x.png"), "--labels", "one"],
        "no --out": [str(runs)],
    }[case]
    code, err = _exit_code(argv, capsys)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and err.startswith("curves: error: ")
    assert not (tmp_path / "x.png").exists()


def test_runs_without_points_are_left_out_in_one_line(runs, tmp_path, capsys):
    """Seven runs just started (an event file, no reward_100 yet) beside two with points: the
    chart and table hold the two, and one line says which were left out (they used to get a
    line each on stderr and in the legend). Runs none of which has a point: one line, exit 2."""
    parent = tmp_path / "runs"
    shutil.copytree(runs, parent)
    for seed in range(7):
        SummaryWriter(str(parent / f"03-pong-seed{seed}-x")).close()
    assert curves.main([str(parent), "--out", str(tmp_path / "x.png"), "--levels", "-15", "0", "18"]) == 0
    captured = capsys.readouterr()
    line = "Left out, without reward_100 points yet: 7 runs (03-pong-seed0-x, 03-pong-seed1-x, 03-pong-seed2-x, "
    line += "03-pong-seed3-x, 03-pong-seed4-x and 2 more)."
    assert captured.err == f"curves: {line}\n"
    table = (tmp_path / "x.md").read_text()
    assert _rows(table) == EXPECTED and line in table
    code, err = _exit_code([str(parent / "03-pong-seed0-x"), str(parent / "03-pong-seed1-x"), "--out",
                            str(tmp_path / "y.png")], capsys)  # fmt: skip
    assert (
        code == 2
        and err == "curves: error: no run has reward_100 points yet: 2 runs (03-pong-seed0-x, 03-pong-seed1-x)\n"
    )
    assert not (tmp_path / "y.png").exists()


def test_unreadable_event_files_are_named_and_the_rest_is_drawn(runs, tmp_path, capsys):
    """TensorBoard's reader stops at a bad record without a word; curves names the file."""
    parent = tmp_path / "runs"
    shutil.copytree(runs, parent)
    noise = parent / "07-pong-seed0-x" / "events.out.tfevents.1.host.1.0"
    noise.parent.mkdir()
    noise.write_bytes(os.urandom(3000))
    good = parent / "01-pong-seed0-20260101-000000"
    events = next(good.glob("events.out.tfevents.*"))
    whole = events.read_bytes()
    events.write_bytes(whole + os.urandom(40))  # readable records, then a bad one
    cut = parent / "05-pong-seed0-20260101-000000"
    half = next(cut.glob("events.out.tfevents.*"))
    half.write_bytes(half.read_bytes()[:-5])  # a last record cut short: a run still writing it

    assert event_file_problem(str(noise)).startswith("is not an event file (failed header crc32 check")
    assert event_file_problem(str(events)).startswith("cannot be read past record 13")
    assert event_file_problem(str(half)) is None
    out = tmp_path / "all.png"
    assert curves.main([str(parent), "--out", str(out), "--levels", "-15", "0", "18"]) == 0
    err = capsys.readouterr().err
    assert f"curves: Not read: {noise} is not an event file" in err
    assert f"curves: Not read: {events} cannot be read past record 13" in err and str(half) not in err
    table = (tmp_path / "all.md").read_text()
    assert f"Not read: {noise}" in table and _rows(table)["stage 01"] == EXPECTED["stage 01"]
    assert curves.main([str(parent), "--out", str(tmp_path / "seeds.png"), "--seeds"]) == 0
    assert f"Not read: {noise} is not an event file" in (tmp_path / "seeds.md").read_text()


def _resume(folder, frame, ring, points):
    """A sitting that resumes the run in ``folder`` from ``frame`` (the writer's purge step is
    the frame after it, as lib.run.runner makes it) and logs ``points``; ``ring``: the resume_ring
    scalar lib.run.checkpoint logs (1: the ring came back, 0: refilled), None for none."""
    writer = SummaryWriter(str(folder), purge_step=frame + 1)
    if ring is not None:
        writer.add_scalar("resume_ring", ring, frame)
    for step, value in points:
        writer.add_scalar("reward_100", value, step)
    writer.close()


@pytest.fixture
def figures(monkeypatch):
    """Each figure lib.analysis.curves saves, kept for its artists to be read."""
    saved = []
    savefig = Figure.savefig

    def keep(self, *args, **kwargs):
        saved.append(self)
        return savefig(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep)
    return saved


def _marks(fig) -> dict:
    """gid -> frames of the resume marks on the figure's frames panels, and the legend's texts."""
    marks, legend = {}, []
    for ax in fig.axes:
        if "frames" not in ax.get_xlabel():
            continue
        for line in ax.get_lines():
            if (line.get_gid() or "").startswith("resume-"):
                marks.setdefault(line.get_gid(), []).extend(int(x) for x in line.get_xdata())
        if ax.get_legend():
            legend += [t.get_text() for t in ax.get_legend().get_texts()]
    return {"marks": marks, "legend": legend}


def test_the_curves_mark_each_resume_and_whether_its_ring_came_back(tmp_path, figures):
    run = tmp_path / "08-pong-seed0-x"
    _write_run(str(run), "08", RUN_01[:2])
    _resume(run, 2000, 1.0, RUN_01[2:4])  # went on with its replay ring
    _resume(run, 4000, 0.0, RUN_01[4:])  # refilled its buffer
    other = tmp_path / "08-pong-seed1-x"
    _write_run(str(other), "08", RUN_05[:3])
    _resume(other, 2500, None, RUN_05[3:])  # an older sitting: the ring is known from the sweep's run.log
    (other / "run.log").write_text("resuming 08 pong at frame 2500: the replay buffer is refilled with 10000 "
                                   "transitions before training goes on\n")  # fmt: skip

    assert curves.main([str(run), str(other), "--out", str(tmp_path / "runs.png")]) == 0
    drawn = _marks(figures[-1])
    assert drawn["marks"] == {"resume-ring": [2000], "resume-refilled": [4000, 2500]}
    assert "resumed with its replay ring" in drawn["legend"] and "resumed, replay buffer refilled" in drawn["legend"]
    # The mean over seeds (a sweep's curves.png) marks each seed's resumes too.
    assert curves.main([str(run), str(other), "--out", str(tmp_path / "seeds.png"), "--seeds"]) == 0
    drawn = _marks(figures[-1])
    assert drawn["marks"] == {"resume-ring": [2000], "resume-refilled": [4000, 2500]}
    # A run never resumed has no mark, and no legend entry for one.
    plain = tmp_path / "01-pong-seed0-x"
    _write_run(str(plain), "01", RUN_01)
    assert curves.main([str(plain), "--out", str(tmp_path / "plain.png"), "--no-reference"]) == 0
    assert _marks(figures[-1]) == {"marks": {}, "legend": ["stage 01"]}


def test_article_frames_to_solve_are_its_minutes_at_its_fps():
    # 01: 60-90 minutes at 154 f/s = 554,400-831,600 frames; 05: 20-30 minutes at 484 f/s = 580,800-871,200.
    assert stages.article_solve_frames("01") == (554_400, 831_600)
    assert stages.article_solve_frames("05") == (580_800, 871_200)
    with pytest.raises(KeyError):
        stages.article_solve_frames("08")  # the article has no stage 08


def test_article_spans_and_seeds_of_a_stage_share_a_colour(runs, tmp_path, figures, capsys):
    other = tmp_path / "01-pong-seed1-x"
    _write_run(str(other), "01", RUN_05)
    out = tmp_path / "cmp.png"
    assert curves.main([str(runs), str(other), "--article", "--out", str(out)]) == 0
    table = (tmp_path / "cmp.md").read_text()
    assert "stage 01: 554,400-831,600 frames (60-90 minutes at 154 f/s)" in table
    assert "stage 05: 580,800-871,200 frames (20-30 minutes at 484 f/s)" in table
    frames_ax = next(ax for ax in figures[-1].axes if "frames" in ax.get_xlabel())
    spans = [c for c in frames_ax.collections if "article" in (c.get_label() or "")]
    assert sorted(tuple(round(x) for x in c.get_paths()[0].get_extents().intervalx) for c in spans) == [
        (554_400, 831_600),
        (580_800, 871_200),
    ]
    lines = {}
    for line in frames_ax.get_lines():
        gid = line.get_gid() or ""
        if not gid.startswith("resume-") and gid != "reference" and line.get_color() != "grey":  # a run's line
            lines.setdefault(line.get_color(), []).append(line.get_linestyle())
    # Two runs of stage 01 (one colour, solid then dashed) and one of stage 05 (its own colour).
    assert sorted(lines.values()) == [["-"], ["-", "--"]]
    # Without --article no span is drawn, and with --seeds it is refused in one line.
    assert curves.main([str(runs), "--out", str(tmp_path / "plain.png")]) == 0
    assert not [c for ax in figures[-1].axes for c in ax.collections if "article" in (c.get_label() or "")]
    code, err = _exit_code([str(runs), "--article", "--seeds", "--out", str(tmp_path / "s.png")], capsys)
    assert code == 2 and err.count("\n") == 1 and "--article" in err


def test_the_default_levels_and_frames_and_the_2017_line(runs, tmp_path, capsys):
    """By default the levels -19, -15, 0, 10, 15, 18 and reward_100 at 100k-400k; the 2017 run is a
    line of the frames panel; --no-reference leaves it out of both."""
    out = tmp_path / "d.png"
    assert curves.main([str(runs), "--out", str(out)]) == 0
    table = (tmp_path / "d.md").read_text()
    head = table.splitlines()[0]
    assert [f"frames to {level}" for level in ("-19", "-15", "0", "10", "15", "18")] == [
        cell.strip() for cell in head.split("|") if cell.strip().startswith("frames to")
    ]
    assert head.endswith("| reward_100 at 100k | reward_100 at 200k | reward_100 at 300k | reward_100 at 400k |")
    # Stage 01 stopped at 6,000 frames: no reward_100 at 100k.
    assert [line for line in table.splitlines() if line.startswith("| stage 01")][0].endswith("| — | — | — | — |")
    assert (
        "| 2017 basic DQN (1 run, GTX 1080 Ti) | results/reference-2017-basic-dqn | 827369 | 18.02 | 114344 |" in table
    )
    drawn = []
    real = curves.reference.draw
    curves.reference.draw = lambda ax: (drawn.append(ax), real(ax))
    try:
        assert curves.main([str(runs), "--out", str(out)]) == 0
        assert len(drawn) == 1 and "2017 basic DQN (1 run, GTX 1080 Ti)" in [
            t.get_text() for t in drawn[0].get_legend().get_texts()
        ]
        assert curves.main([str(runs), "--out", str(out), "--no-reference"]) == 0
        assert len(drawn) == 1 and "2017 basic DQN" not in (tmp_path / "d.md").read_text()
    finally:
        curves.reference.draw = real


def _write_game_run(folder, stage, game, points):
    _write_run(folder, stage, points)
    with open(os.path.join(folder, "summary.json"), "w") as f:
        json.dump({"stage": stage, "game": game, "seed": 0}, f)


def test_a_pong_and_a_breakout_run_are_drawn_and_tabled_per_game(tmp_path, figures, capsys):
    """One folder, a Pong run and a Breakout run, both stage 01: a table and a row of panels per
    game, labels that name the game, Pong's levels and the 2017 line for Pong only."""
    parent = tmp_path / "runs"
    _write_game_run(str(parent / "01-pong-seed0-x"), "01", "pong", RUN_01)
    _write_game_run(str(parent / "01-breakout-seed0-x"), "01", "breakout", [(1000, 1.0), (2000, 4.0), (3000, 9.0)])
    assert curves.main([str(parent), "--out", str(tmp_path / "g.png")]) == 0
    table = (tmp_path / "g.md").read_text()
    breakout, pong = table.split("Breakout:")[1].split("Pong:")
    # Breakout: no levels of its own, so no "frames to" columns, and no 2017 run.
    assert "| stage 01, Breakout | 01-breakout-seed0-x | 3000 | 9.00 |" in breakout
    assert "frames to" not in breakout and "2017" not in breakout
    assert (
        "| stage 01, Pong | 01-pong-seed0-x | 6000 | 10.00 | 2000 | 2.0 | 3000 | 3.0 | 5000 | 5.0 | 6000 | 6.0 |"
        in pong
    )
    assert "frames to -19" in pong and "| 2017 basic DQN" in pong
    fig = figures[-1]
    rows = [ax for ax in fig.axes if "frames" in ax.get_xlabel()]
    assert [ax.get_ylabel().split(":")[0] for ax in rows] == ["Breakout", "Pong"]
    legends = [[t.get_text() for t in ax.get_legend().get_texts()] for ax in rows]
    assert legends == [["stage 01, Breakout"], ["stage 01, Pong", "2017 basic DQN (1 run, GTX 1080 Ti)"]]
    levels = [sorted(line.get_ydata()[0] for line in ax.get_lines() if line.get_color() == "grey") for ax in rows]
    assert levels == [[], [-19.0, -15.0, 0.0, 10.0, 15.0, 18.0]]
    # Levels given by the flag are every game's.
    assert curves.main([str(parent), "--out", str(tmp_path / "h.png"), "--levels", "5"]) == 0
    table = (tmp_path / "h.md").read_text()
    assert "| stage 01, Breakout | 01-breakout-seed0-x | 3000 | 9.00 | 3000 | 3.0 |" in table
    assert "| stage 01, Pong | 01-pong-seed0-x | 6000 | 10.00 | 6000 | 6.0 |" in table

"""lib.analysis.seed_stats: the mean band over seeds, frames and minutes to each level with intervals, the
permutation test and the verdict, from hand-written TensorBoard runs."""

import json

import pytest

from lib.analysis import curves, seed_stats
from lib.analysis.run_folders import find_runs
from tests.test_curves import _write_run

# Three seeds whose reward_100 lies 3 apart at every point: at each point the mean is the middle
# seed's value. Resampling 3 seeds, all three draws are the lowest seed with probability 1/27
# (3.7% > 2.5%), so the 2.5th percentile of the resampled means is the lowest seed's value and,
# likewise, the 97.5th is the highest's: the band is [lowest, highest].
SEEDS = {
    0: [(100, -21.0), (200, -20.0), (300, -15.0), (400, -10.0)],
    1: [(100, -18.0), (200, -17.0), (300, -12.0), (400, -7.0)],
    2: [(100, -15.0), (200, -14.0), (300, -9.0), (400, -4.0)],
}


def _xy(points):
    return [p[0] for p in points], [p[1] for p in points]


def test_seed_band_known_mean_and_band():
    grid, mean, lo, hi = seed_stats.seed_band([(*_xy(SEEDS[s]), False) for s in SEEDS], points=7)
    assert list(grid) == [100, 150, 200, 250, 300, 350, 400]
    # A curve is a step: at 150 each seed still has its value of 100.
    assert list(mean) == [-18.0, -18.0, -17.0, -17.0, -12.0, -12.0, -7.0]
    assert list(lo) == [-21.0, -21.0, -20.0, -20.0, -15.0, -15.0, -10.0]
    assert list(hi) == [-15.0, -15.0, -14.0, -14.0, -9.0, -9.0, -4.0]


def test_seed_band_common_stretch_and_solved_runs_hold():
    short = _xy(SEEDS[2][:3])  # still running: its curve stops at 300
    grid, mean, _, _ = seed_stats.seed_band([(*_xy(SEEDS[0]), False), (*short, False)], points=3)
    assert list(grid) == [100, 200, 300] and list(mean) == [-18.0, -17.0, -12.0]
    # Solved at 300: its -9 stands until the other seed's last point.
    grid, mean, lo, hi = seed_stats.seed_band([(*_xy(SEEDS[0]), False), (*short, True)], points=4)
    assert list(grid) == [100, 200, 300, 400] and list(mean) == [-18.0, -17.0, -12.0, -9.5]
    assert (lo[-1], hi[-1]) == (-10.0, -9.0)  # two seeds: the band spans both
    # No stretch in common: no band.
    late = ([500, 600], [-5.0, 0.0], False)
    assert seed_stats.seed_band([(*_xy(SEEDS[0]), False), late]) is None


def _point_runs(parent, stage, per_seed):
    for seed, points in enumerate(per_seed):
        folder = parent / f"{stage}-pong-seed{seed}-20260101-000000"
        _write_run(str(folder), stage, points)
        (folder / "summary.json").write_text(json.dumps({"stage": stage, "game": "pong", "seed": seed}))


def _seed_runs(parent, stage, reach_frames):
    """One run per seed: -21 at frame 500 (minute 1), -15 at the seed's frame (minute 2), 0 at
    500 frames after it (minute 3)."""
    _point_runs(parent, stage, [[(500, -21.0), (frames, -15.0), (frames + 500, 0.0)] for frames in reach_frames])


def _seed_rows(table):
    rows = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| stage 0"):
            rows.setdefault(cells[0], cells[1:])  # the frames-to-level table's, not reward_100 at 100k-400k
    return rows


def test_seeds_table_intervals_and_verdict_of_three_seeds(tmp_path, capsys):
    _seed_runs(tmp_path / "runs", "01", [1000, 2000, 3000])
    _seed_runs(tmp_path / "runs", "05", [1500, 2500, 3500])
    out = tmp_path / "seed_stats.png"
    assert curves.main([str(tmp_path / "runs"), "--out", str(out), "--seeds", "--levels", "-15", "0", "18"]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = (tmp_path / "seed_stats.md").read_text()
    assert text.strip() in capsys.readouterr().out
    # 01: -15 at 1000, 2000, 3000 (mean 2000; the band spans the lowest to the highest, as above),
    # each at minute 2; 0 at 1500, 2500, 3500, minute 3; 18 never. 05: the same, 500 frames later.
    assert _seed_rows(text) == {
        "stage 01": ["0,1,2", "2000 [1000, 3000]", "2.0 [2.0, 2.0]", "2500 [1500, 3500]", "3.0 [3.0, 3.0]", "—", "—"],
        "stage 05": ["0,1,2", "2500 [1500, 3500]", "2.0 [2.0, 2.0]", "3000 [2000, 4000]", "3.0 [3.0, 3.0]", "—", "—"],
    }
    # Pong's runs beside the 2017 run: its frames and minutes to each level, its reward_100 at
    # 100k-400k, under which our runs (stopped within 5,000 frames) have none.
    assert "| 2017 basic DQN (1 run, GTX 1080 Ti) | one run | 245115 | 25.5 | 467912 | 49.5 | 827369 | 87.4 |" in text
    assert "| stage 01 | 0,1,2 | — | — | — | — |" in text
    assert "| 2017 basic DQN (1 run, GTX 1080 Ti) | one run | -19.2 | -16.9 | -12.0 | -5.3 |" in text
    # Frames to -15 (and to 0, 500 later): 01 has 1000, 2000, 3000, 05 has 1500, 2500, 3500. Of
    # the 20 ways to split the six, 14 put means at least 500 apart (a group summing to at most
    # 6000 or at least 7500): p = 0.7. Three seeds a stage never give a p below 2/20.
    assert text.strip().endswith(
        "Verdict (pong): cannot tell: 3/3 seeds are too few for a permutation test to show a difference (the "
        "least p they allow is 0.10, the test needs 0.025); in frames to reach -15 and frames to reach 0, the "
        "smallest p is 0.70."
    )


def test_permutation_p_exact_and_sampled():
    # Every split of 1, 2, 3 | 11, 12, 13: only the split itself and its mirror are as far apart.
    assert seed_stats.permutation_p([1, 2, 3], [11, 12, 13]) == pytest.approx(2 / 20)
    assert seed_stats.smallest_p(3, 3) == pytest.approx(0.1) and seed_stats.smallest_p(5, 5) == pytest.approx(2 / 252)
    assert seed_stats.permutation_p([5, 5], [5, 5]) == 1.0
    # 12 + 12 seeds: 2.7 million splits, so random ones; groups far apart still give p near 0.
    p = seed_stats.permutation_p(list(range(12)), [v + 100 for v in range(12)])
    assert p == pytest.approx(1 / (seed_stats.PERMUTATIONS + 1))
    assert 0.2 < seed_stats.permutation_p(list(range(12)), [v + 1 for v in range(12)]) < 1.0


def test_seeds_verdict_alike(tmp_path):
    # Five seeds a stage, 05 500 frames behind 01 at both levels: p = 0.69 (174 of the 252 splits
    # are as far apart), far above 0.025.
    _seed_runs(tmp_path / "runs", "01", [1000, 2000, 3000, 4000, 5000])
    _seed_runs(tmp_path / "runs", "05", [1500, 2500, 3500, 4500, 5500])
    stats = seed_stats.seed_stats(find_runs([str(tmp_path / "runs")]), [-15.0, 0.0])
    assert seed_stats.verdict(stats, "pong", [-15.0, 0.0]) == (
        "Verdict (pong): stages 01, 05 learn alike per frame as far as these seeds show: in frames to reach -15 and "
        "frames to reach 0, no difference passes a permutation test at 0.05 (smallest p 0.69)."
    )


def test_seeds_verdict_differ_and_partial_levels(tmp_path):
    # Five seeds a stage: 2 of the 252 splits are as far apart as 01's and 06's, p = 0.008, below
    # 0.025 (0.05 over two levels).
    _seed_runs(tmp_path / "runs", "01", [1000, 2000, 3000, 4000, 5000])
    _seed_runs(tmp_path / "runs", "06", [11000, 12000, 13000, 14000, 15000])
    stats = seed_stats.seed_stats(find_runs([str(tmp_path / "runs")]), [-15.0, 0.0])
    assert seed_stats.verdict(stats, "pong", [-15.0, 0.0]) == (
        "Verdict (pong): the stages differ per frame: frames to reach -15, stage 01 3000.0 and stage 06 13000.0 "
        "(means over seeds), permutation test p = 0.008, below 0.025 (0.05 shared by 2 comparison(s))."
    )
    # Three seeds a stage as far apart are not enough: p = 0.1 is the least they can give.
    assert seed_stats.permutation_p([1000, 2000, 3000], [11000, 12000, 13000]) == pytest.approx(0.1)
    # One seed of 06 never reached 0: 0 is not compared, and its cell says how many did.
    folder = tmp_path / "runs" / "06-pong-seed2-20260101-000000"
    for f in folder.iterdir():
        f.unlink()
    folder.rmdir()
    _write_run(str(folder), "06", [(500, -21.0), (7000, -15.0)])
    stats = seed_stats.seed_stats(find_runs([str(tmp_path / "runs")]), [-15.0, 0.0])
    assert stats["groups"][("pong", "06")]["levels"][0.0]["reached"] == 4
    assert "| 4/5 seeds |" in seed_stats.seed_markdown(stats, [-15.0, 0.0])
    assert seed_stats.verdict(stats, "pong", [-15.0, 0.0]).endswith("(0: not reached by every seed, not compared).")


def test_seeds_verdict_at_the_most_frames_every_run_reached(tmp_path):
    # No seed reaches -15. The runs' last points: 06 at 3000, 2500, 2000; 07 at 2600, 1900, 2100:
    # every run has reached 1900 frames. There 06 has -19, -18, -21 and 07 -19, -18, -20.
    runs = tmp_path / "runs"
    _point_runs(runs, "06", [[(500, -21.0), (1500, -19.0), (3000, -17.0)],
                             [(500, -21.0), (1500, -18.0), (2500, -16.0)],
                             [(500, -21.0), (2000, -20.0)]])  # fmt: skip
    _point_runs(runs, "07", [[(500, -21.0), (1800, -19.0), (2600, -17.0)],
                             [(700, -21.0), (1900, -18.0)],
                             [(600, -20.0), (2100, -19.0)]])  # fmt: skip
    stats = seed_stats.seed_stats(find_runs([str(runs)]), [-15.0])
    assert seed_stats.at_common_frame(stats, "pong") == (
        1900,
        {"06": [-19.0, -18.0, -21.0], "07": [-19.0, -18.0, -20.0]},
    )
    text = seed_stats.seed_markdown(stats, [-15.0])
    assert (
        "reward_100 at 1900 frames, the most every run has reached (mean [95% interval]): "
        "stage 06 -19.3 [-21.0, -18.0]; stage 07 -19.0 [-20.0, -18.0]."
    ) in text
    # No level was reached by every seed: the verdict tests reward_100 at 1900 frames (means
    # -19.33 and -19.0: whole scores, so every split of the six has means at least 1/3 apart).
    assert text.endswith(
        "Verdict (pong): cannot tell: 3/3 seeds are too few for a permutation test to show a difference (the "
        "least p they allow is 0.10, the test needs 0.05); in reward_100 at 1900 frames, the smallest p is 1.00; "
        "no level was reached by every seed of every stage."
    )
    # Five seeds a stage, 07 well ahead at 1900 frames: they differ there.
    ahead = tmp_path / "ahead"
    _point_runs(ahead, "06", [[(500, -21.0), (2000, v)] for v in (-21.0, -20.5, -20.0, -19.5, -19.0)])
    _point_runs(ahead, "07", [[(500, -21.0), (1900, v), (2500, v)] for v in (-12.0, -11.0, -10.0, -9.0, -8.0)])
    stats = seed_stats.seed_stats(find_runs([str(ahead)]), [-15.0])
    assert seed_stats.verdict(stats, "pong", [-15.0]) == (
        "Verdict (pong): the stages differ per frame: reward_100 at 2000 frames, stage 06 -20.0 and stage 07 -10.0 "
        "(means over seeds), permutation test p = 0.008, below 0.05 (0.05 shared by 1 comparison(s)); no level was "
        "reached by every seed of every stage (-15: not reached by every seed, not compared)."
    )
    # A stage with a seed that has no curve yet: no frame in common, no line.
    folder = runs / "07-pong-seed3-20260101-000000"
    _write_run(str(folder), "07", [])
    (folder / "summary.json").write_text(json.dumps({"stage": "07", "game": "pong", "seed": 3}))
    stats = seed_stats.seed_stats(find_runs([str(runs)]), [-15.0])
    assert seed_stats.at_common_frame(stats, "pong") is None
    assert "the most every run has reached" not in seed_stats.seed_markdown(stats, [-15.0])

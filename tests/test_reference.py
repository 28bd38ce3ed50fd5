"""The 2017 basic DQN's log (lib.analysis.reference): read as it was logged, its levels as its README gives them."""

from __future__ import annotations

import pytest

from lib.analysis import reference
from lib.analysis.run_folders import first_reach


def test_the_2017_log_reaches_each_level_where_its_readme_says():
    frames, minutes, values = reference.curve()
    assert len(frames) == 376 and frames[-1] == 827_369 and values[-1] == pytest.approx(18.02)
    assert list(frames) == sorted(frames)
    # The first game at or above each level, by hand from log.csv: -19 at game 94 (114,344
    # frames), -15 at 245,115, 0 at 467,912, 10 at 601,908, 15 at 701,529, 18 at the last game.
    reached = [first_reach(frames, minutes, values, level)[0] for level in reference.LEVELS]
    assert reached == [114_344, 245_115, 467_912, 601_908, 701_529, 827_369]
    at = [reference.value_at(frames, values, f) for f in reference.AT_FRAMES]
    assert at == pytest.approx([-19.221, -16.86, -12.04, -5.26])
    # Minutes from each game's frames over its logged speed: about 87 at 155-160 f/s.
    assert 85 < minutes[-1] < 90 and minutes == tuple(sorted(minutes))


def test_value_at_a_frame_the_run_did_not_reach_is_none():
    frames, values = [1_000, 2_000, 3_000], [-21.0, -20.5, -20.0]
    assert reference.value_at(frames, values, 500) is None  # before the first game ended
    assert reference.value_at(frames, values, 2_500) == -20.5
    assert reference.value_at(frames, values, 3_500) is None  # stopped at its last game
    assert reference.value_at(frames, values, 3_500, reached=4_000) == -20.0  # played on to 4,000


def test_place_counts_the_runs_strictly_ahead_and_leaves_out_those_it_cannot_place():
    # Frames to a level: fewer is ahead. Runs at 230k, 269k, 399k; one never reached it in 400k
    # (behind the 2017 run's 245k); one stopped at 200k without it (cannot be placed).
    theirs = [reference.frames_or_later(r, played, 245_115) for r, played in
              [(230_130, 400_000), (269_425, 400_000), (399_351, 400_000), (None, 400_000), (None, 200_000)]]  # fmt: skip
    assert theirs[3] == float("inf") and theirs[4] is None
    assert reference.place(245_115, theirs, higher_is_better=False) == (2, 5)
    # reward_100 at a frame: higher is ahead; a tie is not ahead; a run without the figure is left out.
    assert reference.place(-5.3, [-3.3, 3.5, -5.5, -5.3, None], higher_is_better=True) == (3, 5)
    assert reference.place(-5.3, [None], higher_is_better=True) is None
    assert reference.place(None, [1.0], higher_is_better=True) is None

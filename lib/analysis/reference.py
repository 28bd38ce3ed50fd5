"""The 2017 basic DQN's own training log, as a curve to hold every Pong run against.

``results/reference-2017-basic-dqn/log.csv`` (provenance in that folder's README.md): one run
of the article's basic loop (one env step, one Adam step on 32 transitions, the ptan 2017
wrappers, the hyperparameters of ``lib.params`` for Pong) on a GTX 1080 Ti in November 2017, one
row per finished game: the agent steps at that game's end ("frames"), the games so far,
reward_100 (the mean of the last 100 games; of all games so far before the 100th), speed in
agent steps per second, epsilon. It ends at its solve: 18.02 at 827,369 frames.

``curve()`` gives it in the form ``lib.analysis.run_folders.load_curve`` gives a run (frames, minutes, reward_100),
its minutes summed from each game's frames over that game's logged speed, so that the curves,
the seed tables and the sweeps draw and table it beside our runs. One run, one unrecorded seed:
it is a point of comparison, not a distribution. This module does not import torch.
"""

from __future__ import annotations

import bisect
import csv
import functools
import os

from lib.analysis.run_folders import first_reach

FOLDER_NAME = "results/reference-2017-basic-dqn"  # its provenance; the log (``log.csv`` there) is a link to PATH
# The log travels with the package, so that an installed copy draws it too.
PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "reference-2017-basic-dqn.csv")
GAME = "pong"  # the game it ran
LABEL = "2017 basic DQN (1 run, GTX 1080 Ti)"
LEVELS = (-19.0, -15.0, 0.0, 10.0, 15.0, 18.0)  # reward_100 levels the learning tables give frames to
GAME_LEVELS = {GAME: LEVELS}  # each game's own levels; a game not here has none unless given


def levels_of(game: str | None) -> tuple[float, ...]:
    """The reward_100 levels known for ``game`` (None: a run whose game is not recorded, read as
    the benchmark's game, Pong); () for a game without known levels (Pong's -19 ... 18 mean
    nothing on Breakout's scale)."""
    return GAME_LEVELS.get(GAME if game is None else game, ())


AT_FRAMES = (100_000, 200_000, 300_000, 400_000)  # frames at which they give reward_100


@functools.lru_cache(maxsize=1)
def curve(path: str = PATH) -> tuple[tuple[int, ...], tuple[float, ...], tuple[float, ...]]:
    """(frames, minutes, reward_100), one point per game, as the log has them."""
    frames, minutes, values = [], [], []
    seconds, last = 0.0, 0
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            frame, speed = int(row["frames"]), float(row["speed_fps"])
            seconds += (frame - last) / speed if speed > 0 else 0.0
            last = frame
            frames.append(frame)
            minutes.append(seconds / 60)
            values.append(float(row["reward_100"]))
    return tuple(frames), tuple(minutes), tuple(values)


def value_at(frames, values, frame: int, reached: int | None = None) -> float | None:
    """reward_100 of the last point at or before ``frame``; None before the first point, or where
    the run stopped short of ``frame`` (``reached``: the frames it played, by default its last
    point's: a run stopped at 400,000 frames logs its last game a little before that)."""
    if not frames or (frames[-1] if reached is None else reached) < frame:
        return None
    at = bisect.bisect_right(frames, frame) - 1
    return values[at] if at >= 0 else None


def marks(frames, minutes, values, levels, played: int | None = None) -> tuple[list, list]:
    """What the learning tables give of a curve (a run's or ``curve()``): the first (frames,
    minutes) at or above each of ``levels`` (None where never), and reward_100 at each of
    ``AT_FRAMES`` (``value_at``; ``played``: the frames the run played)."""
    reached = [first_reach(frames, minutes, values, level) for level in levels]
    return reached, [value_at(frames, values, f, played) for f in AT_FRAMES]


def place(ours, theirs, higher_is_better: bool) -> tuple[int, int] | None:
    """Where ``ours`` (the 2017 run's figure) stands among ``theirs`` (each run's; None where a run
    cannot be placed, e.g. stopped before the figure without reaching it): (1 + the runs strictly
    ahead of it, 1 + the runs placed), or None where none is. Were the 2017 run one more seed of
    those runs, it would stand at that place or better by chance place / (runs + 1)."""
    placed = [t for t in theirs if t is not None]
    if ours is None or not placed:
        return None
    ahead = sum(t > ours if higher_is_better else t < ours for t in placed)
    return 1 + ahead, 1 + len(placed)


def frames_or_later(reached, played: int | None, ours: int | None) -> float | None:
    """A run's frames to a level, for ``place``: where it first reached it; infinity where it never
    did but played at least the 2017 run's frames to it (it is behind); None where it stopped
    short of them (it cannot be placed)."""
    if reached is not None:
        return reached
    return float("inf") if ours is not None and played is not None and played >= ours else None


def draw(ax) -> None:
    """Its reward_100 against frames on ``ax``, in black, as a line of its own."""
    frames, _, values = curve()
    ax.plot(frames, values, color="black", linewidth=1.2, label=LABEL, gid="reference")

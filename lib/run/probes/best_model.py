"""The best model a run has played so far, kept in ``best.pt``: after a game that sets a new best
mean reward (``RewardTracker.new_best``), at most once every ``schedules.BEST_SECONDS`` (writing
it reads the net back from the device), and at the end of the run the newest best not written yet.
"""

from __future__ import annotations

import time

from lib import schedules


class BestModel:
    """``game(new_best)`` after each finished game; ``write()`` writes a best still waiting.
    ``save(name)`` writes the run's net as ``name`` (``Run.save_model``)."""

    def __init__(self, save):
        self.save = save
        self.due = False  # a new best that best.pt does not hold yet
        self.saved = -float("inf")  # time.monotonic() of the last best.pt

    def game(self, new_best: bool) -> None:
        self.due = self.due or new_best
        if self.due and time.monotonic() - self.saved >= schedules.BEST_SECONDS:
            self.write()

    def write(self) -> None:
        """Write the newest best model to ``best.pt``, if one is waiting."""
        if self.due:
            self.saved = time.monotonic()
            self.save("best.pt")
            self.due = False  # once written: a signal before then leaves it to the end of the run

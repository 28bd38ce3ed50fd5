"""The schedules and the crossing rule every cadence uses (lib/schedules.py)."""

from __future__ import annotations

import pytest

from lib.params import GAMES
from lib.schedules import crossed, epsilon_at

PONG = GAMES["pong"]


def test_epsilon_schedule():
    assert epsilon_at(0, PONG) == 1.0
    assert epsilon_at(50_000, PONG) == pytest.approx(0.51)  # halfway from 1.0 to 0.02
    assert epsilon_at(100_000, PONG) == pytest.approx(0.02)
    assert epsilon_at(100_001, PONG) == pytest.approx(0.02)
    assert epsilon_at(1_000_000, PONG) == pytest.approx(0.02)
    values = [epsilon_at(f, PONG) for f in range(0, 100_001, 5_000)]
    assert values == sorted(values, reverse=True)


def test_crossed_when_a_multiple_of_the_period_is_crossed():
    assert crossed(999, 1000, 1000)
    assert not crossed(1000, 1001, 1000)
    assert not crossed(0, 999, 1000)
    assert not crossed(1000, 1000, 1000)
    assert crossed(990, 1022, 1000)  # stages that play several steps at once cross it inside
    assert crossed(990, 3010, 1000)  # crossing several multiples still syncs once

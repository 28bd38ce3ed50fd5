"""Tests for lib.run.probes.trackers (reward and loss tracker, speed) and lib.params (the
hyperparameter sets). Time is a fake clock wherever a figure depends on it."""

from __future__ import annotations

import dataclasses
import inspect
import types

import gymnasium as gym
import pytest
import torch

import lib.run.probes.trackers as trackers
import lib.wrappers  # noqa: F401  (registers the ALE envs)
from lib.params import GAMES, Hyperparams
from lib.run.probes.trackers import RewardTracker, SpeedMeter

PONG = GAMES["pong"]


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(trackers, "time", types.SimpleNamespace(perf_counter=fake.perf_counter))
    return fake


class FakeWriter:
    """Records what a SummaryWriter would have been asked to write."""

    def __init__(self):
        self.scalars = []

    def add_scalar(self, tag, value, step):
        self.scalars.append((tag, value, step))


# --- reward tracker ------------------------------------------------------------------------


def test_solved_when_the_mean_of_the_last_100_games_exceeds_stop_reward(clock):
    tracker = RewardTracker(None, stop_reward=18.0, log=lambda line: None)
    for i in range(50):
        assert not tracker.reward(-21.0, i, 0.02)
    # After k games of 19, the last 100 are (100 - k) x -21 and k x 19: mean (40 k - 2100) / 100,
    # which first exceeds 18 at k = 98 (18.2; k = 97 gives 17.8). The mean of all games is lower.
    solved = [tracker.reward(19.0, 100 + k, 0.02) for k in range(1, 99)]
    assert solved.index(True) == 97 and all(solved[97:])
    assert tracker.mean_reward == pytest.approx(18.2)

    tracker = RewardTracker(None, stop_reward=18.0, log=lambda line: None)
    assert not any(tracker.reward(18.0, i, 0.02) for i in range(100))  # equal is not solved


def test_line_format_and_tensorboard_scalars(clock):
    lines, writer = [], FakeWriter()
    tracker = RewardTracker(writer, stop_reward=18.0, log=lines.append)
    tracker.reward(-21.0, 1000, 0.99)
    clock.now = 4.0
    tracker.reward(-19.0, 3000, 0.97)  # 2000 agent steps in 4 s
    assert lines == [
        "1000: done 1 games, mean reward -21.000, speed 0.00 f/s, eps 0.99",
        "3000: done 2 games, mean reward -20.000, speed 500.00 f/s, eps 0.97",
    ]
    assert writer.scalars == [
        ("epsilon", 0.99, 1000),
        ("speed", 0.0, 1000),
        ("reward_100", -21.0, 1000),
        ("reward", -21.0, 1000),
        ("epsilon", 0.97, 3000),
        ("speed", 500.0, 3000),
        ("reward_100", -20.0, 3000),
        ("reward", -19.0, 3000),
    ]


def test_games_ending_on_the_same_step_share_its_speed(clock):
    # Two of a vector env's games end on one step: the second is logged at the first's speed,
    # not at 0 f/s (which TensorBoard's speed curve would show as a dip to zero).
    writer = FakeWriter()
    tracker = RewardTracker(writer, stop_reward=18.0, log=lambda line: None)
    tracker.reward(-21.0, 1000, 0.99)
    clock.now = 4.0
    tracker.reward(-20.0, 3000, 0.97)
    clock.now = 4.001
    tracker.reward(-19.0, 3000, 0.97)
    clock.now = 6.0  # the next interval starts where the first of the pair ended
    tracker.reward(-18.0, 4000, 0.96)
    speeds = [value for tag, value, _ in writer.scalars if tag == "speed"]
    assert speeds == [0.0, 500.0, 500.0, 500.0]


def test_loss_is_logged_as_the_mean_since_the_last_log_point(clock):
    writer = FakeWriter()
    tracker = RewardTracker(writer, stop_reward=18.0, log=lambda line: None)
    tracker.loss(torch.tensor(1.0, requires_grad=True), 500)
    tracker.loss(3.0, 999)
    assert writer.scalars == []
    tracker.loss(torch.tensor(5.0), 1000)  # crosses 1000: mean of 1, 3, 5
    tracker.loss(2.0, 1500)
    tracker.loss(4.0, 2001)  # crosses 2000: mean of 2, 4
    assert writer.scalars == [("loss", 3.0, 1000), ("loss", 3.0, 2001)]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_loss_on_the_gpu_is_written_one_log_point_later_without_a_sync(clock):
    # Losses on the GPU: at a log point their mean is copied to pinned memory without
    # blocking (sync debug mode "error" would raise on a blocking read) and written at the
    # next log point, or by flush_loss (a checkpoint, the run's end), with its own frame.
    writer = FakeWriter()
    tracker = RewardTracker(writer, stop_reward=18.0, log=lambda line: None)
    losses = [(torch.tensor(value, device="cuda"), frame) for value, frame in ((1.0, 500), (3.0, 1000), (6.0, 2000))]
    torch.cuda.set_sync_debug_mode("error")
    try:
        for value, frame in losses:
            tracker.loss(value, frame)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert writer.scalars == [("loss", 2.0, 1000)]  # 1000's mean (of 1 and 3), written at 2000
    tracker.flush_loss()
    assert writer.scalars == [("loss", 2.0, 1000), ("loss", 6.0, 2000)]


def test_new_best_once_per_improvement_after_10_games(clock):
    tracker = RewardTracker(None, stop_reward=18.0, log=lambda line: None)
    for i in range(9):
        tracker.reward(-20.0, i, 0.5)
        assert not tracker.new_best()
    tracker.reward(-20.0, 9, 0.5)
    assert tracker.new_best()
    assert not tracker.new_best()
    tracker.reward(-21.0, 10, 0.5)
    assert not tracker.new_best()
    tracker.reward(0.0, 11, 0.5)
    assert tracker.new_best()


def test_speed_meter(clock):
    meter = SpeedMeter()
    assert not meter.started and meter.fps(500) == 0.0 and meter.frames(500) == 0
    clock.now = 10.0
    meter.start(100)
    clock.now = 12.0
    meter.start(300)  # already started: keeps the first start
    assert meter.started
    assert meter.frames(300) == 200
    assert meter.fps(300) == 100.0  # 200 agent steps in 2 s
    clock.now = 10.0
    assert meter.fps(300) == 0.0  # no time elapsed: no speed, not a division by zero


def test_speed_meter_calls_on_start_once_at_its_start():
    """The run's time by part is measured from the frame where f/s starts (lib.run.timing's window)."""
    started = []
    meter = SpeedMeter(on_start=started.append)
    meter.start(100)
    meter.start(300)
    assert started == [100]


# --- hyperparameters -----------------------------------------------------------------------


def test_every_field_has_a_one_line_doc():
    source = inspect.getsource(Hyperparams).splitlines()
    for field in dataclasses.fields(Hyperparams):
        line = next(line for line in source if line.strip().startswith(field.name + ":"))
        assert "#" in line, f"{field.name} has no doc comment"
        assert len(line.split("#", 1)[1].strip()) >= 10, f"{field.name}'s doc comment is too short"


@pytest.mark.parametrize("game", sorted(GAMES))
def test_every_game_set_is_complete_and_sane(game):
    params = GAMES[game]
    assert isinstance(params, Hyperparams)
    for field in dataclasses.fields(Hyperparams):
        value = getattr(params, field.name)
        assert value is not None and value == value  # set, and not NaN
    assert params.env_name.endswith("NoFrameskip-v4")  # the wrappers do the frame skip
    env = gym.make(params.env_name)  # registered, and its ROM ships with ale-py
    assert env.unwrapped.get_action_meanings()[0] == "NOOP"
    env.close()
    assert 0 < params.replay_initial <= params.replay_size
    assert 0 < params.epsilon_final < params.epsilon_start <= 1.0
    assert 0 < params.gamma < 1 and params.learning_rate > 0 and params.batch_size > 0
    assert params.target_net_sync > 0 and params.epsilon_frames > 0


def test_pong_values_are_the_articles():
    assert PONG == Hyperparams(
        env_name="PongNoFrameskip-v4",
        stop_reward=18.0,
        replay_size=100_000,
        replay_initial=10_000,
        target_net_sync=1_000,
        epsilon_frames=100_000,
        epsilon_start=1.0,
        epsilon_final=0.02,
        learning_rate=1e-4,
        gamma=0.99,
        batch_size=32,
    )


def test_params_are_frozen_and_replace_makes_a_copy():
    changed = PONG.replace(batch_size=64)
    assert changed.batch_size == 64 and PONG.batch_size == 32
    with pytest.raises(dataclasses.FrozenInstanceError):
        PONG.batch_size = 64

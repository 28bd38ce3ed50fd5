"""lib.agent: epsilon-greedy for one env and for a batch of envs. A net that counts its calls
and returns fixed Q-values shows which actions come from it and when it is not called."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from lib.agent import choose_action, choose_actions

N_ACTIONS = 6


class CountingNet(torch.nn.Module):
    """Q(s, a) = 1 where a == s[0, 0, 0] % N_ACTIONS, else 0; records each batch size."""

    def __init__(self):
        super().__init__()
        self.batches: list[int] = []

    def forward(self, x):
        self.batches.append(len(x))
        best = x[:, 0, 0, 0].long() % N_ACTIONS
        return torch.nn.functional.one_hot(best, N_ACTIONS).float()


def states_with_best(best):
    s = np.zeros((len(best), 4, 84, 84), dtype=np.uint8)
    s[:, 0, 0, 0] = best
    return s


def test_greedy_batch_takes_each_envs_argmax_in_one_forward():
    net = CountingNet()
    actions = choose_actions(net, states_with_best([3, 0, 5, 1]), 0.0, N_ACTIONS, "cpu", np.random.default_rng(0))
    assert actions.tolist() == [3, 0, 5, 1] and actions.dtype == np.int64
    assert net.batches == [4]


def test_all_exploring_skips_the_forward_pass():
    net = CountingNet()
    rng = np.random.default_rng(0)
    for _ in range(20):
        actions = choose_actions(net, states_with_best([3, 0, 5, 1]), 1.0, N_ACTIONS, "cpu", rng)
        assert ((actions >= 0) & (actions < N_ACTIONS)).all()
    assert net.batches == []


def test_mixed_batch_forwards_only_the_greedy_envs():
    # The same rng draws decide who explores: rng.random(4) < epsilon, then one integer per
    # exploring env. Replaying them shows which envs must carry the net's argmax.
    epsilon, best = 0.5, [3, 0, 5, 1]
    explore = np.random.default_rng(7).random(4) < epsilon
    assert 0 < explore.sum() < 4  # this seed mixes both kinds
    net = CountingNet()
    actions = choose_actions(net, states_with_best(best), epsilon, N_ACTIONS, "cpu", np.random.default_rng(7))
    assert net.batches == [int((~explore).sum())]
    assert actions[~explore].tolist() == np.array(best)[~explore].tolist()


def test_exploration_share_follows_epsilon():
    # With Q preferring action 0 everywhere, an action differs from 0 only when exploring and
    # drawing one of the 5 others: expected share epsilon * 5/6 = 0.25 at epsilon 0.3.
    net = CountingNet()
    rng = np.random.default_rng(1)
    actions = np.concatenate([choose_actions(net, states_with_best([0] * 4), 0.3, N_ACTIONS, "cpu", rng)
                              for _ in range(5000)])  # fmt: skip
    assert (actions != 0).mean() == pytest.approx(0.25, abs=0.01)


def test_single_env_choice():
    net = CountingNet()
    space = gym.spaces.Discrete(N_ACTIONS, seed=0)
    state = states_with_best([4])[0]
    assert choose_action(net, state, 0.0, space, "cpu") == 4 and net.batches == [1]
    rng = np.random.default_rng(0)
    picks = {choose_action(net, state, 1.0, space, "cpu", rng=rng) for _ in range(200)}
    assert picks == set(range(N_ACTIONS)) and net.batches == [1]

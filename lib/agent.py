"""Epsilon-greedy action selection, for one env and for a batch of envs."""

from __future__ import annotations

import numpy as np
import torch


@torch.no_grad()
def choose_action(net, state, epsilon: float, action_space, device, rng=np.random) -> int:
    """A random action with probability epsilon, else argmax_a Q(state, a)."""
    if rng.random() < epsilon:
        return int(action_space.sample())
    state_v = torch.from_numpy(np.asarray(state)).unsqueeze(0).to(device)
    return int(net(state_v).argmax(dim=1).item())


@torch.no_grad()
def choose_actions(net, states: np.ndarray, epsilon: float, n_actions: int, device, rng) -> np.ndarray:
    """Batched epsilon-greedy over a (num_envs, 4, 84, 84) array: one forward pass over the
    envs that act greedily, none when all of them explore (most steps while epsilon is near
    1: with 4 envs at epsilon 0.95, 81 % of steps)."""
    explore = rng.random(len(states)) < epsilon
    actions = np.empty(len(states), dtype=np.int64)
    actions[explore] = rng.integers(0, n_actions, size=int(explore.sum()))
    greedy = ~explore
    if greedy.any():
        batch = states if greedy.all() else states[greedy]
        actions[greedy] = net(torch.from_numpy(batch).to(device)).argmax(dim=1).cpu().numpy()
    return actions

"""Epsilon-greedy action selection for one game (stages 01-06; 07-08 act in batches: ``lib.actor``)."""

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

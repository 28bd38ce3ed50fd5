"""The one-step TD loss, and the batch's way to the device."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F


def batch_to_device(batch, device, non_blocking: bool = False):
    """numpy arrays or CPU tensors -> tensors on ``device``.

    ``non_blocking`` (stage 04) lets a copy from pinned host memory return before it ends.
    """
    return tuple(
        (torch.from_numpy(x) if isinstance(x, np.ndarray) else x).to(device, non_blocking=non_blocking) for x in batch
    )


def calc_loss(
    batch,
    net,
    tgt_net,
    gamma: float,
    device,
    non_blocking: bool = False,
    channels_last: bool = False,
    inference_target: bool = False,
) -> torch.Tensor:
    """MSE between Q(s, a) and r + gamma * max_a' Q_target(s', a'), with no bootstrap where
    the transition ended the episode (``dones``: terminated, not truncated).

    Opt-in, all off by default so that earlier stages never change: ``non_blocking`` (stage
    04) for async copies from pinned memory; ``channels_last`` and ``inference_target``
    (stage 06) for NHWC inputs (made here in fp32, by the net after its cast under autocast)
    and the target net under ``torch.inference_mode``.
    """
    states, actions, rewards, dones, next_states = batch_to_device(batch, device, non_blocking)
    if channels_last and not torch.is_autocast_enabled(torch.device(device).type):
        # Under autocast the net lays its input out after casting it (``lib.model.DQN.forward``).
        states = states.contiguous(memory_format=torch.channels_last)
        next_states = next_states.contiguous(memory_format=torch.channels_last)
    q_values = net(states).gather(1, actions.long().unsqueeze(-1)).squeeze(-1)
    with torch.inference_mode() if inference_target else torch.no_grad():
        next_q = tgt_net(next_states).max(1)[0]
        next_q = next_q.masked_fill(dones, 0.0)
        expected = rewards + gamma * next_q
    if inference_target:
        expected = expected.clone()  # a normal tensor, so autograd may save it
    return F.mse_loss(q_values, expected)

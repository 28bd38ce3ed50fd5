"""Tests for lib.loss.calc_loss: the TD target, with no bootstrap at episode end, from numpy or
torch batches; the stage-06 options change speed, not the loss or its gradients."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn

from lib.loss import calc_loss
from lib.model import DQN


class TableQ(nn.Module):
    """Q-values read from a table: the state is a row id (the first element of each state)."""

    def __init__(self, table):
        super().__init__()
        self.table = nn.Parameter(torch.tensor(table, dtype=torch.float32))

    def forward(self, x):
        return self.table[x.reshape(len(x), -1)[:, 0].long()]


# Rows 0-2 are the states, 3-5 the next states; 100 marks a row that must not be read.
NET = [[0.1, 0.2], [0.3, 0.4], [0.5, 0.6], [100, 100], [100, 100], [100, 100]]
TGT = [[100, 100], [100, 100], [100, 100], [1.0, 2.0], [5.0, 6.0], [-1.0, -2.0]]


def hand_batch(dones=(False, True, False)):
    return (
        np.array([[0], [1], [2]], np.uint8),  # states
        np.array([1, 0, 1], np.int64),  # actions
        np.array([1.0, -1.0, 0.5], np.float32),  # rewards
        np.array(dones, np.bool_),
        np.array([[3], [4], [5]], np.uint8),  # next states
    )


def test_td_target_by_hand_with_done_masking():
    # gamma 0.5:
    #   0: Q(s, a=1) = 0.2, target  1.0 + 0.5 * max(1, 2)  =  2.0, error -1.8
    #   1: Q(s, a=0) = 0.3, target -1.0 (done: no bootstrap) = -1.0, error  1.3
    #   2: Q(s, a=1) = 0.6, target  0.5 + 0.5 * max(-1, -2) = 0.0, error  0.6
    # loss = (1.8^2 + 1.3^2 + 0.6^2) / 3 = 5.29 / 3
    # dL/dQ = 2 * error / 3: row 0 col 1 -1.2, row 1 col 0 0.8667, row 2 col 1 0.4; the target
    # net gets no gradient.
    net, tgt_net = TableQ(NET), TableQ(TGT)
    loss = calc_loss(hand_batch(), net, tgt_net, gamma=0.5, device="cpu")
    assert loss.item() == pytest.approx(5.29 / 3, rel=1e-6)
    loss.backward()
    expected_grad = torch.zeros(6, 2)
    expected_grad[0, 1], expected_grad[1, 0], expected_grad[2, 1] = -1.2, 2 * 1.3 / 3, 0.4
    torch.testing.assert_close(net.table.grad, expected_grad)
    assert tgt_net.table.grad is None

    # Without the done flag, row 1 bootstraps: target -1 + 0.5 * 6 = 2.0, error -1.7.
    loss = calc_loss(hand_batch(dones=(False, False, False)), TableQ(NET), tgt_net, gamma=0.5, device="cpu")
    assert loss.item() == pytest.approx((1.8**2 + 1.7**2 + 0.6**2) / 3, rel=1e-6)


def test_numpy_and_torch_batches_give_the_same_loss():
    net, tgt_net = TableQ(NET), TableQ(TGT)
    from_numpy = calc_loss(hand_batch(), net, tgt_net, gamma=0.5, device="cpu")
    from_torch = calc_loss(tuple(torch.from_numpy(a) for a in hand_batch()), net, tgt_net, gamma=0.5, device="cpu")
    assert from_torch.item() == from_numpy.item()


def dqn_pair_and_batch(seed=0, n=16):
    torch.manual_seed(seed)
    net, tgt_net = DQN((4, 84, 84), 6), DQN((4, 84, 84), 6)
    rng = np.random.default_rng(seed)
    batch = (
        rng.integers(0, 256, (n, 4, 84, 84), dtype=np.uint8),
        rng.integers(0, 6, n).astype(np.int64),
        rng.choice([-1.0, 0.0, 1.0], n).astype(np.float32),
        rng.random(n) < 0.25,
        rng.integers(0, 256, (n, 4, 84, 84), dtype=np.uint8),
    )
    return net, tgt_net, batch


def loss_and_grads(net, tgt_net, batch, **options):
    net.zero_grad(set_to_none=True)
    loss = calc_loss(batch, net, tgt_net, gamma=0.99, device="cpu", **options)
    loss.backward()
    assert all(p.grad is None for p in tgt_net.parameters())
    return loss.detach(), [p.grad.clone() for p in net.parameters()]


@pytest.fixture(scope="module")
def default_case():
    """A DQN pair, a batch, and the loss and gradients with every option off."""
    net, tgt_net, batch = dqn_pair_and_batch(n=8)
    return (net, tgt_net, batch) + loss_and_grads(net, tgt_net, batch)


@pytest.mark.parametrize(
    "options",
    [{"channels_last": True}, {"inference_target": True}, {"channels_last": True, "inference_target": True}],
    ids=["channels_last", "inference_target", "both"],
)
def test_opt_in_options_keep_loss_and_gradients(options, default_case):
    net, tgt_net, batch, base_loss, base_grads = default_case
    loss, grads = loss_and_grads(net, tgt_net, batch, **options)
    torch.testing.assert_close(loss, base_loss)
    for g, base in zip(grads, base_grads):
        torch.testing.assert_close(g, base)


def test_bf16_autocast_loss_is_close_to_fp32():
    net, tgt_net, batch = dqn_pair_and_batch(seed=1, n=32)
    fp32 = calc_loss(batch, net, tgt_net, gamma=0.99, device="cpu")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        bf16 = calc_loss(batch, net, tgt_net, gamma=0.99, device="cpu", channels_last=True, inference_target=True)
    assert bf16.dtype == torch.float32  # the Q head and the TD error stay in fp32
    assert bf16.item() == pytest.approx(fp32.item(), rel=2e-3)
    bf16.backward()
    assert all(torch.isfinite(p.grad).all() for p in net.parameters())

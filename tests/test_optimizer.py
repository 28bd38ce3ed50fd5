"""Tests for lib.optimizer: the fast Adam does plain Adam's update, and is capturable only where
a captured step can use it."""

from __future__ import annotations

import copy

import torch

from lib.model import DQN
from lib.optimizer import adam_options


def test_fast_adam_options_work_with_adam():
    torch.manual_seed(0)
    net = DQN((4, 84, 84), 6)
    frames = torch.randint(0, 256, (2, 4, 84, 84), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    options = adam_options("cpu")
    assert isinstance(options, dict) and set(options) <= {"fused", "foreach"}
    assert list(options.values()) == [True]
    fast_net, plain_net = copy.deepcopy(net), copy.deepcopy(net)
    fast = torch.optim.Adam(fast_net.parameters(), lr=1e-3, **options)
    plain = torch.optim.Adam(plain_net.parameters(), lr=1e-3, foreach=False)
    for model, opt in ((fast_net, fast), (plain_net, plain)):
        for _ in range(2):
            opt.zero_grad()
            model(frames).pow(2).mean().backward()
            opt.step()
    assert not torch.equal(fast_net.fc[-1].weight, net.fc[-1].weight)  # it did update
    for p_fast, p_plain in zip(fast_net.parameters(), plain_net.parameters()):
        torch.testing.assert_close(p_fast, p_plain, rtol=1e-5, atol=1e-6)


def test_capturable_only_where_the_step_is_captured_on_cuda():
    assert adam_options("cpu", "none") == adam_options("cpu")
    assert "capturable" not in adam_options("cpu", "compile")  # torch refuses it for CPU tensors
    if torch.cuda.is_available():
        assert adam_options("cuda", "graph")["capturable"] and "capturable" not in adam_options("cuda")

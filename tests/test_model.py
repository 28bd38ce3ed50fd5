"""Tests for lib.model: the Nature-DQN shape, the uint8 -> [0, 1] scaling inside forward, and the
fp32 Q head under autocast."""

from __future__ import annotations

import copy

import pytest
import torch

from lib.model import DQN, train_step_flops


@pytest.fixture(scope="module")
def net():
    torch.manual_seed(0)
    return DQN((4, 84, 84), 6)


@pytest.fixture(scope="module")
def frames():
    return torch.randint(0, 256, (5, 4, 84, 84), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))


def test_output_shape(net, frames):
    out = net(frames)
    assert out.shape == (5, 6) and out.dtype == torch.float32
    assert net(frames[:1]).shape == (1, 6)


def test_nature_architecture(net):
    # conv 32x8x8/4 -> 20x20, conv 64x4x4/2 -> 9x9, conv 64x3x3/1 -> 7x7: 64 * 7 * 7 = 3136 inputs
    # to fc 512. Parameters: 8,224 + 32,832 + 36,928 + 1,606,144 + 3,078 = 1,687,206.
    assert net.fc[0].in_features == 3136
    assert sum(p.numel() for p in net.parameters()) == 1_687_206


def test_uint8_input_is_scaled_by_255(net, frames):
    with torch.no_grad():
        by_hand = net.fc(net.conv(frames.float() / 255.0).flatten(1))
        unscaled = net.fc(net.conv(frames.float()).flatten(1))
        out = net(frames)
    torch.testing.assert_close(out, by_hand, rtol=0, atol=0)
    assert not torch.allclose(out, unscaled)


def test_q_head_stays_fp32_under_bf16_autocast(net, frames):
    with torch.no_grad():
        fp32 = net(frames)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            bf16 = net(frames)
    assert bf16.dtype == torch.float32
    torch.testing.assert_close(bf16, fp32, rtol=0.05, atol=0.01)


def test_autocast_takes_raw_pixels_with_conv1_scaled(net, frames):
    # Under autocast uint8 frames skip the fp32 / 255 pass: conv1 sees the exact pixels and
    # weights / 255. Same Q-values and conv1 gradients as the fp32 path, to bf16 rounding.
    def run(bf16: bool):
        model = copy.deepcopy(net)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            out = model(frames)
        out.sum().backward()
        return out.detach(), model.conv[0].weight.grad

    raw_out, raw_grad = run(bf16=True)
    fp32_out, fp32_grad = run(bf16=False)
    torch.testing.assert_close(raw_out, fp32_out, rtol=0.02, atol=1e-3)
    # bf16 backward is coarse (here 6.7 % relative error, 5.8 % when the batch was scaled in
    # fp32 first); a lost or doubled 1/255 would be off by a factor of 255.
    assert fp32_grad.norm() > 0
    assert ((raw_grad - fp32_grad).norm() / fp32_grad.norm()).item() < 0.15


def test_active_units_count_each_layers_units_active_for_some_input():
    """ActiveUnits: a conv channel counts when active anywhere in some input's frame, an fc unit
    when active for some input; with ``training_only`` forwards without gradients (acting) are
    left out; a layer with no unit active is named dead."""
    from lib.model import ActiveUnits

    torch.manual_seed(0)
    net = DQN((4, 84, 84), 6)
    states = torch.randint(0, 256, (8, 4, 84, 84), dtype=torch.uint8)
    units, training = ActiveUnits(net), ActiveUnits(net, training_only=True)
    assert units.counts() == [] and units.dead() == []
    with torch.no_grad():
        net(states[:1])
    one = units.counts()
    assert [(n, t) for n, _, t in one] == [("conv1", 32), ("conv2", 64), ("conv3", 64), ("fc1", 512)]
    assert training.counts() == []  # acting is not training
    net(states)
    more = units.counts()
    assert all(a <= b for (_, a, _), (_, b, _) in zip(one, more)) and sum(a for _, a, _ in more) > sum(
        a for _, a, _ in one
    )
    assert training.counts() == more  # the same eight states seen by both
    with torch.no_grad():
        net.conv[4].bias.fill_(-1.0)
        net.conv[4].weight.zero_()
    units.reset()
    net(states)
    assert units.dead() == ["conv3"] and units.counts()[2] == ("conv3", 0, 64)
    units.close()
    units.reset()
    net(states)
    assert units.counts() == []  # closed: no longer watching


def test_layer_macs_and_the_train_steps_flops_written_out():
    # Per input of 4x84x84: conv1 32 channels of 20x20 outputs, each 4*8*8 = 256 multiply-adds:
    # 3,276,800; conv2 64x9x9 outputs of 32*4*4 = 512: 2,654,208; conv3 64x7x7 of 64*3*3 = 576:
    # 1,806,336; fc1 3136*512 = 1,605,632; fc2 512*6 = 3,072. Forward 9,346,048 multiply-adds.
    # A train step at batch 128: 2 FLOP each, times (net forward + target forward + backward of
    # two forwards less conv1's input gradient): 2*128*(4*9,346,048 - 3,276,800) = 8,731,492,352.
    net = DQN((4, 84, 84), 6)
    assert net.layer_macs((4, 84, 84)) == [
        ("conv1", 3_276_800), ("conv2", 2_654_208), ("conv3", 1_806_336), ("fc1", 1_605_632), ("fc2", 3_072),
    ]  # fmt: skip
    assert train_step_flops(net, (4, 84, 84), 128) == 8_731_492_352


def test_under_autocast_the_net_lays_its_input_out_after_the_cast_bit_for_bit():
    """Stages 06-08: NCHW uint8 frames are cast to bf16 and then made NHWC by the net (a faster
    transposition than of the bytes); the outputs and gradients equal, bit for bit, those of the
    frames made NHWC first, as calc_loss did before."""
    torch.manual_seed(0)
    net = DQN((4, 84, 84), 6).to(memory_format=torch.channels_last)
    other = copy.deepcopy(net)
    frames = torch.randint(0, 256, (8, 5, 84, 84), dtype=torch.uint8)[:, :4]  # a view, as a ring's sample
    with torch.autocast("cpu", dtype=torch.bfloat16):
        before = net(frames.contiguous(memory_format=torch.channels_last))
        after = other(frames)
    before.sum().backward()
    after.sum().backward()
    assert torch.equal(before, after)
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(net.parameters(), other.parameters()))

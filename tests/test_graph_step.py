"""Tests for lib.graph_step: stage 08's train step does stage 07's update on the same batch,
syncs the target net on 07's schedule, reports losses without a read per step, and (CUDA)
replays as a captured graph with the eager step's results and no host synchronisation."""

from __future__ import annotations

import copy
import shutil
from collections import Counter

import numpy as np
import pytest
import torch

from lib.buffer import StreamReplayBuffer
from lib.graph_step import Pacer, TrainStep
from lib.loss import calc_loss
from lib.model import DQN
from lib.optimizer import adam_options
from lib.replay_device import DeviceReplayBuffer
from tests.support.host_syncs import HostSyncs
from tests.test_replay_device import apply_to_device, apply_to_reference, reference_batch, vector_stream

GAMMA, LR = 0.99, 1e-4
SHAPE, N_ACTIONS = (4, 84, 84), 6


def nets(device="cpu", seed=0):
    torch.manual_seed(seed)
    net = DQN(SHAPE, N_ACTIONS).to(device, memory_format=torch.channels_last)
    tgt_net = DQN(SHAPE, N_ACTIONS).to(device, memory_format=torch.channels_last)
    tgt_net.load_state_dict(net.state_dict())
    return net, tgt_net


def pixel_ring(device="cpu", streams=2, capacity=200, vector_steps=60, seed=7):
    buffer = DeviceReplayBuffer(capacity, streams, device=device)
    for item in vector_stream(streams, vector_steps, seed=seed, frame_shape=(84, 84)):
        apply_to_device(buffer, item)
    return buffer


def valid_slots(buffer) -> np.ndarray:
    return np.flatnonzero(buffer.valid.cpu().numpy())


def test_one_step_equals_stage_07_on_the_same_batch():
    """07's path: StreamReplayBuffer's batch, calc_loss with 06/07's options under bf16
    autocast, fused Adam. 08's path: the same transitions drawn on the device, TrainStep.
    Same loss and same parameter update (on CPU the same kernels run, so the match is close
    to exact; the bound allows for bf16 rounding)."""
    ref = StreamReplayBuffer(200, 2)
    buffer = DeviceReplayBuffer(200, 2)
    for item in vector_stream(2, 60, seed=7, frame_shape=(84, 84)):
        apply_to_reference(ref, item)
        apply_to_device(buffer, item)
    idx = np.random.default_rng(0).choice(valid_slots(buffer), 32)
    net07, tgt07 = nets()
    net08, tgt08 = copy.deepcopy(net07), copy.deepcopy(tgt07)
    start = {k: v.clone() for k, v in net07.state_dict().items()}

    opt07 = torch.optim.Adam(net07.parameters(), lr=LR, **adam_options("cpu"))
    opt07.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss07 = calc_loss(
            reference_batch(ref, idx), net07, tgt07, GAMMA, "cpu", True, channels_last=True, inference_target=True
        )
    loss07.backward()
    opt07.step()

    opt08 = torch.optim.Adam(net08.parameters(), lr=LR, **adam_options("cpu", "none"))
    buffer.sample_indices = lambda n: torch.from_numpy(idx)
    step = TrainStep(net08, tgt08, opt08, buffer, 32, GAMMA, target_sync=1000, steps=4)
    loss08 = step(4)

    assert not loss08.requires_grad
    torch.testing.assert_close(loss08, loss07.detach(), rtol=1e-2, atol=1e-4)
    moved = 0.0
    for name, p07 in net07.state_dict().items():
        p08 = net08.state_dict()[name]
        update07, update08 = p07 - start[name], p08 - start[name]
        torch.testing.assert_close(update08, update07, rtol=0, atol=1e-3 * LR)
        moved = max(moved, float(update07.abs().max()))
    assert moved > 0.5 * LR  # Adam moved the weights by about the learning rate
    for p07, p08 in zip(tgt07.parameters(), tgt08.parameters()):
        assert torch.equal(p07, p08)  # not due at frame 4


def test_target_net_syncs_on_stage_07_schedule():
    """crossed(frame - steps, frame, period): with period 8 and 4 frames a step, the target
    takes the net's weights before the steps at frames 8 and 16, not at 4 or 12."""
    buffer = pixel_ring()
    net, tgt_net = nets()
    with torch.no_grad():
        for p in tgt_net.parameters():
            p.zero_()
    optimizer = torch.optim.Adam(net.parameters(), lr=LR)
    step = TrainStep(net, tgt_net, optimizer, buffer, 8, GAMMA, target_sync=8, steps=4)
    synced_at = []
    for frame_idx in (4, 8, 12, 16):
        before = [p.clone() for p in net.parameters()]
        step(frame_idx)
        if all(torch.equal(t, b) for t, b in zip(tgt_net.parameters(), before)):
            synced_at.append(frame_idx)
    assert synced_at == [8, 16]


def test_mean_loss_is_the_mean_of_the_steps_since_the_last_read():
    buffer = pixel_ring()
    net, tgt_net = nets()
    optimizer = torch.optim.Adam(net.parameters(), lr=LR)
    step = TrainStep(net, tgt_net, optimizer, buffer, 8, GAMMA, target_sync=1000, steps=4)
    assert step.mean_loss() is None
    losses = [float(step(4 * (i + 1))) for i in range(3)]
    assert float(step.mean_loss()) == pytest.approx(np.mean(losses), rel=1e-6)
    later = float(step(16))
    assert float(step.mean_loss()) == pytest.approx(later, rel=1e-6)
    assert step.ready and step.calls == 4


# -- CUDA: the captured step ------------------------------------------------------------------


def forced_indices(buffer, batch_size):
    """Make ``buffer`` sample from a static index tensor the test fills before each step."""
    fixed = torch.zeros(batch_size, dtype=torch.int64, device=buffer.device)
    buffer.sample_indices = lambda n: fixed
    return fixed


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_graph_replay_equals_the_eager_step():
    """Three eager warm-up steps, the capture, four replays: each step's loss and the final
    weights match the eager step's on the same batches (same kernels; bf16 tolerance)."""
    batch_size, steps = 32, 8
    runs = {}
    for form in ("none", "graph"):
        buffer = pixel_ring("cuda")
        fixed = forced_indices(buffer, batch_size)
        net, tgt_net = nets("cuda")
        optimizer = torch.optim.Adam(net.parameters(), lr=LR, **adam_options("cuda", "graph"))
        step = TrainStep(net, tgt_net, optimizer, buffer, batch_size, GAMMA, target_sync=16, steps=4, capture=form)
        rng = np.random.default_rng(1)
        start = [p.detach().clone() for p in net.parameters()]
        losses = []
        for i in range(steps):
            fixed.copy_(torch.from_numpy(rng.choice(valid_slots(buffer), batch_size)))
            losses.append(step(4 * (i + 1)).clone())
        runs[form] = (torch.stack(losses), [p.detach() for p in net.parameters()], start, step)
    (loss_e, params_e, start, _), (loss_g, params_g, _, graph_step) = runs["none"], runs["graph"]
    assert graph_step._graph is not None and graph_step.ready  # steps 5-8 were replays
    torch.testing.assert_close(loss_g, loss_e, rtol=2e-2, atol=1e-4)
    for p_e, p_g, p0 in zip(params_e, params_g, start):
        assert (p_g - p_e).abs().mean() <= 0.05 * (p_e - p0).abs().mean() + 1e-8


def test_the_trainers_hot_path_waits_only_in_its_pacer(monkeypatch):
    """Stage 08's trainer per Queue item, on CPU in the branches CUDA takes with --capture none:
    the Pacer (made for a CUDA device, its events counted by HostSyncs), a ring write through the
    staging path, train steps that draw and gather on the device (a target sync among them), and
    the loss mean. The one wait is the Pacer's, once an item from the second item on, on
    blocking events; no tensor value is read back (.item(), .cpu(), boolean indexing), Adam's
    step included. (The staging buffers' wait for a copy four writes old is CUDA's alone.)"""
    syncs = HostSyncs(monkeypatch)
    buffer = DeviceReplayBuffer(200, 2, staged=True, host_gather=False)
    stream = list(vector_stream(2, 63, seed=7, frame_shape=(84, 84)))
    for item in stream[:-3]:
        apply_to_device(buffer, item)
    net, tgt_net = nets()
    optimizer = torch.optim.Adam(net.parameters(), lr=LR, **adam_options("cpu"))
    step = TrainStep(net, tgt_net, optimizer, buffer, 32, GAMMA, target_sync=8, steps=4, capture="none")
    pace = Pacer(torch.device("cuda"))
    frame_idx, loaded = 0, {k: v.clone() for k, v in tgt_net.state_dict().items()}
    with syncs:
        for item in stream[-3:]:  # three Queue items
            pace()
            apply_to_device(buffer, item)
            for _ in range(2):
                frame_idx += 4
                step(frame_idx)
        mean = step.mean_loss()
    assert syncs.counts == Counter(event_sync=2), syncs.counts
    assert [e.blocking for e in syncs.events] == [True] * 3
    assert torch.isfinite(mean) and step.calls == 6
    assert any(not torch.equal(v, loaded[k]) for k, v in tgt_net.state_dict().items())  # synced at frame 8


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_replays_and_ring_writes_never_synchronise():
    """After capture, train steps (with target syncs among them), ring writes and the loss
    mean run under torch.cuda.set_sync_debug_mode("error"): any hidden host sync raises."""
    buffer = pixel_ring("cuda")
    net, tgt_net = nets("cuda")
    optimizer = torch.optim.Adam(net.parameters(), lr=LR, **adam_options("cuda", "graph"))
    step = TrainStep(net, tgt_net, optimizer, buffer, 32, GAMMA, target_sync=8, steps=4, capture="graph")
    frame_idx = 0
    while not step.ready:
        frame_idx += 4
        step(frame_idx)
    # A new stream opens an episode in every ring (its first item) before its steps: three steps.
    first, *more = vector_stream(2, 3, seed=11, frame_shape=(84, 84))
    apply_to_device(buffer, first)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for item in more:
            apply_to_device(buffer, item)
            for _ in range(2):
                frame_idx += 4
                step(frame_idx)
        mean = step.mean_loss()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert torch.isfinite(mean)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_captured_step_reads_the_current_fill_level():
    """One ring (so new slots come after all old ones): transitions written after capture, with
    a reward no earlier one has, must show up in the batches of later replays; a fill level
    frozen at capture would never reach them."""
    buffer = DeviceReplayBuffer(400, 1, device="cuda")
    items = list(vector_stream(1, 120, seed=3, frame_shape=(84, 84)))
    for item in items[:60]:
        apply_to_device(buffer, item)
    net, tgt_net = nets("cuda")
    optimizer = torch.optim.Adam(net.parameters(), lr=LR, **adam_options("cuda", "graph"))
    step = TrainStep(net, tgt_net, optimizer, buffer, 32, GAMMA, target_sync=1000, steps=4, capture="graph")
    frame_idx = 0
    while not step.ready:
        frame_idx += 4
        step(frame_idx)
    fill_at_capture = int(buffer.fill())
    for starts, stepped, actions, rewards, terminated, dones, frames in items[60:]:
        buffer.add_vector_step(stepped, actions, np.full_like(rewards, 5.0), terminated, dones, frames, starts)
    assert int(buffer.fill()) > 1.5 * fill_at_capture
    seen_new = False
    for _ in range(10):
        frame_idx += 4
        step(frame_idx)
        seen_new |= bool((buffer._buffers(32)[2] == 5.0).any())
    assert seen_new


def steps_without_recompiling(device: str, more_steps: int = 6) -> TrainStep:
    """The compile form on a small ring: warm up, then train steps with a target sync and ring
    writes among them under dynamo's error_on_recompile, which raises on any recompilation."""
    import torch._dynamo

    torch._dynamo.reset()
    buffer = pixel_ring(device)
    net, tgt_net = nets(device)
    optimizer = torch.optim.Adam(net.parameters(), lr=LR, **adam_options(device, "compile"))
    step = TrainStep(net, tgt_net, optimizer, buffer, 32, GAMMA, target_sync=8, steps=4, capture="compile")
    frame_idx = 0
    while not step.ready or step.calls < step.warmup + 2:
        frame_idx += 4
        step(frame_idx)
    first, *more = vector_stream(2, more_steps, seed=5, frame_shape=(84, 84))
    apply_to_device(buffer, first)  # a new stream opens an episode in every ring before its steps
    with torch._dynamo.config.patch(error_on_recompile=True):
        for item in more:
            apply_to_device(buffer, item)
            frame_idx += 4
            loss = step(frame_idx)
    assert torch.isfinite(loss)
    return step


@pytest.mark.parametrize(
    "device",
    [
        pytest.param(
            "cpu",
            marks=pytest.mark.skipif(
                not any(shutil.which(c) for c in ("g++", "c++", "clang++")), reason="inductor needs a C++ compiler"
            ),
        ),
        pytest.param(
            "cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
        ),
    ],
)
def test_compiled_step_never_recompiles_after_warm_up(device):
    """Fixed shapes and device-side fill level: nothing that changes from step to step (the
    ring's contents and fill, the target's weights, the frame counter) is a guard."""
    steps_without_recompiling(device)

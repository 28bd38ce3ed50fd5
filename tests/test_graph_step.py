"""Tests for lib.graph_step: stage 08's own train step (08_graph_learner.py) does stage 07's
update on the same batch, ``capture`` runs it eagerly, as a graph (here on a CPU stand-in for
CUDA's streams and graphs, and on CUDA) and compiled, with the eager step's results, a loss of
its own per call and, after capture, no host synchronisation."""

from __future__ import annotations

import contextlib
import copy
import shutil
import types
from collections import Counter

import numpy as np
import pytest
import torch

from lib import graph_step
from lib.buffer_games import StreamReplayBuffer
from lib.graph_step import Pacer
from lib.loss import calc_loss
from lib.model import DQN
from lib.optimizer import adam_options
from lib.params import GAMES
from lib.replay_device import DeviceReplayBuffer
from lib.run.probes.weights_age import WeightsAge
from lib.run.scripts import load_script
from lib.schedules import crossed
from tests.support.host_syncs import HostSyncs
from tests.test_replay_device import apply_to_device, apply_to_reference, reference_batch, vector_stream

GAMMA, LR = 0.99, 1e-4
SHAPE, N_ACTIONS = (4, 84, 84), 6
PARAMS = GAMES["pong"].replace(gamma=GAMMA)
STAGE_08 = load_script("08")


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


def stage_step(form, net, tgt_net, optimizer, buffer, batch_size, target_sync=None, wrap=None):
    """Stage 08's loop past its replay gate: the target sync when due (every ``target_sync``
    frames, 4 frames a step), then its train step as ``capture`` wraps it (and ``wrap``, the
    run's probes, wraps that). ``call(frame_idx)`` -> the loss; ``call.step`` is the ``Captured``."""
    captured = graph_step.capture(STAGE_08.train_step, form)
    step = captured if wrap is None else wrap(captured)
    args = (buffer, batch_size, net, tgt_net, optimizer, PARAMS, torch.device(buffer.device), "bf16")

    def call(frame_idx):
        if target_sync and crossed(frame_idx - 4, frame_idx, target_sync):
            tgt_net.load_state_dict(net.state_dict())
        return step(*args)

    call.step = captured
    return call


def test_one_step_equals_stage_07_on_the_same_batch():
    """07's path: StreamReplayBuffer's batch, calc_loss with 06/07's options under bf16
    autocast, fused Adam. 08's path: the same transitions drawn on the device by 08's
    train_step. Same loss and same parameter update (on CPU the same kernels run, so the match
    is close to exact; the bound allows for bf16 rounding)."""
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
    loss08 = stage_step("none", net08, tgt08, opt08, buffer, 32)(4)

    torch.testing.assert_close(loss08.detach(), loss07.detach(), rtol=1e-2, atol=1e-4)
    moved = 0.0
    for name, p07 in net07.state_dict().items():
        p08 = net08.state_dict()[name]
        update07, update08 = p07 - start[name], p08 - start[name]
        torch.testing.assert_close(update08, update07, rtol=0, atol=1e-3 * LR)
        moved = max(moved, float(update07.abs().max()))
    assert moved > 0.5 * LR  # Adam moved the weights by about the learning rate


def forced_indices(buffer, batch_size):
    """Make ``buffer`` sample from a static index tensor the test fills before each step."""
    fixed = torch.zeros(batch_size, dtype=torch.int64, device=buffer.device)
    buffer.sample_indices = lambda n: fixed
    return fixed


class StandInCuda:
    """CUDA's streams and graphs, on the CPU: a stream is a no-op; a capture runs the step and
    then puts the nets and Adam back as they were (a real capture records without running);
    a replay runs the captured step again and writes its loss into the captured output."""

    def __init__(self, monkeypatch, objects):
        self.objects, self.captured, self.replays, self.cache_during_capture = objects, None, 0, []
        stream = types.SimpleNamespace(wait_stream=lambda other: None)
        monkeypatch.setattr(torch.cuda, "Stream", lambda *a: stream)
        monkeypatch.setattr(torch.cuda, "current_stream", lambda *a: stream)
        monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
        self.registered = []
        monkeypatch.setattr(
            torch.cuda,
            "CUDAGraph",
            lambda: types.SimpleNamespace(replay=self.replay, register_generator_state=self.registered.append),
        )
        monkeypatch.setattr(torch.cuda, "graph", self.graph)

    @contextlib.contextmanager
    def graph(self, g):
        saved = [copy.deepcopy(o.state_dict()) for o in self.objects]
        step = self.captured[0]
        ring = (step._losses.clone(), step._loss_slot.clone())
        self.cache_during_capture.append(torch.is_autocast_cache_enabled())
        yield
        for o, state in zip(self.objects, saved):
            o.load_state_dict(state)
        step._losses.copy_(ring[0])
        step._loss_slot.copy_(ring[1])

    def replay(self):
        self.replays += 1
        step, args = self.captured
        with graph_step._no_cast_cache():
            step._captured_step(args)


def test_the_graph_form_on_a_stand_in_gives_the_eager_steps_results(monkeypatch):
    """``capture(train_step, "graph")`` through its CUDA branches on the CPU stand-in: three
    warm-up calls, the capture, replays; every call's loss (each a tensor of its own, not the
    graph's output overwritten by the next replay) and the final weights and Adam state equal
    the eager form's bit for bit; the weights' age (``WeightsAge.count_steps``, as the run wraps
    the step) counts each call once, around the whole call, and no optimizer hook besides (a replay
    calls none); the step is ready after the capture, and says so once."""
    runs, said = {}, []
    age = WeightsAge(types.SimpleNamespace(frame_idx=0, args=types.SimpleNamespace(steps=4, lag="free"), device="cpu"))
    for form in ("none", "graph"):
        buffer = pixel_ring()
        fixed = forced_indices(buffer, 32)
        net, tgt_net = nets()
        optimizer = torch.optim.Adam(net.parameters(), lr=LR, **adam_options("cpu"))
        wrap = (lambda step, optimizer=optimizer: age.count_steps(step, optimizer)) if form == "graph" else None
        call = stage_step(form, net, tgt_net, optimizer, buffer, 32, target_sync=16, wrap=wrap)
        if form == "graph":
            cuda = StandInCuda(monkeypatch, (net, tgt_net, optimizer))
            cuda.captured = (call.step, (buffer, 32, net, tgt_net, optimizer, PARAMS, torch.device("cpu"), "bf16"))
            call.step.log = said.append
        rng, losses = np.random.default_rng(1), []
        for i in range(8):
            fixed.copy_(torch.from_numpy(rng.choice(valid_slots(buffer), 32)))
            losses.append(call(4 * (i + 1)))
        runs[form] = (losses, net, optimizer)
    (loss_e, net_e, opt_e), (loss_g, net_g, opt_g) = runs["none"], runs["graph"]
    assert [float(v.detach()) for v in loss_g] == [float(v.detach()) for v in loss_e]
    assert len({float(v.detach()) for v in loss_g}) == 8
    assert all(torch.equal(a, b) for a, b in zip(net_e.state_dict().values(), net_g.state_dict().values()))
    adam_e, adam_g = opt_e.state_dict()["state"], opt_g.state_dict()["state"]
    assert all(torch.equal(adam_e[i][k], adam_g[i][k]) for i in adam_e for k in adam_e[i])
    step = call.step
    assert step.ready and step.calls == 8 and cuda.replays == 8 - step.warmup
    # no copy per replay: each replay's loss is a view of the slot of the graph's loss ring it wrote
    assert all(v._base is step._losses for v in loss_g[step.warmup :])
    assert cuda.cache_during_capture == [False] and torch.is_autocast_cache_enabled()
    assert age.v[age.SEQ] == 2 * 8  # odd while each call runs, even after: 8 train steps
    assert len(said) == 1 and said[0].startswith("train step graph ready in") and said[0].endswith(" s, graphed")


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
    step = stage_step("none", net, tgt_net, optimizer, buffer, 32, target_sync=8)
    pace = Pacer(torch.device("cuda"))
    frame_idx, loaded, losses = 0, {k: v.clone() for k, v in tgt_net.state_dict().items()}, []
    with syncs:
        for item in stream[-3:]:  # three Queue items
            pace()
            apply_to_device(buffer, item)
            for _ in range(2):
                frame_idx += 4
                losses.append(step(frame_idx).detach())
        mean = torch.stack(losses).mean()
    assert syncs.counts == Counter(event_sync=2), syncs.counts
    assert [e.blocking for e in syncs.events] == [True] * 2  # made once, recorded in turn
    assert torch.isfinite(mean) and step.step.calls == 6
    assert any(not torch.equal(v, loaded[k]) for k, v in tgt_net.state_dict().items())  # synced at frame 8


def stand_in_loop(monkeypatch, items: int = 50, steps_per_item: int = 2):
    """Stage 08's trainer for ``items`` Queue items of ``steps_per_item`` train steps each, in the
    branches CUDA takes (on CPU: the Pacer made for a CUDA device, the ring written through its
    staging path with the events a CUDA ring records, the graph form on the stand-in); the events
    made (``HostSyncs``' counting ``torch.cuda.Event``) after each item, and the step."""
    syncs = HostSyncs(monkeypatch)
    buffer = DeviceReplayBuffer(200, 2, staged=True, host_gather=False)
    buffer._device_runs_behind = True  # as on CUDA: an event recorded after each copy
    stream = list(vector_stream(2, 60 + items, seed=7, frame_shape=(84, 84)))
    for item in stream[:60]:
        apply_to_device(buffer, item)
    net, tgt_net = nets()
    optimizer = torch.optim.Adam(net.parameters(), lr=LR, **adam_options("cpu"))
    call = stage_step("graph", net, tgt_net, optimizer, buffer, 32, target_sync=40)
    cuda = StandInCuda(monkeypatch, (net, tgt_net, optimizer))
    cuda.captured = (call.step, (buffer, 32, net, tgt_net, optimizer, PARAMS, torch.device("cpu"), "bf16"))
    pace = Pacer(torch.device("cuda"))
    made, frame_idx = [], 0
    for item in stream[60 : 60 + items]:
        pace()
        apply_to_device(buffer, item)
        for _ in range(steps_per_item):
            frame_idx += 4
            call(frame_idx)
        made.append(len(syncs.events))
    return made, call.step


def test_a_stand_in_run_of_stage_08_makes_no_event_per_step_or_item(monkeypatch):
    """100 train steps over 50 Queue items: the events are made at the first item (the Pacer's
    two, one per staging buffer of the ring's writes) and reused after it: none per train step,
    none per Queue item (the event timers of the run's probes are pooled, ``lib.run.timing``)."""
    made, step = stand_in_loop(monkeypatch)
    assert step.calls == 100 and step._graph is not None
    assert made[0] == 2 + 4  # the Pacer's two, the ring's four staging buffers' (its fill made them)
    assert made == [made[0]] * 50


def test_the_pinned_stager_makes_its_events_once(monkeypatch):
    """Stage 04's staging: one event per buffer set, made at the first batch, none per batch after."""
    from lib.buffer import ReplayBuffer
    from lib.staging import PinnedStager

    syncs = HostSyncs(monkeypatch)
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda t: t)  # a CPU build pins nothing
    buffer = ReplayBuffer(100)
    state = np.zeros((4, 84, 84), dtype=np.uint8)
    buffer.start_episode(state)
    for i in range(40):
        buffer.add_step(i % 6, 0.0, False, state[0], False)
    stager = PinnedStager(torch.device("cpu"))
    stager.enabled = True  # the CUDA branch
    with syncs:
        for _ in range(20):
            stager.sample(buffer, 8)
    assert len(syncs.events) == 2
    assert syncs.counts["event_sync"] == 19  # from the second batch on, each waits on its set's last event


def test_a_replays_own_generator_is_registered_with_the_graph_and_refused_by_compile(monkeypatch):
    """``DeviceReplayBuffer(generator=...)``: the graph form registers the generator with the graph
    before capture (its state then advances at each replay); torch's default needs nothing; the
    compiled form refuses it in one line before compiling."""
    generator = torch.Generator().manual_seed(3)
    registered = {}
    for name, gen in (("own", generator), ("default", None)):
        buffer = pixel_ring()
        buffer.generator = gen
        net, tgt_net = nets()
        optimizer = torch.optim.Adam(net.parameters(), lr=LR, **adam_options("cpu"))
        call = stage_step("graph", net, tgt_net, optimizer, buffer, 32)
        cuda = StandInCuda(monkeypatch, (net, tgt_net, optimizer))
        cuda.captured = (call.step, (buffer, 32, net, tgt_net, optimizer, PARAMS, torch.device("cpu"), "bf16"))
        for i in range(call.step.warmup + 2):
            call(4 * (i + 1))
        registered[name] = cuda.registered
    assert registered["own"] == [generator] and registered["default"] == []
    buffer = pixel_ring()
    buffer.generator = generator
    net, tgt_net = nets()
    optimizer = torch.optim.Adam(net.parameters(), lr=LR, **adam_options("cpu"))
    monkeypatch.setattr(torch, "compile", lambda fn, mode=None: fn)
    with pytest.raises(ValueError, match="its own generator cannot be compiled") as refused:
        stage_step("compile", net, tgt_net, optimizer, buffer, 32)(4)
    assert "\n" not in str(refused.value)


def test_the_compiled_forms_replay_tensors_are_made_and_marked_static_before_compiling(monkeypatch):
    """``--capture compile``: when the compiled step is first called (Dynamo traces it then), the
    buffers ``sample()`` writes for this batch size exist already, and they, the ring's frames and
    the rest of the replay's tensors are marked static, so that a CUDA-graph tree may hold them;
    off CUDA the step says it is not graphed, and why, once ready."""
    seen = []

    def fake_compile(fn, mode=None):
        assert mode == "reduce-overhead"

        def compiled(*args):
            buffer = args[0]
            if not seen:
                made = 32 in buffer._out
                marked = [getattr(t, "_dynamo_static_input_type", None) for t in buffer.static_tensors(32)]
                seen.append((made, marked))
            return fn(*args)

        return compiled

    monkeypatch.setattr(torch, "compile", fake_compile)
    buffer = pixel_ring()
    assert buffer._out == {}
    net, tgt_net = nets()
    optimizer = torch.optim.Adam(net.parameters(), lr=LR, **adam_options("cpu"))
    said = []
    call = stage_step("compile", net, tgt_net, optimizer, buffer, 32)
    call.step.log = said.append
    for i in range(call.step.warmup + 1):
        call(4 * (i + 1))
    ((made, marked),) = seen
    assert made and len(marked) == 11 and set(marked) == {"unguarded"}
    assert call.step.graphed == "not graphed: no CUDA graph on cpu"
    assert said == [f"train step compile ready in {call.step.prepare_seconds:.1f} s, not graphed: no CUDA graph on cpu"]


# -- CUDA: the captured step ------------------------------------------------------------------


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
        step = stage_step(form, net, tgt_net, optimizer, buffer, batch_size, target_sync=16)
        rng = np.random.default_rng(1)
        start = [p.detach().clone() for p in net.parameters()]
        losses = []
        for i in range(steps):
            fixed.copy_(torch.from_numpy(rng.choice(valid_slots(buffer), batch_size)))
            losses.append(step(4 * (i + 1)).clone())
        runs[form] = (torch.stack(losses), [p.detach() for p in net.parameters()], start, step.step)
    (loss_e, params_e, start, _), (loss_g, params_g, _, graph_step) = runs["none"], runs["graph"]
    assert graph_step._graph is not None and graph_step.ready  # steps 5-8 were replays
    torch.testing.assert_close(loss_g, loss_e, rtol=2e-2, atol=1e-4)
    for p_e, p_g, p0 in zip(params_e, params_g, start):
        assert (p_g - p_e).abs().mean() <= 0.05 * (p_e - p0).abs().mean() + 1e-8


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_stage_08s_loop_makes_no_event_per_step_or_item(monkeypatch):
    """Stage 08's trainer on a GPU, 50 Queue items of 2 captured train steps each: the events
    (torch.cuda.Event, counted as made) are made at the first item, none per step or item after;
    each replay's loss is a view of the graph's loss ring (no copy per step)."""
    made = []

    class Counted(torch.cuda.Event):
        def __init__(self, *args, **kwargs):
            made.append(self)

    monkeypatch.setattr(torch.cuda, "Event", Counted)
    buffer = pixel_ring("cuda")
    net, tgt_net = nets("cuda")
    optimizer = torch.optim.Adam(net.parameters(), lr=LR, **adam_options("cuda", "graph"))
    call = stage_step("graph", net, tgt_net, optimizer, buffer, 32, target_sync=40)
    pace = Pacer(torch.device("cuda"))
    after_item, frame_idx, losses = [], 0, []
    for item in list(vector_stream(2, 50, seed=11, frame_shape=(84, 84)))[:50]:
        pace()
        apply_to_device(buffer, item)
        for _ in range(2):
            frame_idx += 4
            losses.append(call(frame_idx))
        after_item.append(len(made))
    torch.cuda.synchronize()
    assert call.step.calls == 100 and call.step._graph is not None
    assert after_item == [after_item[0]] * 50 and after_item[0] <= 2 + 4
    assert all(v._base is call.step._losses for v in losses[-10:])
    assert torch.isfinite(torch.stack(losses).float()).all()


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_replays_and_ring_writes_never_synchronise():
    """After capture, train steps (with target syncs among them), ring writes and the loss
    mean run under torch.cuda.set_sync_debug_mode("error"): any hidden host sync raises."""
    buffer = pixel_ring("cuda")
    net, tgt_net = nets("cuda")
    optimizer = torch.optim.Adam(net.parameters(), lr=LR, **adam_options("cuda", "graph"))
    step = stage_step("graph", net, tgt_net, optimizer, buffer, 32, target_sync=8)
    frame_idx = 0
    while not step.step.ready:
        frame_idx += 4
        step(frame_idx)
    # A new stream opens an episode in every ring (its first item) before its steps: three steps.
    first, *more = vector_stream(2, 3, seed=11, frame_shape=(84, 84))
    apply_to_device(buffer, first)
    torch.cuda.synchronize()
    losses = []
    torch.cuda.set_sync_debug_mode("error")
    try:
        for item in more:
            apply_to_device(buffer, item)
            for _ in range(2):
                frame_idx += 4
                losses.append(step(frame_idx))
        mean = torch.stack(losses).mean()
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
    step = stage_step("graph", net, tgt_net, optimizer, buffer, 32)
    frame_idx = 0
    while not step.step.ready:
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


def steps_without_recompiling(device: str, more_steps: int = 6):
    """The compile form on a small ring: warm up, then train steps with a target sync and ring
    writes among them under dynamo's error_on_recompile, which raises on any recompilation."""
    import torch._dynamo

    torch._dynamo.reset()
    buffer = pixel_ring(device)
    net, tgt_net = nets(device)
    optimizer = torch.optim.Adam(net.parameters(), lr=LR, **adam_options(device, "compile"))
    step = stage_step("compile", net, tgt_net, optimizer, buffer, 32, target_sync=8)
    frame_idx = 0
    while not step.step.ready or step.step.calls < step.step.warmup + 2:
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
    ring's contents and fill, the target's weights, the frame counter) is a guard. The step
    says whether it ran as CUDA graphs (on CUDA, as Inductor reported it)."""
    step = steps_without_recompiling(device)
    assert step.step.graphed == "graphed" or step.step.graphed.startswith("not graphed: ")
    if device == "cpu":
        assert step.step.graphed == "not graphed: no CUDA graph on cpu"

"""Stage 08's train step: sample, TD loss, backward, Adam, all on the device, in one launch on CUDA.

``td_update`` is the whole update as one function: zero the gradients, draw a batch from a
``DeviceReplayBuffer``, stage 07's loss (``calc_loss`` under bf16 autocast, or in plain fp32 with
``--precision fp32``, with channels_last and the target under inference_mode; the Q head stays
fp32 in the model), backward, and the
optimizer step; it returns the loss detached. Nothing in it reads a device value on the host,
and every shape is fixed by the batch size, so it can be captured.

``TrainStep`` runs it in one of three forms (``capture``):
- ``none``: eagerly, as stage 07 does (the CPU form: no extra work per step).
- ``graph`` (CUDA): a few eager calls on a side stream, so that Adam's state exists, then one
  capture into a ``torch.cuda.CUDAGraph``; each later call is one ``replay()``. Adam must be
  built with ``capturable=True`` (``lib.optimizer.adam_options``), which keeps its step counters on the device.
- ``compile``: ``torch.compile(td_update, mode="reduce-overhead")``, for comparison.

Why hand capture is the default on CUDA (the design choice, to be confirmed by measurement):
capture happens below Python, so ``zero_grad``, ``backward`` and Adam's step, which
``torch.compile(fullgraph=True)`` cannot hold in torch 2.13, are captured whole; the result is
one graph of a few hundred kernels replayed with one launch, with no guards to check and no
recompilation. ``reduce-overhead`` splits the step at its graph breaks into several compiled
pieces, each its own CUDA graph with Python and guard checks in between, compiles for tens of
seconds first, and may overwrite its outputs between calls. Hand capture costs the rules it
relies on: fixed shapes, no host reads, and tensors that keep their addresses (the ring's, the
nets', Adam's state), which this module and ``DeviceReplayBuffer`` keep.
The three forms are measured side by side by ``python -m lib.bench.trainstep --device cuda
--capture none,graph,compile`` (batch 128; part of ``results/gpu_check.sh``), and the figures go
to ``results/gpu-*/``, not here. Until a GPU run says otherwise, ``auto`` picks the hand capture.

The target net's sync stays outside the graph: whether it is due follows from the host's frame
counter, which the host knows without asking the device, and when due it is ``load_state_dict``,
ten device-to-device copies into the target's parameters in place (the addresses the graph
reads), once every ``target_net_sync`` frames; inside the graph it would cost a masked copy of
every weight on every step.

The losses are summed on the device (``mean_loss`` reads the mean since its last call), so that
the loss reaches TensorBoard every few hundred steps with one read, not one sync per step.
"""

from __future__ import annotations

import time

import torch

from lib.knobs import resolve_capture
from lib.loss import calc_loss
from lib.runtime import wait_event
from lib.schedules import crossed

WARMUP_CALLS = (
    3  # eager calls on a side stream before a capture (08's step: Adam's state must exist; PyTorch's docs use 3)
)


def td_update(
    net, tgt_net, optimizer, buffer, batch_size: int, gamma: float, autocast_cache: bool = True, bf16: bool = True
):
    """One train step of stage 07's form on a batch drawn from ``buffer``; the loss, detached.
    ``autocast_cache`` False under capture (autocast's cast cache must not outlive a capture);
    ``bf16`` False: autocast off, plain fp32 (``--precision fp32``)."""
    device = buffer.device
    optimizer.zero_grad()
    batch = buffer.sample(batch_size)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16, cache_enabled=autocast_cache):
        loss_v = calc_loss(
            batch, net, tgt_net, gamma, device, non_blocking=True, channels_last=True, inference_target=True
        )
    loss_v.backward()
    optimizer.step()
    return loss_v.detach()


class TrainStep:
    """``step(frame_idx)``: sync the target net when due (stage 07's rule: the counter crossed a
    multiple of ``target_sync`` since ``frame_idx - steps``), then one ``td_update``. Returns
    the loss as a device tensor, detached; under ``graph`` and ``compile`` it is the step's
    static output, overwritten by the next call (``mean_loss`` is the way to read losses).
    ``ready``: capture (or compilation) is behind, the calls from now on are steady-state."""

    def __init__(
        self,
        net,
        tgt_net,
        optimizer,
        buffer,
        batch_size: int,
        gamma: float,
        target_sync: int,
        steps: int,
        capture: str = "none",
        warmup: int = WARMUP_CALLS,
        precision: str = "bf16",
    ):
        self.net, self.tgt_net, self.optimizer, self.buffer = net, tgt_net, optimizer, buffer
        self.precision = precision  # "bf16" (autocast) or "fp32" (--precision)
        self.batch_size, self.gamma, self.target_sync, self.steps = batch_size, gamma, target_sync, steps
        self.capture = resolve_capture(capture, buffer.device.type)
        self.warmup = warmup
        self.calls = 0
        self.prepare_seconds = 0.0  # warm-up, capture and compilation, not steady-state
        self._loss_sum = torch.zeros((), dtype=torch.float32, device=buffer.device)
        self._loss_count = 0
        self._graph = None
        self._side_stream = None
        self._static_loss = None
        self._compiled = None
        self.weights_age = None  # lib.parallel.WeightsAge: a captured or compiled step calls no optimizer hooks
        if self.capture == "compile":
            self._compiled = torch.compile(self._update, mode="reduce-overhead")

    @property
    def ready(self) -> bool:
        return self.capture == "none" or self.calls > self.warmup

    def _update(self, autocast_cache: bool = True):
        return td_update(
            self.net,
            self.tgt_net,
            self.optimizer,
            self.buffer,
            self.batch_size,
            self.gamma,
            autocast_cache,
            self.precision == "bf16",
        )

    def __call__(self, frame_idx: int):
        if crossed(frame_idx - self.steps, frame_idx, self.target_sync):
            self.tgt_net.load_state_dict(self.net.state_dict())
        self._loss_count += 1
        if self.capture == "none":
            self.calls += 1
            loss_v = self._update()
            self._loss_sum.add_(loss_v)
            return loss_v
        preparing = not self.ready
        started = time.perf_counter()
        if self.weights_age is not None:
            self.weights_age.writing()
        if self.capture == "compile":
            torch.compiler.cudagraph_mark_step_begin()
            loss_v = self._compiled()
            # Outside the compiled function: a mutated input would keep it out of a CUDA graph.
            self._loss_sum.add_(loss_v)
        else:
            loss_v = self._graph_call()
        if self.weights_age is not None:
            self.weights_age.written()
        self.calls += 1
        if preparing:
            self.prepare_seconds += time.perf_counter() - started
        return loss_v

    def _graph_call(self):
        if self._graph is not None:
            self._graph.replay()
            return self._static_loss
        if self.calls < self.warmup:
            # Eager on a side stream, as PyTorch's capture recipe asks: real train steps that
            # also create Adam's state before capture.
            if self._side_stream is None:
                self._side_stream = torch.cuda.Stream()
            side = self._side_stream
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                loss_v = self._update(autocast_cache=False)
                self._loss_sum.add_(loss_v)
            torch.cuda.current_stream().wait_stream(side)
            return loss_v
        graph = torch.cuda.CUDAGraph()
        self.optimizer.zero_grad(set_to_none=True)  # backward in the graph allocates the grads it reuses
        with torch.cuda.graph(graph):
            self._static_loss = self._update(autocast_cache=False)
            self._loss_sum.add_(self._static_loss)
        self._graph = graph
        graph.replay()  # capture records the step without running it
        return self._static_loss

    def mean_loss(self):
        """Mean loss of the calls since the last ``mean_loss`` (a device tensor; None if none)."""
        if self._loss_count == 0:
            return None
        mean = self._loss_sum / self._loss_count
        self._loss_sum.zero_()
        self._loss_count = 0
        return mean


class Pacer:
    """``pace()`` once per Queue item: the trainer waits for the device to finish everything it
    queued up to the previous item (an event per item, waited on one item later), so it is
    never more than one item's ring write and train steps ahead. Without it the host could
    queue replays far ahead of the device, and the play process's acting forward, which shares
    the GPU, would wait behind them. The events are blocking (``lib.runtime.wait_event``): a
    wait as long as an item's train steps sleeps rather than spins. A no-op off CUDA."""

    def __init__(self, device):
        self.device = torch.device(device)
        self._previous = None

    def __call__(self) -> None:
        event = wait_event(self.device)
        if event is None:
            return
        event.record()
        if self._previous is not None:
            self._previous.synchronize()
        self._previous = event

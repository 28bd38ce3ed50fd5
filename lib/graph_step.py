"""Stage 08's trick: its train step (sample, TD loss, backward, Adam, all on the device) captured
as one CUDA graph and replayed with one launch a step. ``capture(train_step, form)`` wraps the
script's own ``train_step``, which reads no device value on the host and has every shape fixed
by the batch size; the forms are ``--capture``'s:

- ``none``: eagerly, as stage 07 runs its step (the CPU form: no extra work per step).
- ``graph`` (CUDA): WARMUP_CALLS eager calls on a side stream, so that Adam's state exists,
  then one capture into a ``torch.cuda.CUDAGraph``; each later call is one ``replay()``. Adam
  must be built with ``capturable=True`` (``lib.optimizer.adam_options``), which keeps its step
  counters on the device, and autocast's cast cache is off while a graph is made (a cached cast
  must not outlive the capture).
- ``compile``: ``torch.compile(train_step, mode="reduce-overhead")``, for comparison.

Why hand capture is what ``auto`` picks on CUDA: capture happens below Python, so
``zero_grad``, ``backward`` and Adam's step, which ``torch.compile(fullgraph=True)`` cannot hold
in torch 2.13, are captured whole: one graph of a few hundred kernels, one launch, no guards and
no recompilation. ``reduce-overhead`` splits the step at its graph breaks into several graphs
with Python and guard checks in between, and compiles for tens of seconds first. Hand capture
relies on fixed shapes, no host reads, and tensors that keep their addresses (the ring's, the
nets', Adam's state), which the script's step and ``DeviceReplayBuffer`` keep; the target
net's sync (``load_state_dict``, in place) keeps them too, so it stays in the script's loop.
``python -m lib.bench.trainstep --capture none,graph,compile`` times the three forms
(``results/gpu_check.sh``); the figures go to ``results/gpu-*/``.

A captured step's output is overwritten by the next replay: each call returns the loss as a
tensor of its own (a device copy, no host read), which the tracker keeps as it keeps 07's.
"""

from __future__ import annotations

import contextlib
import time

import torch

WARMUP_CALLS = (
    3  # eager calls on a side stream before a capture (08's step: Adam's state must exist; PyTorch's docs use 3)
)


def wait_event(device):
    """A CUDA event for a host thread to wait on (``record``, then ``synchronize``), made blocking
    (``cudaEventBlockingSync``): the waiting thread sleeps until the device signals it, where a
    default event's wait spins a core, one the play process's env threads could use. Waking
    costs some microseconds more than a spin sees. None off CUDA, where no work runs ahead of
    the host."""
    if torch.device(device).type != "cuda":
        return None
    return torch.cuda.Event(blocking=True)


def capture(train_step, form: str, log=None) -> Captured:
    """``train_step`` in the form ``form`` (``--capture``, resolved: none, graph or compile);
    ``log``, a print function, hears once how long warm-up and capture took."""
    return Captured(train_step, form, log)


@contextlib.contextmanager
def _no_cast_cache():
    """Autocast's cast cache off: a cast cached during a capture would outlive it."""
    was = torch.is_autocast_cache_enabled()
    torch.set_autocast_cache_enabled(False)
    try:
        yield
    finally:
        torch.set_autocast_cache_enabled(was)


class Captured:
    """``step(*args)``: the train step on ``args``, the same objects every call (a graph replays
    on the tensors it was captured with). Returns the loss, a tensor of its own.
    ``ready``: capture (or compilation) is behind, the calls from now on are steady-state."""

    def __init__(self, train_step, form: str, log=None, warmup: int = WARMUP_CALLS):
        self.train_step, self.capture, self.log, self.warmup = train_step, form, log, warmup
        self.calls = 0
        self.prepare_seconds = 0.0  # warm-up, capture and compilation, not steady-state
        self._graph = None
        self._side_stream = None
        self._static_loss = None
        self._compiled = None
        if form == "compile":
            self._compiled = torch.compile(train_step, mode="reduce-overhead")

    @property
    def ready(self) -> bool:
        return self.capture == "none" or self.calls > self.warmup

    def __call__(self, *args):
        if self.capture == "none":
            self.calls += 1
            return self.train_step(*args)
        preparing = not self.ready
        started = time.perf_counter()
        if self.capture == "compile":
            torch.compiler.cudagraph_mark_step_begin()
            loss_v = self._compiled(*args).detach().clone()  # its output may be overwritten by the next call
        else:
            loss_v = self._graph_call(args)
        self.calls += 1
        if preparing:
            self.prepare_seconds += time.perf_counter() - started
            if self.ready and self.log is not None:
                self.log(f"train step {self.capture} ready in {self.prepare_seconds:.1f} s")
        return loss_v

    def _graph_call(self, args):
        if self._graph is not None:
            self._graph.replay()
            return self._static_loss.clone()
        with _no_cast_cache():
            if self.calls < self.warmup:
                # Eager on a side stream, as PyTorch's capture recipe asks: real train steps that
                # also create Adam's state before capture.
                if self._side_stream is None:
                    self._side_stream = torch.cuda.Stream()
                side = self._side_stream
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    loss_v = self.train_step(*args).detach()
                torch.cuda.current_stream().wait_stream(side)
                if loss_v.is_cuda:  # used on the current stream: not freed for the side stream's reuse
                    loss_v.record_stream(torch.cuda.current_stream())
                return loss_v
            for arg in args:  # backward in the graph allocates the grads it reuses
                if isinstance(arg, torch.optim.Optimizer):
                    arg.zero_grad(set_to_none=True)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                self._static_loss = self.train_step(*args).detach()
            self._graph = graph
        graph.replay()  # capture records the step without running it
        return self._static_loss.clone()


class Pacer:
    """``pace()`` once per Queue item: the trainer waits for the device to finish everything it
    queued up to the previous item (an event per item, waited on one item later), so it is
    never more than one item's ring write and train steps ahead. Without it the host could
    queue replays far ahead of the device, and the play process's acting forward, which shares
    the GPU, would wait behind them. The events are blocking (``wait_event``): a
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

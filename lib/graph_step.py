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
  A replay drawn with a generator of its own (``DeviceReplayBuffer(generator=...)``) has it
  registered with the graph (``register_generator_state``), so that each replay draws anew.
- ``compile``: ``torch.compile(train_step, mode="reduce-overhead")``, for comparison (a replay
  with a generator of its own is refused there, in one line). CUDA-graph
  trees hold only inputs that keep their addresses and are marked static (Dynamo marks the
  nets' parameters and buffers); so before the first compiled call the replay's tensors,
  the ring's frames and the buffers ``sample()`` writes among them, are made and marked
  (``DeviceReplayBuffer.static_tensors``, ``torch._dynamo.mark_static_address``). Whether
  Inductor then ran the step as CUDA graphs is read from what it reports while compiling
  (its cudagraph skip counter and the reason it logs), never assumed: ``graphed`` says it.

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

A captured step's output is overwritten by the next replay, and a copy of it per step would be
one more launch beside the graph's one. So the graph itself writes each step's loss into a slot
of a device ring of ``LOSS_SLOTS`` (its slot counter a device tensor, advanced in the graph), and
each call returns a view of that step's slot (made on the host, no kernel): the tracker keeps
these as it keeps 07's losses and reads them only at its log points, every
``lib.schedules.LOSS_FRAMES`` agent steps, before the ring comes round to them again.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import time

import torch

from lib.schedules import LOSS_FRAMES

WARMUP_CALLS = (
    3  # eager calls on a side stream before a capture (08's step: Adam's state must exist; PyTorch's docs use 3)
)
# A captured step's losses: the tracker holds those since its last log point, at most one a frame.
LOSS_SLOTS = LOSS_FRAMES + 2


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
    on the tensors it was captured with). Returns the loss, a tensor no later call overwrites
    within ``LOSS_SLOTS`` calls (a graph's: a view of its loss ring).
    ``ready``: capture (or compilation) is behind, the calls from now on are steady-state."""

    def __init__(self, train_step, form: str, log=None, warmup: int = WARMUP_CALLS):
        self.train_step, self.capture, self.log, self.warmup = train_step, form, log, warmup
        self.calls = 0
        self.prepare_seconds = 0.0  # warm-up, capture and compilation, not steady-state
        self._graph = None
        self._side_stream = None
        self._static_loss = None
        self._losses = None  # the graph's loss ring (LOSS_SLOTS) and its device-side slot counter
        self._loss_slot = None
        self._replays = 0
        self._warm_loss = None
        self._graphed = "not graphed: eager" if form == "none" else None
        self._skips = None  # while compiling on CUDA: Inductor's cudagraph skips, as it reports them
        self._compiled = None
        if form == "compile":
            self._compiled = torch.compile(train_step, mode="reduce-overhead")

    @property
    def graphed(self) -> str | None:
        """Once ready: "graphed", or "not graphed: <why>", as torch reported it."""
        return self._graphed

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
            if self.calls == 0:
                self._before_compiling(args)
            torch.compiler.cudagraph_mark_step_begin()
            with self._skips if preparing and self._skips is not None else contextlib.nullcontext():
                loss_v = self._compiled(*args).detach().clone()  # its output may be overwritten by the next call
        else:
            loss_v = self._graph_call(args)
        self.calls += 1
        if preparing:
            self.prepare_seconds += time.perf_counter() - started
            if self.ready:
                if self._graphed is None:
                    self._graphed = self._skips.verdict() if self._skips is not None else "graphed"
                if self.log is not None:
                    self.log(f"train step {self.capture} ready in {self.prepare_seconds:.1f} s, {self._graphed}")
        return loss_v

    def _before_compiling(self, args) -> None:
        """The replay's tensors made and marked static before Dynamo first traces the step, and
        Inductor's cudagraph skips listened to (off CUDA there is no CUDA graph to make)."""
        if self._own_generator(args) is not None:
            raise ValueError(
                "a replay drawn with its own generator cannot be compiled (--capture compile): "
                "use torch's default generator, or --capture graph, which registers it with the graph"
            )
        bound = inspect.signature(self.train_step).bind(*args).arguments
        buffer, device = bound.get("buffer"), torch.device(bound.get("device", "cpu"))
        if hasattr(buffer, "static_tensors"):
            for tensor in buffer.static_tensors(bound["batch_size"]):
                torch._dynamo.mark_static_address(tensor)
        if device.type == "cuda":
            self._skips = CudagraphSkips()
        else:
            self._graphed = f"not graphed: no CUDA graph on {device.type}"

    def _graph_call(self, args):
        if self._graph is not None:
            return self._replay()
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
                self._warm_loss = loss_v
                return loss_v
            for arg in args:  # backward in the graph allocates the grads it reuses
                if isinstance(arg, torch.optim.Optimizer):
                    arg.zero_grad(set_to_none=True)
            where = self._warm_loss.device if self._warm_loss is not None else torch.device("cuda")
            self._losses = torch.zeros(LOSS_SLOTS, dtype=torch.float32, device=where)
            self._loss_slot = torch.zeros(1, dtype=torch.int64, device=where)
            graph = torch.cuda.CUDAGraph()
            generator = self._own_generator(args)
            if generator is not None:  # its state advances in the graph, as the default one's does
                graph.register_generator_state(generator)
            with torch.cuda.graph(graph):
                self._captured_step(args)
            self._graph = graph
        return self._replay()  # capture records the step without running it

    def _own_generator(self, args):
        """The replay's own random generator (``DeviceReplayBuffer(generator=...)``), if not torch's default."""
        bound = inspect.signature(self.train_step).bind(*args).arguments
        generator = getattr(bound.get("buffer"), "generator", None)
        if generator is None or any(generator is g for g in torch.cuda.default_generators):
            return None
        return generator

    def _captured_step(self, args) -> None:
        """What the graph holds: the train step, and its loss written to the ring's next slot."""
        self._static_loss = self.train_step(*args).detach()
        self._losses.index_copy_(0, self._loss_slot, self._static_loss.reshape(1).to(self._losses.dtype))
        self._loss_slot.add_(1).remainder_(LOSS_SLOTS)

    def _replay(self):
        self._graph.replay()
        loss_v = self._losses[self._replays % LOSS_SLOTS]  # the slot this replay wrote: a view
        self._replays += 1
        return loss_v


class CudagraphSkips(logging.Handler):
    """``with skips:`` hears what Inductor reports of CUDA graphs it did not make: the reason it
    logs ("skipping cudagraphs due to ...") and its ``cudagraph_skips`` counter; ``verdict()``."""

    LOGGER = "torch._inductor.cudagraph_utils.__cudagraphs"

    def __init__(self):
        super().__init__(logging.WARNING)
        self.reasons: list[str] = []
        self.skipped = 0

    def emit(self, record) -> None:
        self.reasons.append(record.getMessage().splitlines()[0])

    def __enter__(self):
        from torch._dynamo.utils import counters

        self._before = counters["inductor"]["cudagraph_skips"]
        logging.getLogger(self.LOGGER).addHandler(self)
        return self

    def __exit__(self, *exc) -> None:
        from torch._dynamo.utils import counters

        logging.getLogger(self.LOGGER).removeHandler(self)
        self.skipped += counters["inductor"]["cudagraph_skips"] - self._before

    def verdict(self) -> str:
        if not self.skipped and not self.reasons:
            return "graphed"
        why = "; ".join(dict.fromkeys(self.reasons)) or "Inductor counted a skip and logged no reason"
        return f"not graphed: {why} ({self.skipped} of the step's compiled graphs skipped)"


class Pacer:
    """``pace()`` once per Queue item: the trainer waits for the device to finish everything it
    queued up to the previous item (an event recorded per item, waited on one item later), so it
    is never more than one item's ring write and train steps ahead. Without it the host could
    queue replays far ahead of the device, and the play process's acting forward, which shares
    the GPU, would wait behind them. Two events, made at the first item and recorded in turn (an
    event is waited on before it is recorded again); blocking (``wait_event``): a wait as long as
    an item's train steps sleeps rather than spins. A no-op off CUDA."""

    def __init__(self, device):
        self.device = torch.device(device)
        self._events = None
        self._items = 0

    def __call__(self) -> None:
        if self._events is None:
            if self.device.type != "cuda":
                return
            self._events = (wait_event(self.device), wait_event(self.device))
        self._events[self._items % 2].record()
        if self._items:
            self._events[(self._items - 1) % 2].synchronize()
        self._items += 1

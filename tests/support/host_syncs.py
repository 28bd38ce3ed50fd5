"""Counting what makes the host wait for a GPU, on a CPU: ``HostSyncs``.

``torch.cuda.set_sync_debug_mode("error")`` (the CUDA tests) flags a hidden sync but not an
explicit ``Event.synchronize()``, and it needs a GPU. Here the torch API a hot path could wait
through is patched to count its calls, so that a test on CPU, where the code takes the branches
it takes on CUDA, can hold a hot path to the waits it names:

- ``event_sync``: ``Event.synchronize()``. ``torch.cuda.Event`` is replaced by ``CountingEvent``,
  which a CPU build can make, so the code that builds CUDA events for ``torch.device("cuda")``
  runs here (``lib.graph_step.wait_event``); ``blocking`` records how each event was made.
- ``device_sync``: ``torch.cuda.synchronize()`` and ``torch.cuda.Stream.synchronize()``.
- ``item``: a tensor's value read into Python: ``.item()``, ``int()``, ``float()``, ``bool()``
  (``aten._local_scalar_dense``, counted by a dispatch mode, so that a read inside torch counts).
- ``nonzero``: ``aten.nonzero``, ``aten.masked_select`` and indexing by a bool tensor, whose
  output size waits for the data.
- ``cpu``: ``Tensor.cpu()`` and ``Tensor.tolist()``.
"""

from __future__ import annotations

import collections

import torch
from torch.utils._python_dispatch import TorchDispatchMode

READS = {torch.ops.aten._local_scalar_dense.default: "item"}
DATA_SIZED = {torch.ops.aten.nonzero.default, torch.ops.aten.masked_select.default}
INDEXING = {torch.ops.aten.index.Tensor, torch.ops.aten.index_put.default, torch.ops.aten.index_put_.default}


def _boolean_index(func, args) -> bool:
    """``t[mask]`` (or ``t[mask] = v``): indexing by a bool tensor, which finds the mask's True
    positions inside the kernel, below what a dispatch mode sees as ``nonzero``."""
    return func in INDEXING and any(
        isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in args[1] or ()
    )


class CountingEvent:
    """``torch.cuda.Event`` as a hot path uses it; each ``synchronize()`` counted."""

    counts: collections.Counter | None = None  # set by HostSyncs while it counts
    made: list | None = None

    def __init__(self, enable_timing=False, blocking=False, interprocess=False):
        self.blocking = blocking
        if self.made is not None:
            self.made.append(self)

    def record(self, stream=None) -> None:
        pass

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        if self.counts is not None:
            self.counts["event_sync"] += 1


class HostSyncs(TorchDispatchMode):
    """``with HostSyncs(monkeypatch) as syncs:`` counts (``syncs.counts``, a Counter) the calls
    named in this module's docstring made inside the block; ``syncs.events``: the events made
    (``torch.cuda.Event`` stays replaced until the test ends, so that an event made here and
    waited on later is still a ``CountingEvent``)."""

    def __init__(self, monkeypatch):
        super().__init__()
        self.counts: collections.Counter = collections.Counter()
        self.events: list[CountingEvent] = []
        self.active = False
        mp = monkeypatch
        mp.setattr(torch.cuda, "Event", CountingEvent)
        mp.setattr(CountingEvent, "made", self.events)
        mp.setattr(torch.cuda, "synchronize", lambda device=None: self._count("device_sync"))
        mp.setattr(torch.cuda.Stream, "synchronize", lambda stream: self._count("device_sync"))
        for name in ("cpu", "tolist"):
            mp.setattr(torch.Tensor, name, self._counted(getattr(torch.Tensor, name), "cpu"))

    def _count(self, key: str) -> None:
        if self.active:
            self.counts[key] += 1

    def _counted(self, method, key):
        def counted(tensor, *args, **kwargs):
            self._count(key)
            return method(tensor, *args, **kwargs)

        return counted

    def __enter__(self):
        self.active, CountingEvent.counts = True, self.counts
        return super().__enter__()

    def __exit__(self, *exc):
        self.active, CountingEvent.counts = False, None
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in READS:
            self._count(READS[func])
        elif func in DATA_SIZED or _boolean_index(func, args):
            self._count("nonzero")
        return func(*args, **(kwargs or {}))

"""Stage 04's trick: batches sampled straight into pinned host memory, so that their copy to the GPU need not wait."""

from __future__ import annotations

import numpy as np
import torch


class PinnedStager:
    """Samples batches straight into reused pinned host buffers (two sets, used in turn).

    Before a set is written again, the CPU waits for the event recorded after the copy that
    last read it (one event per set, made at the first sample and recorded again each turn);
    pinning a fresh tensor every step would cost more than a plain copy.
    On a CPU device it just returns the buffer's arrays.
    """

    def __init__(self, device: torch.device, slots: int = 2):
        self.device = torch.device(device)
        self.enabled = self.device.type == "cuda"
        self._slots = slots
        self._sets: dict[int, list] = {}
        self._events = None
        self._recorded = [False] * slots
        self._turn = 0

    def sample(self, buffer, batch_size: int):
        if not self.enabled:
            return buffer.sample(batch_size)
        if self._events is None:
            self._events = [torch.cuda.Event() for _ in range(self._slots)]
        prev = (self._turn - 1) % self._slots
        # Everything enqueued so far (the copies of the previous batch) precedes this event.
        self._events[prev].record()
        self._recorded[prev] = True
        slot = self._turn
        self._turn = (self._turn + 1) % self._slots
        if self._recorded[slot]:
            self._events[slot].synchronize()
            self._recorded[slot] = False
        tensors = self._buffers(slot, batch_size, buffer)
        buffer.sample(batch_size, out=tuple(t.numpy() for t in tensors))
        return tensors

    def _buffers(self, slot: int, batch_size: int, buffer):
        key = (slot, batch_size)
        if key not in self._sets:
            self._sets[key] = [
                torch.from_numpy(np.empty(shape, dtype)).pin_memory()
                for shape, dtype in buffer.batch_layout(batch_size)
            ]
        return self._sets[key]

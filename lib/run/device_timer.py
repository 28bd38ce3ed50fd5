"""The device's part of time by part: CUDA event pairs around each train step, read without
waiting (lib.run.timing's clocks book them).
"""

from __future__ import annotations

import collections

import torch


class DeviceTimer:
    """CUDA event pairs around each run of a device part. ``collect`` sums the pairs whose end has
    completed (``Event.query``: no waiting) unless ``wait``; the rest wait for the next call. Pairs
    ended before ``mark`` count in ``before``, the others in ``after``."""

    def __init__(self):
        self.pending = collections.deque()
        self.free: list = []
        self.before = self.after = 0.0
        self.marked = False
        self._begin = None

    def _event(self):
        return self.free.pop() if self.free else torch.cuda.Event(enable_timing=True)

    def begin(self) -> None:
        self._begin = self._event()
        self._begin.record()

    def end(self) -> None:
        if self._begin is not None:
            event = self._event()
            event.record()
            self.pending.append((self._begin, event, self.marked))
            self._begin = None

    def collect(self, wait: bool = False) -> float:
        """Seconds over all pairs read so far (``after`` only, once marked)."""
        while self.pending:
            begin, end, after = self.pending[0]
            try:
                if not wait and not end.query():
                    break
                end.synchronize()  # complete already, unless ``wait`` (the run's end)
            except RuntimeError:  # the device failed: the run's own error says so; these pairs are lost
                self.pending.clear()
                break
            seconds = begin.elapsed_time(end) / 1000.0
            if after:
                self.after += seconds
            else:
                self.before += seconds
            self.pending.popleft()
            self.free += [begin, end]
        return self.after if self.marked else self.before + self.after

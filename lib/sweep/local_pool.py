"""The local pool: the runs of a sweep on this machine, side by side while its cores and GPUs
allow (``--per-run-gpus 0.25`` packs four runs on one GPU), each followed by a thread of the
driver; the rest wait their turn.
"""

from __future__ import annotations

import glob
import os
import queue
import sys
import threading

import torch

from lib.run.cli import UsageError
from lib.sweep.grid import RunSpec
from lib.sweep.launch import STOP_GRACE, execute


def _visible_gpus() -> list[str]:
    """The CUDA devices this process may use, as CUDA_VISIBLE_DEVICES entries."""
    if sys.platform.startswith("linux") and not glob.glob("/dev/nvidia[0-9]*"):
        return []  # no NVIDIA device node: no need to ask CUDA to know
    try:
        count = torch.cuda.device_count()
    except RuntimeError:
        count = 0
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [g.strip() for g in listed.split(",") if g.strip()][:count]
    return [str(i) for i in range(count)]


class LocalPool:
    """Runs on this machine, each in a thread of the driver that follows its process."""

    kind = "local"

    def __init__(self, cpus: float, gpus: float | None, parent: str, cores: int | None = None, gpu_names=None):
        """``cores``, ``gpu_names``: this machine's, unless given (CUDA_VISIBLE_DEVICES entries)."""
        if cores is None:
            cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        self.total_cpus = cores
        if gpu_names is None:
            gpu_names = _visible_gpus() if gpus is None or gpus > 0 else []
        self.gpu_names = list(gpu_names)
        self.cpus = cpus
        self.gpus = gpus if gpus is not None else (1.0 if self.gpu_names else 0.0)
        self.parent = parent
        self.events: queue.Queue = queue.Queue()
        self.free_cpus = float(self.total_cpus)
        self.free_gpus = [1.0] * len(self.gpu_names)
        self.held: dict = {}  # token -> [(gpu index, share)] of a running run
        self.stops: dict = {}  # token -> (stop, kill) events
        self.threads: dict = {}

    def check(self) -> None:
        if self.cpus > self.total_cpus + 1e-9:
            raise UsageError(f"--per-run-cpus {self.cpus:g}: this machine has {self.total_cpus} cores")
        if self.gpus > 0 and not self.gpu_names:
            raise UsageError(f"--per-run-gpus {self.gpus:g}: this machine has no CUDA GPU")
        if self.gpus > len(self.gpu_names):
            raise UsageError(f"--per-run-gpus {self.gpus:g}: this machine has {len(self.gpu_names)} GPUs")

    def describe(self) -> str:
        share = f"{self.gpus:g} GPU" if self.gpus else "no GPU"
        return (
            f"this machine ({self.total_cpus} cores, {len(self.gpu_names)} GPUs); per run {self.cpus:g} CPUs, "
            f"{share}: {self.slots()} at a time"
        )

    def slots(self) -> int:
        n = int(self.total_cpus / self.cpus + 1e-9)
        if 0 < self.gpus <= 1:
            n = min(n, len(self.gpu_names) * int(1 / self.gpus + 1e-9))
        elif self.gpus > 1:
            n = min(n, len(self.gpu_names) // int(self.gpus))
        return max(n, 1)

    def _gpu_pick(self):
        if self.gpus <= 0:
            return []
        if self.gpus <= 1:
            for i, free in enumerate(self.free_gpus):
                if free >= self.gpus - 1e-9:
                    return [(i, self.gpus)]
            return None
        whole = [i for i, free in enumerate(self.free_gpus) if free >= 1 - 1e-9]
        return [(i, 1.0) for i in whole[: int(self.gpus)]] if len(whole) >= self.gpus else None

    def can_start(self) -> bool:
        return self.free_cpus >= self.cpus - 1e-9 and self._gpu_pick() is not None

    def reserve(self, token) -> list[str]:
        """Take a run's share of the cores and GPUs (can_start() said there is one); its GPUs."""
        picks = self._gpu_pick()
        self.free_cpus -= self.cpus
        for i, share in picks:
            self.free_gpus[i] -= share
        self.held[token] = picks
        return [self.gpu_names[i] for i, _ in picks]

    def release(self, token) -> None:
        picks = self.held.pop(token, None)
        if picks is None:
            return
        self.free_cpus += self.cpus
        for i, share in picks:
            self.free_gpus[i] += share
        self.stops.pop(token, None)

    def start(self, token, spec: RunSpec, resume, keep: str | None = None) -> None:
        """Start a run; ``keep``: the sweep's folder of the run, where its rings are linked as it writes them."""
        gpu_ids = self.reserve(token)
        stop, kill = self.stops[token] = (threading.Event(), threading.Event())

        def follow():
            try:
                for kind, payload in execute(spec, self.parent, resume, gpu_ids, stop, kill, keep=keep):
                    self.events.put((token, kind, payload))
            except Exception as e:  # noqa: BLE001  (whatever stops the follower, the run counts as dead)
                self.events.put((token, "died", f"{type(e).__name__}: {e}"))

        thread = self.threads[token] = threading.Thread(target=follow, name=f"run-{spec.key}", daemon=True)
        thread.start()

    def poll(self, timeout: float) -> list:
        out = []
        try:
            item = self.events.get(timeout=timeout)
            while True:
                out.append(item)
                if item[1] in ("end", "died"):
                    self.release(item[0])
                item = self.events.get_nowait()
        except queue.Empty:
            pass
        return out

    def stop(self) -> None:
        for stop, _ in self.stops.values():
            stop.set()

    def kill(self) -> None:
        """A second Ctrl-C: no more grace."""
        for stop, kill in self.stops.values():
            stop.set()
            kill.set()

    def close(self) -> None:
        for thread in self.threads.values():
            thread.join(timeout=STOP_GRACE + 5)

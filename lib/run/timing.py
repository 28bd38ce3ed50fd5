"""Time by part: where a run's wall time goes, in each of its processes, from cheap monotonic timers.

A ``PartClock`` splits one process's time into named parts. ``clock.start("env")`` says "from
here on, time goes to env" and ends the part before, so the laps cover the process's time
without a gap. No loop calls it: timed stand-ins are built once, before the loop
(``clock.timed``, by ``lib.run.probes.time_by_part`` from the parts a stage hands ``Run.parts``):
``clock.timed(env, step="env", reset="env")`` is the env with each step and reset timed as
``env``, ``clock.timed(choose_action, "act")`` the action choice timed as ``act``. A timed call starts its part and, when it returns, gives the time back
to the part it interrupted: the clock's ``rest`` part (the trainer's ``log``, the play
process's ``env``) when the loop made the call. A loop then reads as it would untimed, and every
moment of it still goes to one part. A lap costs a ``time.perf_counter`` and a few writes into
a small float64 tensor (one slot per part, then the time and index of the part in progress),
nothing else: no device sync, no message.

The parts (seconds per 1,000 frames in ``summary.json``, the TIME line and TensorBoard):

- play side (03-08's play process; 01-02's one process plays too): ``env`` the env step (and
  the reset, and making the Queue item: in the play process, the rest of its loop), ``act``
  the action choice (on CUDA: its one wait for the actions), ``put`` the Queue put, waiting for
  room included; ``lag_wait`` the wait for the trainer before acting at ``--lag zero``
  (``lib.run.probes.weights_age``); ``stalled`` a silence: the play process sent nothing for
  longer than ``lib.parallel.STALL_SECONDS`` of the trainer's waiting (stopped, hung, starved),
  booked from the trainer's side (``stall``) from the start of its wait to the play process's
  next lap, whatever part was open;
- trainer side: ``get`` the Queue get (waiting, and unpickling the item), ``write`` the replay
  write, ``step`` sampling and the train step (08's includes the target sync; 01-07's sync, a
  copy of the weights every 1,000 frames, falls between them, in ``log``), ``pace`` the wait
  for the device (08's ``Pacer``), ``log`` the rest of the trainer's loop: game ends, losses,
  progress lines, checkpoints and these figures; ``other`` is the rest of the process's wall
  time (what no part covers: before the loop's first timed call), so that the parts add up to it.

The play process's clock sits in shared memory (``share_memory_`` on the tensor before the
process starts, which gets the clock in its ``parallel.PlayArgs``, ``probes``): the play process adds to it,
the trainer reads it at its log points and once at exit, before it stops the child. What the
play process is doing at that moment (a put that waits, say) counts up to the trainer's reading:
``time.perf_counter`` is the system-wide monotonic clock on Linux, the same in both processes.
Both processes' wall time is the trainer's: they run side by side over the same window.

On CUDA the trainer's clock also records a pair of CUDA events around every ``step`` part (the
device's time for sampling and the train step, which the host only launches); the pairs are read at log
points with ``Event.query`` (never waited for) and at exit. It is reported as ``device.step``.

The window: from the first train step (``mark``, where ``SpeedMeter`` starts f/s) to the reading,
over the same frames as f/s; a run that never trained is measured over the whole sitting.

Which part bounds the run (``bound``): each process's busy time is its wall time less its waits
(``put``, ``lag_wait``, ``stalled``, ``get``, ``pace``); on CUDA the device's busy time is ``device.step``. The busiest of
them bounds the run, and the bound is its largest part that is not a wait (``other`` left out):
``trainer:step`` when the trainer is the busiest and the train step its largest part,
``device:step`` when the device's train steps take longer than any process is busy.
"""

from __future__ import annotations

import time

import torch

from lib.run.device_timer import DeviceTimer

PLAY = ("env", "act", "put", "lag_wait", "stalled")
TRAINER = ("env", "act", "get", "pace", "write", "step", "log")  # env and act: 01-02 play in the trainer
WAITS = ("put", "lag_wait", "stalled", "get", "pace")
ORDER = ("env", "act", "put", "lag_wait", "stalled", "get", "pace", "write", "step", "log", "other", "wall")  # TIME's


class PartClock:
    """One process's seconds per part. ``start(part)`` charges the time since the last call to the
    part then in progress and starts ``part``; ``seconds(now)`` reads the totals, the part in
    progress included. ``timed`` makes the stand-ins that call ``start`` for a loop; between their
    calls time goes to ``rest``. ``shared=True`` puts the slots in shared memory (a play process's
    clock, passed to it in its ``PlayArgs``). ``device_parts`` are also timed on a CUDA ``device``
    by events."""

    def __init__(self, parts: tuple, rest: str | None = None, shared: bool = False, device=None, device_parts=()):
        self.parts = tuple(parts)
        self.rest = rest
        self._index = {p: i for i, p in enumerate(self.parts)}
        self._since = len(self.parts)  # slot: perf_counter when the part in progress started (0: none)
        self._current = self._since + 1  # slot: the index of the part in progress
        self._slots = torch.zeros(len(self.parts) + 2, dtype=torch.float64)
        if shared:
            self._slots.share_memory_()
        self._view = self._slots.numpy()
        cuda = device is not None and torch.device(device).type == "cuda"
        self.device = DeviceTimer() if cuda and device_parts else None
        self._device_parts = set(device_parts)
        self._part = None

    def __getstate__(self):  # a play process gets the shared slots, not the numpy view or events
        return {"parts": self.parts, "rest": self.rest, "slots": self._slots}

    def __setstate__(self, state):
        self.__init__(state["parts"], state["rest"])
        self._slots, self._view = state["slots"], state["slots"].numpy()

    def start(self, part: str) -> None:
        now = time.perf_counter()
        view = self._view
        if view[self._since] > 0:  # the part in progress as the slots say (``stall`` may have changed it)
            view[int(view[self._current])] += now - view[self._since]
        view[self._since] = now
        view[self._current] = self._index[part]
        if self.device is not None:
            if self._part in self._device_parts:
                self.device.end()
            if part in self._device_parts:
                self.device.begin()
        self._part = part

    def timed(self, target, part: str | None = None, **methods: str) -> StandIn:
        """A stand-in for ``target`` whose calls are timed: calling it is timed as ``part``, and
        calling each method named in ``methods`` as the part given for it
        (``clock.timed(buffer, add="write", sample="step")``); everything else is ``target``'s own.
        A timed call gives the time back to the part it interrupted (``rest`` when none was in
        progress); one made within a call of the same part adds no lap."""
        if self.rest is None:
            raise ValueError("timed stand-ins need the clock's rest part")
        calls = {name: self._timing(p, getattr(target, name)) for name, p in methods.items()}
        return StandIn(target, self._timing(part, target) if part is not None else None, calls)

    def _timing(self, part: str, call):
        if part not in self._index:
            raise ValueError(f"unknown part {part!r} (this clock's: {', '.join(self.parts)})")

        def timed_call(*args, **kwargs):
            before = self._part
            if before == part:
                return call(*args, **kwargs)
            self.start(part)
            try:
                return call(*args, **kwargs)
            finally:
                self.start(before or self.rest)

        return timed_call

    def stall(self, since: float, part: str = "stalled") -> None:
        """Called from another process (the trainer, on a play process's shared clock): this process
        has been silent since ``since`` (a perf_counter reading). The part in progress is charged up
        to then, and from then on ``part`` is in progress, until this process's next lap ends it:
        the silence, and the rest of the call it fell in, go to ``part``, whatever call was open."""
        view = self._view
        begun = view[self._since]
        if begun > 0:  # nothing in progress (before the first lap): the silence is ``other``'s
            since = max(since, begun)
            view[int(view[self._current])] += since - begun
            view[self._current] = self._index[part]
            view[self._since] = since

    def seconds(self, now: float) -> dict[str, float]:
        """Seconds per part up to ``now`` (a perf_counter reading, of any process)."""
        slots = self._slots.clone().numpy()
        out = {p: float(slots[i]) for i, p in enumerate(self.parts)}
        if slots[self._since] > 0:
            out[self.parts[int(slots[self._current])]] += max(0.0, now - float(slots[self._since]))
        return out


class StandIn:
    """``PartClock.timed``'s stand-in: ``target`` for the loop, some of its calls timed. What is
    not timed (attributes, other methods, ``len``) is ``target``'s own."""

    def __init__(self, target, call, methods: dict):
        self._target = target
        self._call = call
        self.__dict__.update(methods)

    def __call__(self, *args, **kwargs):
        return self._call(*args, **kwargs)

    def __getattr__(self, name):
        if name == "_target":  # not set yet (a copy being made): no stand-in to forward to
            raise AttributeError(name)
        return getattr(self._target, name)

    def __len__(self) -> int:
        return len(self._target)


class RunClocks:
    """A run's clocks: ``trainer`` (this process; on CUDA its ``step`` also timed on the device)
    and ``play`` (shared, for a play process), the window they are read over, and what they
    give: summary figures, the TIME line, TensorBoard points."""

    def __init__(self, device, play: bool):
        self.trainer = PartClock(TRAINER, rest="log", device=device, device_parts=("step",))
        self.play = PartClock(PLAY, rest="env", shared=True) if play else None
        self._base = self._snapshot(time.perf_counter(), None)
        self._tb = None  # the snapshot of the last TensorBoard point
        self._last_read = None  # the snapshot ``figures`` took

    def _snapshot(self, now: float, frame_idx: int | None, wait: bool = False) -> dict:
        shot = {"t": now, "frame": frame_idx, "trainer": self.trainer.seconds(now)}
        if self.play is not None:
            shot["play"] = self.play.seconds(now)
        if self.trainer.device is not None:
            shot["device"] = {"step": self.trainer.device.collect(wait)}
        return shot

    def mark(self, frame_idx: int) -> None:
        """Training starts at ``frame_idx``: the window opens here (``SpeedMeter``'s start)."""
        if self.trainer._part is not None:  # the time up to here is charged to the part in progress
            self.trainer.start(self.trainer._part)
        if self.trainer.device is not None:
            self.trainer.device.marked = True
        self._base = self._snapshot(time.perf_counter(), frame_idx)
        self._tb = self._base  # the first training point covers the window from here

    def figures(self, frame_idx: int, start_frame: int, wait: bool = False) -> dict:
        """summary.json's ``time``: per process its wall seconds and seconds per 1,000 frames per part."""
        now = self._last_read = self._snapshot(time.perf_counter(), frame_idx, wait)
        base = self._base
        if base["frame"] is None:
            base = dict(base, frame=start_frame)
        return {"window": "train" if self._base["frame"] is not None else "sitting", **per_1000(base, now)}

    def log(self, writer, frame_idx: int, final: bool = False) -> None:
        """A TensorBoard point under time/ (seconds per 1,000 frames since the last point);
        ``final``: the run's last, as of the reading ``figures`` took at its end."""
        now = self._last_read if final else self._snapshot(time.perf_counter(), frame_idx)
        if self._tb is not None and frame_idx > self._tb["frame"]:
            figures = per_1000(self._tb, now)
            for name, value in flat(figures).items():
                writer.add_scalar(f"time/{name}", value, frame_idx)
        self._tb = now


def per_1000(base: dict, now: dict) -> dict:
    """Seconds per 1,000 frames per part between two snapshots, with each process's wall seconds."""
    frames = now["frame"] - base["frame"]
    wall = now["t"] - base["t"]
    scale = 1000.0 / frames if frames > 0 else 0.0
    out = {"frames": frames, "processes": {}}
    for proc in ("play", "trainer", "device"):
        if proc not in now:
            continue
        parts = {p: max(0.0, now[proc][p] - base[proc][p]) for p in now[proc]}
        if proc != "device":
            parts = {p: s for p, s in parts.items() if now[proc][p] > 0}  # the parts this stage has
            parts["other"] = max(0.0, wall - sum(parts.values()))
        entry = {"per_1000_frames": {p: round(s * scale, 4) for p, s in parts.items()}}
        if proc != "device":
            entry["wall_seconds"] = round(wall, 3)
            entry["seconds"] = {p: round(s, 4) for p, s in parts.items()}
        out["processes"][proc] = entry
    out["bound"] = bound(out["processes"]) if frames > 0 else None
    return out


def flat(figures: dict) -> dict[str, float]:
    """``{"play.env": s, ..., "trainer.wall": s, "device.step": s}`` in seconds per 1,000 frames, in ORDER."""
    out = {}
    for proc in ("play", "trainer", "device"):
        entry = figures["processes"].get(proc)
        if entry is None:
            continue
        parts = dict(entry["per_1000_frames"])
        if "wall_seconds" in entry and figures["frames"] > 0:
            parts["wall"] = round(entry["wall_seconds"] * 1000.0 / figures["frames"], 4)
        out.update({f"{proc}.{p}": parts[p] for p in ORDER if p in parts})
    return out


def bound(processes: dict) -> str | None:
    """``<process>:<part>``: the busiest process's (or the device's) largest part that is not a wait."""
    busy = {}
    for proc, entry in processes.items():
        parts = entry["per_1000_frames"]
        busy[proc] = sum(s for p, s in parts.items() if p not in WAITS)
    if not busy:
        return None
    proc = max(busy, key=busy.get)
    parts = {p: s for p, s in processes[proc]["per_1000_frames"].items() if p not in WAITS and p != "other"}
    return f"{proc}:{max(parts, key=parts.get)}" if parts else None

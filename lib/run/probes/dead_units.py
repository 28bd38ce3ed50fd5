"""A run's check that its net can still learn: the units of each ReLU layer active on states of
its replay ring, every ``lib.schedules.UNITS_FRAMES`` agent steps of training.

A layer none of whose units is active for any input passes zeros on: the net's Q is the same for
every state, and no gradient reaches the weights below it, so the net cannot learn again (stage 01
at the article's lr 1e-4 loses its last conv layer so on some seeds, docs/learning.md). Such a
run has nothing left to show, however long it goes on: once a layer has had no unit active at
two checks in a row, ``UnitsCheck.check`` says so and the runner ends the run (its summary and
RESULT line name the layer). One check alone does not end it: just after a collapse, Adam's
momentum still moves the weights below for a few hundred steps.

Each check runs the net in fp32 on STATES states spread evenly over the ring (``spread``: no
random draw, so the sampling stream, and with it the run, is the same as without the check).
TensorBoard gets ``units/<layer>``, the share of the layer's units active there.
"""

from __future__ import annotations

import numpy as np
import torch

from lib import schedules
from lib.model import ActiveUnits
from lib.run.cli import say
from lib.run.probes import Probe

STATES = 256  # states a check shows the net
DEAD_CHECKS = 2  # checks in a row with a layer dead that end the run


def spread(buffer, n: int):
    """The states of up to ``n`` sampleable transitions spread evenly over a replay ring (any of
    the three: one ring, one per game, or the rings on the device), in new arrays. No random
    draw: the sampling stream is untouched, so the run is the same as without the check."""
    if hasattr(buffer, "indices_for"):  # DeviceReplayBuffer: the u-th valid slots, u evenly spaced
        fill = int(buffer.fill())
        u = torch.linspace(0, max(fill - 1, 0), min(n, fill), device=buffer.device).round().long()
        return buffer.gather(buffer.indices_for(u), buffer.gather_buffers(len(u)))[0].contiguous()
    if hasattr(buffer, "streams"):  # StreamReplayBuffer: an equal part from each ring, ordered by ring
        part = -(-n // len(buffer.streams))
        return np.concatenate([spread(s, part) for s in buffer.streams])[:n]
    slots = np.arange(min(buffer.written, buffer.capacity))
    slots = slots[buffer.valid(slots)]
    if len(slots) > n:
        slots = slots[np.linspace(0, len(slots) - 1, n).round().astype(np.int64)]
    return buffer.gather(slots, tuple(np.empty(s, d) for s, d in buffer.batch_layout(len(slots))))[0]


def active_units(net, states) -> list[tuple[str, int, int]]:
    """(layer, units active, units) of ``net``'s ReLU layers over ``states`` (uint8 stacks)."""
    units = ActiveUnits(net)
    try:
        with torch.no_grad(), torch.autocast(states.device.type, enabled=False):
            net(states)
        return units.counts()
    finally:
        units.close()


class UnitsCheck:
    """The checks of one run: ``check(net, buffer, frame_idx)`` is True when the run should end.
    ``dead``: {"layer", "frame"} of the first check that found the layer dead, in the last series
    of such checks (None while every layer has an active unit); kept in checkpoints."""

    def __init__(self, writer=None, say=print):
        self.writer = writer
        self.say = say
        self.dead: dict | None = None
        self.in_a_row = 0
        self.ended = False  # a check ended the run
        self.last: list[tuple[str, int, int]] = []  # the last check's counts

    def check(self, net, buffer, frame_idx: int) -> bool:
        device = next(net.parameters()).device
        states = torch.as_tensor(spread(buffer, STATES)).to(device)
        if len(states) == 0:
            return False
        self.last = active_units(net, states)
        if self.writer is not None:
            for name, active, total in self.last:
                self.writer.add_scalar(f"units/{name}", active / total, frame_idx)
        dead = [name for name, active, _ in self.last if active == 0]
        if not dead:
            self.dead, self.in_a_row = None, 0
            return False
        if self.dead is None or self.dead["layer"] != dead[0]:
            self.dead, self.in_a_row = {"layer": dead[0], "frame": frame_idx}, 0
        self.in_a_row += 1
        self.say(
            f"units: no unit of {dead[0]} is active on {len(states)} states of the replay at frame {frame_idx} "
            f"(check {self.in_a_row} of {DEAD_CHECKS} in a row): the net's Q is the same for every state"
        )
        self.ended = self.in_a_row >= DEAD_CHECKS
        return self.ended

    def state_dict(self) -> dict:
        return {"dead": self.dead, "in_a_row": self.in_a_row}

    def load_state_dict(self, state: dict | None) -> None:
        if state:
            self.dead, self.in_a_row = state.get("dead"), state.get("in_a_row", 0)

    def summary(self) -> dict:
        """summary.json's ``units``: the last check's counts, the dead layer (if any) and whether
        it ended the run."""
        last = {name: [active, total] for name, active, total in self.last}
        return {"last": last, "dead": self.dead, "ended_run": self.ended}


class UnitsProbe(Probe):
    """A run's checks (``UnitsCheck``), every ``schedules.UNITS_FRAMES`` agent steps of training, on
    the run's net and replay buffer; a checkpoint keeps their state (its ``units``)."""

    def __init__(self, run):
        self.run = run
        self.check: UnitsCheck | None = None

    def start(self) -> None:
        """The run's writer exists: the checks begin (a resumed run's where its checkpoint left them)."""
        run = self.run
        self.check = UnitsCheck(run.writer, say)
        if run.ckpt is not None:
            self.check.load_state_dict(run.ckpt.get("units"))

    def after(self, frame_idx: int, step: int) -> bool:
        run = self.run
        if run.speed.started and schedules.crossed(frame_idx - step, frame_idx, schedules.UNITS_FRAMES):
            return self.check.check(run.saveables["net"], run.buffer, frame_idx)  # True: the run ends
        return False

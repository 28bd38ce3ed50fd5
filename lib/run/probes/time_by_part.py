"""Time by part as a run takes it: the run's clocks (``lib.run.timing``: the parts, the stand-ins,
the figures) around the parts a stage hands ``Run.parts``, each role timed as its part; in the
play process around its act (``act``) and send (``put``); a TensorBoard point under ``time/``
every ``schedules.TIME_FRAMES`` agent steps and at the end; summary.json's ``time`` and the TIME
line from ``figures``.

The window opens where ``SpeedMeter`` starts f/s (``mark``, its ``on_start``).
"""

from __future__ import annotations

import time

from lib import schedules
from lib.run.probes import Probe
from lib.run.stages import STAGES
from lib.run.timing import RunClocks

# role: (the part a call of it is timed as, {method: the part its calls are timed as}); a method
# the object does not have is left out (01-02's buffer adds, 03-06's starts episodes and adds steps).
ROLES = {
    "env": (None, {"step": "env", "reset": "env"}),
    "buffer": (None, {"add": "write", "start_episode": "write", "add_step": "write", "add_vector_step": "write"}),
    "stager": (None, {"sample": "step"}),
    "act": ("act", {}),
    "receive": ("get", {}),
    "learn": ("step", {}),
    "pace": ("pace", {}),
}


class TimeByPart(Probe):
    def __init__(self, run):
        self.run = run
        self.clocks = RunClocks(run.device, play=STAGES[run.stage].play != "inline")

    def wrap(self, role: str, part):
        call, methods = ROLES[role]
        if role == "buffer" and STAGES[self.run.stage].sampling == "host":  # the loop samples from it
            methods = {**methods, "sample": "step"}
        methods = {name: p for name, p in methods.items() if hasattr(part, name)}
        return self.clocks.trainer.timed(part, call, **methods)

    def play_side(self):
        return None if self.clocks.play is None else PlayClock(self.clocks.play)

    def after(self, frame_idx: int, step: int) -> bool:
        if schedules.crossed(frame_idx - step, frame_idx, schedules.TIME_FRAMES):
            self.clocks.log(self.run.writer, frame_idx)
        return False

    def figures(self, frame_idx: int) -> dict:
        """summary.json's ``time``, read before the play process stops."""
        return self.clocks.figures(frame_idx, self.run.start_frame, wait=True)

    def end(self, frame_idx: int) -> None:
        self.clocks.log(self.run.writer, frame_idx, final=True)


class PlayClock:
    """The play process's side: its act timed as ``act``, its send as ``put``, another side's wait
    as the wait it is (``timed``: ``lag_wait``); a silence seen by the trainer as ``stalled``."""

    def __init__(self, clock):
        self.clock = clock

    def wrap(self, act, send):
        return self.clock.timed(act, "act"), self.clock.timed(send, "put")

    def timed(self, call, part: str):
        return self.clock.timed(call, part)

    def stalled(self, seconds: float) -> None:
        """The trainer's side: the play process has sent nothing for the last ``seconds``."""
        self.clock.stall(time.perf_counter() - seconds)

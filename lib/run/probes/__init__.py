"""The measurements a run takes, one module each, so that the algorithm's code (the scripts,
``Actor``, ``graph_step.Captured``, the buffers) carries none of them. ``lib.run.runner.Run``
attaches the first three as the stage's registry entry says (``Stage.probes``):

- ``time_by_part``: where the wall time goes, by stand-ins around the parts the loop calls
  (``lib.run.timing`` is the mechanism);
- ``weights_age``: how many train steps old the weights are that the play process acts with;
- ``dead_units``: the check that ends a run whose net has a layer no state makes active;
- ``trackers``: the speed meter, and the reward and loss tracker (every stage's, made by ``Run``);
- ``best_model``: the best model so far in ``best.pt`` (every stage's, kept by ``Run.game_over``).

A stage hands its parts to the run once, before its loop, by role (``Run.parts``: ``env``,
``buffer``, ``stager``, ``act``, ``receive``, ``learn``, ``pace``), and its play process its act
and send (``PlayArgs.parts``); each probe returns them wrapped, or as they are. A probe's hooks,
each a no-op unless it has one: ``wrap`` (the trainer's parts), ``play_side`` (what the play
process measures with), ``start`` (the run's writer is made), ``tick`` (the top of each loop
iteration), ``after`` (its end; True ends the run), ``end`` (the last TensorBoard points).
"""

from __future__ import annotations

from lib.run.timing import StandIn


class Probe:
    """A measurement of a run; see the package's docstring for the hooks."""

    def wrap(self, role: str, part):
        return part

    def play_side(self):
        return None

    def start(self) -> None:
        pass

    def tick(self, frame_idx: int) -> None:
        pass

    def after(self, frame_idx: int, step: int) -> bool:
        return False

    def end(self, frame_idx: int) -> None:
        pass


def attach(run, names) -> dict[str, Probe]:
    """The probes ``names`` for ``run``, in that order (the first wraps innermost)."""
    from lib.run.probes import dead_units, time_by_part, weights_age

    made = {
        "time_by_part": time_by_part.TimeByPart,
        "weights_age": weights_age.AgeProbe,
        "dead_units": dead_units.UnitsProbe,
    }
    return {name: made[name](run) for name in names}


def around(call, before, after) -> StandIn:
    """A stand-in for ``call`` that calls ``before()`` and ``after()`` around each call of it."""

    def bracketed(*args, **kwargs):
        before()
        try:
            return call(*args, **kwargs)
        finally:
            after()

    return StandIn(call, bracketed, {})


class PlaySide:
    """What the play process measures with: each probe's play side (``play_side``), which sees the
    loop's ``act`` and the net (``watch``) and wraps ``act`` and ``send`` (``wrap``), in order."""

    def __init__(self, sides: list):
        self.sides = [side for side in sides if side is not None]

    def parts(self, act, send, net):
        for side in self.sides:
            if hasattr(side, "watch"):
                side.watch(act, net)
        for timer in [side for side in self.sides if hasattr(side, "timed")]:
            for side in self.sides:
                if hasattr(side, "lag_wait"):  # a side's wait, timed as one: never as env
                    side.lag_wait = timer.timed(side.lag_wait, "lag_wait")
        for side in self.sides:
            act, send = side.wrap(act, send)
        return act, send

    def stalled(self, seconds: float) -> None:
        """The trainer's side: the play process has sent nothing for the last ``seconds``."""
        for side in self.sides:
            if hasattr(side, "stalled"):
                side.stalled(seconds)

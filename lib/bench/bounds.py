"""A stage's bound: the best f/s its parts allow on this machine, from its registry entry.

Per frame (agent step) a stage pays its play side and 1/N of a train step:

- t_play = t_env + w * t_act: one env step of its wrapper set (``wrappers``), plus the forward
  pass of the frames that act greedily (weight w = g, the greedy share). A vector stage steps
  K games per call and runs one batched forward when any of them acts greedily: per frame,
  w = g_K / K, with t_env per agent step.
- t_learn: sampling a batch of 32*N and the stage's train_step, once per N frames.

Where play shares the trainer's process (``play`` = inline) the two add up; where it runs in a
process of its own (process, vector) the slower side sets the pace. ``COMBINE`` holds each
form once, as the function and as the text the report prints.
"""

from __future__ import annotations

import dataclasses

from lib.params import GAMES
from lib.run.knobs import KNOBS
from lib.run.stages import Stage
from lib.schedules import epsilon_at

PARAMS = GAMES["pong"]  # the bench runs Pong

# play form -> (text, bound from t_play, t_learn and N)
COMBINE = {
    "inline": ("1 / ({play} + {learn} / {n})", lambda t_play, t_learn, n: 1.0 / (t_play + t_learn / n)),
    "process": ("min(1 / ({play}), {n} / {learn})", lambda t_play, t_learn, n: min(1.0 / t_play, n / t_learn)),
    "vector": ("min(1 / ({play}), {n} / {learn})", lambda t_play, t_learn, n: min(1.0 / t_play, n / t_learn)),
}


@dataclasses.dataclass(frozen=True)
class BoundForm:
    """What a stage's bound is made of, read from its registry entry."""

    stage: str
    play: str  # the registry's play form: inline, process or vector
    env: str  # part: env steps of its wrapper set ("env_old", "env_new", "env_vector")
    act: str  # part: its acting code with its own net ("act_05")
    learn: str  # part: its sampling and train_step ("learn_05")
    steps: int  # N: env steps per train step
    batch: int  # transitions per train step, 32*N

    @property
    def parts(self) -> tuple[str, str, str]:
        return (self.env, self.act, self.learn)

    @property
    def weight(self) -> str:
        """The act term's weight, as the formula names it."""
        return "g_K/K" if self.play == "vector" else "g"


def bound_form(stage: Stage, steps: int) -> BoundForm:
    """``steps``: the bench's N, for stages that have the knob (the others play 1 step per train step)."""
    n = steps if "steps" in stage.knobs else KNOBS["steps"].unset
    return BoundForm(
        stage.id, stage.play, f"env_{stage.wrappers}", f"act_{stage.id}", f"learn_{stage.id}", n, PARAMS.batch_size * n
    )


def formula(form: BoundForm) -> str:
    """The bound as the report prints it (t_x = 1 / rate of part x)."""
    play = f"t_{form.env} + {form.weight}·t_{form.act}"
    return COMBINE[form.play][0].format(play=play, learn=f"t_{form.learn}({form.batch})", n=form.steps)


def bound_fps(form: BoundForm, rates: dict, greedy: float, greedy_any: float, envs: int) -> float | None:
    """The bound in f/s from the parts' rates (calls per second); None where a part is missing."""
    if any(not rates.get(name) or rates[name] <= 0 for name in form.parts):
        return None
    weight = greedy_any / envs if form.play == "vector" else greedy
    t_play = 1.0 / rates[form.env] + weight / rates[form.act]
    return COMBINE[form.play][1](t_play, 1.0 / rates[form.learn], form.steps)


# A part whose timed windows' (max - min) / median exceeds this was not steady while it was timed
# (other work on the machine, a clock that changed, a part still warming up): its bound is not
# trusted, and no efficiency is taken from it.
UNSTEADY = 0.25


def bound_spread(form: BoundForm, measured: dict, greedy: float, greedy_any: float, envs: int) -> dict:
    """The bound from the parts' rates (``fps``, from their medians), its spread (``fps_low`` and
    ``fps_high``: from every part at its slowest and at its fastest window; a bench from before
    the windows has none), and ``unsteady``: the parts whose windows spread beyond UNSTEADY."""
    rates, spreads = measured["parts"], measured.get("spreads", {})
    out = {"fps": bound_fps(form, rates, greedy, greedy_any, envs), "fps_low": None, "fps_high": None}
    if out["fps"] is not None and all(name in spreads for name in form.parts):
        for key, end in (("fps_low", 0), ("fps_high", 1)):
            out[key] = bound_fps(form, {n: spreads[n][end] for n in form.parts}, greedy, greedy_any, envs)
    out["unsteady"] = [n for n in form.parts if n in spreads and (spreads[n][1] - spreads[n][0]) > UNSTEADY * rates[n]]
    return out


def part_seconds(form: BoundForm, rates: dict, greedy: float, greedy_any: float, envs: int) -> dict:
    """The bound's terms as a run's time by part counts them (``lib.run.timing``): seconds per 1,000
    frames (ms per frame) of ``env`` (t_env), ``act`` (its weight times t_act) and ``step``
    (t_learn / N); None for a part not measured."""
    weight = greedy_any / envs if form.play == "vector" else greedy
    terms = {"env": (form.env, 1.0), "act": (form.act, weight), "step": (form.learn, 1.0 / form.steps)}
    return {
        part: 1000.0 * share / rates[name] if rates.get(name) and rates[name] > 0 else None
        for part, (name, share) in terms.items()
    }


def part_unit(form: BoundForm, name: str, envs: int) -> str:
    """What a part's rate counts."""
    if name == form.env:
        if form.play == "vector":
            return f"agent steps/s (vector env, {envs} games per call, random actions)"
        return f"agent steps/s ({form.env[len('env_') :]} wrappers, random actions)"
    if name == form.act:
        if form.play == "vector":
            return f"batched forwards/s ({envs} states, stage {form.stage}'s net, Actor)"
        return f"greedy actions/s (stage {form.stage}'s net, choose_action)"
    return f"train steps/s (stage {form.stage}'s sampling and train_step, batch {form.batch})"


def greedy_fraction(replay_initial: int, frames: int, start: int = 0, envs: int = 1) -> float:
    """Share of the measured training frames (start + replay_initial, start + replay_initial +
    frames] that act greedily (1 - epsilon); only those run the batch-1 forward pass in the
    single-env stages. ``start``: the frame of the checkpoint the stages resume from (--resume).
    ``envs`` K > 1: the share of vector steps where at least one of the K games acts greedily
    (1 - epsilon^K), the only ones that run the batched forward pass."""
    first = start + replay_initial + 1
    total = sum(1.0 - epsilon_at(f, PARAMS) ** envs for f in range(first, first + frames))
    return total / frames

"""The run's probes (``lib.run.probes``): which calls of a stage's parts time by part times, in which
order the play side wraps act and send, and that the algorithm's code names no measurement."""

from __future__ import annotations

import pathlib
import re
import types

import torch

from lib.run.probes import PlaySide, attach, time_by_part
from lib.run.stages import ROOT, STAGES


class Ring:
    """A buffer with every method a stage's loop may call."""

    def add(self): ...
    def start_episode(self): ...
    def add_step(self): ...
    def add_vector_step(self): ...
    def sample(self): ...


def fake_run(stage: str):
    return types.SimpleNamespace(stage=stage, device=torch.device("cpu"), start_frame=0, writer=None)


def timed_methods(stand_in) -> set[str]:
    """The methods a ``StandIn`` times (its own attributes beside the target and the call)."""
    return set(vars(stand_in)) - {"_target", "_call"}


def test_time_by_part_times_each_role_as_its_part():
    """The buffer's writes are ``write`` in every stage, its ``sample`` is ``step`` only where the
    loop samples from it (01-03, ``sampling="host"``); a stager's sample is ``step``; a call of
    ``act``, ``receive``, ``learn`` or ``pace`` is its part."""
    writes = {"add", "start_episode", "add_step", "add_vector_step"}
    for stage in STAGES.values():
        probe = time_by_part.TimeByPart(fake_run(stage.id))
        sampled = {"sample"} if stage.sampling == "host" else set()
        assert timed_methods(probe.wrap("buffer", Ring())) == writes | sampled, stage.id
    probe = time_by_part.TimeByPart(fake_run("04"))
    assert timed_methods(probe.wrap("stager", Ring())) == {"sample"}
    assert timed_methods(probe.wrap("env", types.SimpleNamespace(step=None, reset=None))) == {"step", "reset"}
    clock = probe.clocks.trainer
    seen = []
    for role in ("act", "receive", "learn", "pace"):
        probe.wrap(role, lambda: seen.append(clock._part))()
    assert seen == ["act", "get", "step", "pace"]


def test_the_registry_says_which_probes_a_stage_gets():
    """Every stage times by part and checks its units; a stage with a play process also counts
    the weights' age; ``attach`` makes them in the registry's order."""
    for stage in STAGES.values():
        want = ["time_by_part", "dead_units"]
        if stage.play != "inline":
            want.insert(1, "weights_age")
        assert list(stage.probes) == want
    run = fake_run("01")
    assert list(attach(run, STAGES["01"].probes)) == ["time_by_part", "dead_units"]


def test_the_play_side_wraps_in_order_and_watches_the_act_it_was_given():
    """Each side sees the loop's own ``act`` (``watch``), then wraps what the one before made: the
    first side's wrapping is innermost, so a later side's work before an act is outside the
    earlier side's timing."""
    log = []

    class Side:
        def __init__(self, name):
            self.name = name

        def watch(self, act, net):
            log.append((self.name, "watch", act.__name__, net))

        def wrap(self, act, send):
            def acting():
                log.append((self.name, "act"))
                return act()

            return acting, send

    def act():
        log.append("act")
        return 1

    wrapped, _ = PlaySide([Side("inner"), None, Side("outer")]).parts(act, print, "net")
    assert wrapped() == 1
    assert log == [("inner", "watch", "act", "net"), ("outer", "watch", "act", "net"), ("outer", "act"),
                   ("inner", "act"), "act"]  # fmt: skip


def test_the_algorithms_code_names_no_measurement():
    """The scripts, the acting, the train step's capture and the buffers carry no measurement:
    no weights' age, units check, clock or timed stand-in (the run's probes wrap their parts)."""
    names = re.compile(r"weights_age|WeightsAge|\bclocks?\b|\btimed\b|\bunits\b|dead_units|lib\.timing", re.I)
    files = [pathlib.Path(s.path) for s in STAGES.values()]
    files += [pathlib.Path(ROOT, "lib", f) for f in ("agent.py", "graph_step.py", "buffer.py", "replay_device.py")]
    found = [
        f"{p.name}:{i}" for p in files for i, line in enumerate(p.read_text().splitlines(), 1) if names.search(line)
    ]
    assert found == []

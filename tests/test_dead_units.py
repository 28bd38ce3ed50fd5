"""The run's check that its net can still learn (lib.run.probes.dead_units): the states it shows the net, the
dead layer it names, and the run it ends."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from lib import schedules, wrappers
from lib.buffer import ReplayBuffer
from lib.buffer_games import StreamReplayBuffer
from lib.model import DQN
from lib.replay_device import DeviceReplayBuffer
from lib.run.probes import dead_units
from lib.sweep.grid import dead_layer, run_complete
from tests.conftest import run_folder, run_inprocess
from tests.test_replay_device import apply_to_device, apply_to_reference, reference_valid, vector_stream


def _filled(streams: int):
    """A stage 07 ring and a stage 08 ring of 3 rings x 23 slots after the same scripted games
    (every frame unique: env, episode, step), wrapped several times."""
    ref = StreamReplayBuffer(23 * streams, streams, frame_shape=(3,), seed=1)
    device = DeviceReplayBuffer(23 * streams, streams, frame_shape=(3,), generator=torch.Generator().manual_seed(1))
    for item in vector_stream(streams, 150, seed=streams, max_length=12):
        apply_to_reference(ref, item)
        apply_to_device(device, item)
    return ref, device


def _valid_states(ref: StreamReplayBuffer) -> set[bytes]:
    flat = reference_valid(ref)
    return {bytes(s) for s in ref.gather(flat, None)[0].copy()}


@pytest.mark.parametrize("streams", [1, 3])
def test_spread_shows_sampleable_states_and_draws_nothing(streams):
    """Every state ``spread`` returns is one a batch could hold (no pad slot, no stack across an
    episode's start or a ring's wrap); asked for more than there are, it returns each once; the
    sampling streams are where they were."""
    ref, device = _filled(streams)
    valid = _valid_states(ref)
    kinds = {"07": ref, "08": device} if streams > 1 else {"01": ref.streams[0], "07": ref, "08": device}
    for kind, buffer in kinds.items():
        before = ([s.rng.bit_generator.state for s in ref.streams], ref.rng.bit_generator.state)
        generator = device.generator.get_state()
        few = np.asarray(dead_units.spread(buffer, 8))
        assert len(few) == 8 and {bytes(s) for s in few} <= valid, kind
        assert len({bytes(s) for s in few}) == 8, f"{kind}: a state shown twice"
        every = np.asarray(dead_units.spread(buffer, 10_000))
        assert {bytes(s) for s in every} == valid and len(every) == len(valid), kind
        after = ([s.rng.bit_generator.state for s in ref.streams], ref.rng.bit_generator.state)
        assert before == after and torch.equal(generator, device.generator.get_state()), kind


def _pong_ring(steps: int = 300) -> ReplayBuffer:
    """A ring of real Pong transitions under random play (the old wrapper set)."""
    env = wrappers.make_env("PongNoFrameskip-v4")
    buffer = ReplayBuffer(1000, seed=0)
    env.action_space.seed(0)
    state, _ = env.reset(seed=0)
    for _ in range(steps):
        next_state, reward, terminated, truncated, _ = env.step(env.action_space.sample())
        buffer.add(state, 0, reward, terminated, next_state, terminated or truncated)
        state = env.reset()[0] if terminated or truncated else next_state
    env.close()
    return buffer


def _kill(net: DQN, layer: int = 4) -> None:
    """No input makes ``net.conv[layer]`` (conv3) positive: every channel of conv3 is dead."""
    with torch.no_grad():
        net.conv[layer].bias.fill_(-1e3)


def test_check_names_a_dead_layer_and_ends_the_run_at_the_second_check_in_a_row():
    buffer = _pong_ring()
    torch.manual_seed(0)
    net = DQN((4, 84, 84), 6)
    said = []
    check = dead_units.UnitsCheck(say=said.append)
    assert not check.check(net, buffer, 10_000) and check.dead is None and not said
    counts = dict((name, (active, total)) for name, active, total in check.last)
    assert set(counts) == {"conv1", "conv2", "conv3", "fc1"} and all(a > 0 for a, _ in counts.values())

    _kill(net)
    assert not check.check(net, buffer, 20_000)
    assert check.dead == {"layer": "conv3", "frame": 20_000} and "no unit of conv3" in said[-1]
    assert check.check(net, buffer, 30_000) and check.ended
    assert check.summary() == {"last": check.summary()["last"], "dead": {"layer": "conv3", "frame": 20_000},
                               "ended_run": True}  # fmt: skip

    saved = check.state_dict()  # a checkpoint between two dead checks goes on counting
    again = dead_units.UnitsCheck(say=said.append)
    again.load_state_dict({"dead": {"layer": "conv3", "frame": 20_000}, "in_a_row": 1})
    assert again.check(net, buffer, 30_000) and again.dead == saved["dead"]

    fresh = DQN((4, 84, 84), 6)  # a layer alive again between two dead checks starts the count anew
    one = dead_units.UnitsCheck(say=said.append)
    _kill(net)
    assert not one.check(net, buffer, 10_000) and not one.check(fresh, buffer, 20_000) and one.dead is None
    assert not one.check(net, buffer, 30_000) and one.check(net, buffer, 40_000)
    assert one.dead == {"layer": "conv3", "frame": 30_000}


@pytest.mark.parametrize("stage", ["01", "08"])
def test_a_run_whose_last_conv_layer_dies_ends_and_says_so(stage, runs, monkeypatch):
    """A real run on Pong, its conv3 killed as the run attaches its net, checks every 100 agent
    steps once training started: the first check names the layer, the second ends the run, as
    --max-frames would (exit 0, checkpoint, summary); the sweep counts it as complete."""
    from lib.run import runner

    monkeypatch.setattr(schedules, "UNITS_FRAMES", 100)
    attach = runner.Run.attach

    def attach_killed(self, buffer=None, **objects):
        attach(self, buffer=buffer, **objects)
        _kill(objects["net"])

    monkeypatch.setattr(runner.Run, "attach", attach_killed)
    extra = ("--envs", 2, "--steps", 2) if stage == "08" else ()
    res = run_inprocess(stage, "--run-dir", runs, "--max-frames", 2000, "--replay-initial", 200,
                        "--save-every", 1000, "--quiet", *extra)  # fmt: skip
    assert res.code == 0, res.stderr
    folder = run_folder(runs)
    summary = json.loads((folder / "summary.json").read_text())
    dead = summary["units"]["dead"]  # the first check: the first hundred once 200 transitions are in
    assert dead["layer"] == "conv3" and dead["frame"] in (200, 300) and summary["units"]["ended_run"]
    assert summary["frames"] == dead["frame"] + 100 and not summary["solved"] and summary["interrupted"] is None
    assert summary["units"]["last"]["conv3"] == [0, 64] and summary["units"]["last"]["conv1"][0] > 0
    assert "no unit of conv3 is active" in res.stdout
    assert res.stdout.strip().splitlines()[-1].startswith(f"RESULT stage={stage} ") and " dead=conv3" in res.stdout
    assert dead_layer(summary) == dead and run_complete(str(folder), 2000)
    assert torch.load(folder / "checkpoint.pt", weights_only=True)["units"]["in_a_row"] == 2

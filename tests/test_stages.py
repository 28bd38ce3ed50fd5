"""Each numbered script, run in-process on CPU with a tiny budget on the real emulator: it
trains (every train step reaches the optimizer), and its own feature does what it says.

A stage's ``train_step`` is looked up at call time, so a wrapper put in its place sees every
batch the loop trains on; the stage's ``train`` is otherwise untouched.
"""

import dataclasses
import os
import pathlib
import shutil
import subprocess

import numpy as np
import pytest
import torch

from lib import parallel, vector_env
from lib.optimizer import adam_options
from lib.run.scripts import load_script
from lib.run.stages import STAGES
from tests.conftest import run_folder, run_inprocess

TINY = ("--max-frames", 320, "--replay-initial", 200, "--quiet")


def record_train_steps(monkeypatch, stage):
    """Wrap the stage's train_step: record each batch size, the net and its first weights.
    Stage 08 samples inside its train step, which takes the rings and the batch size."""
    seen = {"batches": [], "net": None, "first": None}

    def record(net, batch_size):
        if seen["net"] is None:
            seen["net"] = net
            seen["first"] = {k: v.detach().clone() for k, v in net.state_dict().items()}
        seen["batches"].append(batch_size)

    mod = load_script(stage)
    inner = mod.train_step
    if STAGES[stage].sampling == "device":

        def device_spy(buffer, batch_size, net, *rest):
            record(net, batch_size)
            return inner(buffer, batch_size, net, *rest)

        monkeypatch.setattr(mod, "train_step", device_spy)
        return seen

    def spy(batch, net, tgt_net, optimizer, params, device, *precision):
        record(net, len(batch[1]))
        return inner(batch, net, tgt_net, optimizer, params, device, *precision)

    monkeypatch.setattr(mod, "train_step", spy)
    return seen


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_stage_trains_in_process(stage, runs, monkeypatch):
    from lib.params import GAMES

    seen = record_train_steps(monkeypatch, stage)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # as a sweep gives a run one CPU
    two = STAGES[stage].play != "inline"
    if two:  # epsilon 0.1: most of the play process's steps make a greedy forward, which the weights' age counts
        monkeypatch.setitem(GAMES, "pong", GAMES["pong"].replace(epsilon_start=0.1, epsilon_final=0.1))
    res = run_inprocess(stage, *TINY, "--run-dir", runs)
    assert res.code == 0, res.stderr
    if STAGES[stage].play != "inline":  # 01 and 02 leave threads to torch, which reads it at import
        assert ", 1 threads" in res.stdout.splitlines()[0] + res.stdout.splitlines()[1], res.stdout
    assert res.stderr == ""
    fields = dict(kv.split("=", 1) for kv in res.stdout.splitlines()[-1].split()[1:])
    assert res.stdout.splitlines()[-1].startswith("RESULT ")
    assert fields["stage"] == stage and fields["game"] == "pong" and fields["solved"] == "no"
    assert int(fields["frames"]) >= 320 and float(fields["fps"]) > 0
    summary = res.outcome.summary
    assert summary["stage"] == stage and summary["frames"] == int(fields["frames"]) and summary["interrupted"] is None
    if two:  # 03-06 count by the net's hooks, 07-08 in the Actor (one forward a vector step of K games)
        age, envs = summary["weights_age"], getattr(res.run.args, "envs", 1)
        assert age["forwards"] >= 0.7 * summary["frames"] / envs and isinstance(age["torn_reads"], int), age
    folder = run_folder(runs)
    assert folder.name.startswith(f"{stage}-pong-seed0-")
    assert list(folder.glob("events.out.tfevents.*")), "no TensorBoard event file"

    # Every train step went through the optimizer and moved the weights.
    run = res.run
    steps_n = 1 if stage == "01" else 4
    assert seen["batches"] and set(seen["batches"]) == {32 * steps_n}
    optimizer = run.saveables["optimizer"]
    assert int(optimizer.state[optimizer.param_groups[0]["params"][0]]["step"]) == len(seen["batches"])
    net = run.saveables["net"]
    assert net is seen["net"]
    for name, value in net.state_dict().items():
        assert not torch.equal(value, seen["first"][name]), f"{name} did not change"
    # Training frames and train steps agree: one train step per N frames once the buffer filled.
    assert summary["train_frames"] == steps_n * (len(seen["batches"]) - 1)
    assert_time_by_part(stage, res.stdout, summary)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder)).Reload()
    assert [e.step for e in events.Scalars("time/trainer.step")] == [summary["frames"]]  # the run's end


def assert_time_by_part(stage, stdout, summary):
    """summary.json's time by part covers the training frames, both processes where the stage
    has two, and each process's parts (its timed stand-ins' calls and the rest of its loop) add up to its wall time
    within a few per cent ("other", what no lap covers, is small); the TIME line, just before
    RESULT, says the same."""
    times = summary["time"]
    assert times["window"] == "train" and times["frames"] == summary["train_frames"] > 0
    two = STAGES[stage].play != "inline"
    assert set(times["processes"]) == ({"play", "trainer"} if two else {"trainer"})
    wanted = {"trainer": {"get", "write", "step", "log"} if two else {"env", "act", "write", "step", "log"}}
    if two:
        wanted["play"] = {"env", "act", "put"}
        wanted["trainer"] |= {"pace"} if STAGES[stage].learner == "graph" else set()
    for proc, parts in wanted.items():
        entry = times["processes"][proc]
        assert set(entry["seconds"]) == parts | {"other"}, (proc, entry)
        named = sum(v for p, v in entry["seconds"].items() if p != "other")
        assert abs(named - entry["wall_seconds"]) <= 0.05 * entry["wall_seconds"], (proc, entry)
    proc, part = times["bound"].split(":")
    assert part in wanted[proc] and part not in ("put", "get", "pace")
    line = stdout.splitlines()[-2]
    assert line.startswith(f"TIME stage={stage} bound={times['bound']} "), stdout
    fields = dict(kv.split("=", 1) for kv in line.split()[3:])
    assert set(fields) == {f"{p}.{part}" for p in wanted for part in wanted[p] | {"other", "wall"}}


def test_play_steps_trains_once_per_n_frames_with_batch_32n(runs, monkeypatch):
    seen = record_train_steps(monkeypatch, "02")
    res = run_inprocess("02", "--steps", 3, "--max-frames", 330, "--replay-initial", 200, "--quiet", "--run-dir", runs)
    assert res.code == 0, res.stderr
    assert set(seen["batches"]) == {96}
    # Frames come in threes (3, 6, ..., 330) and no game of Pong ends that soon, so the buffer
    # holds frame_idx transitions: the first train step is at 201, the first multiple of 3 past
    # 200, then one every 3 frames to 330: (330 - 201) / 3 + 1 = 44 train steps.
    assert len(seen["batches"]) == 44


def test_play_steps_1_equals_basic(tmp_path):
    """02 with --steps 1 does exactly 01's computation for the same seed on CPU: same env
    steps, same samples, same train steps, so the weights are bit-identical after training."""
    nets = []
    for stage, extra in (("01", []), ("02", ["--steps", 1])):
        res = run_inprocess(
            stage, "--max-frames", 300, "--replay-initial", 250, "--run-dir", tmp_path / stage, "--quiet", "--seed", 3,
            *extra,
        )  # fmt: skip
        assert res.code == 0, res.stderr
        nets.append((res.run.frame_idx, res.run.saveables["net"].state_dict(), res.run.saveables["optimizer"]))
    (f1, net1, opt1), (f2, net2, opt2) = nets
    assert f1 == f2 == 300
    # 250 transitions are stored at frame 250: train steps at frames 250..300 = 51.
    step = [int(opt.state[opt.param_groups[0]["params"][0]]["step"]) for opt in (opt1, opt2)]
    assert step == [51, 51]
    for name in net1:
        assert torch.equal(net1[name], net2[name]), name


# -- what reaches the trainer's buffer ---------------------------------------------------------


@pytest.fixture
def explore_only(monkeypatch):
    """A Pong hyperparameter set whose epsilon is 1 throughout: every action comes from the
    env's seeded action space, in the play process as in a single process."""
    from lib.params import GAMES

    monkeypatch.setitem(GAMES, "pongexplore", GAMES["pong"].replace(epsilon_start=1.0, epsilon_final=1.0))
    return "pongexplore"


def reference_buffer(new_wrappers, seed, frames, replay_size):
    """The single-process play loop of stages 01/02, with every action random: the transitions
    a stage stores for this wrapper set and seed."""
    from lib import wrappers
    from lib.buffer import ReplayBuffer

    env = wrappers.make_env("PongNoFrameskip-v4", new_wrappers=new_wrappers)
    env.action_space.seed(seed)
    state, _ = env.reset(seed=seed)
    buffer = ReplayBuffer(replay_size, seed=seed)
    for _ in range(frames):
        action = int(env.action_space.sample())
        next_state, reward, terminated, truncated, _ = env.step(action)
        buffer.add(state, action, reward, terminated, next_state, terminated or truncated)
        state = next_state
        if terminated or truncated:
            state, _ = env.reset()
    env.close()
    return buffer


def assert_same_ring(got, want):
    assert got.cursor == want.cursor and got.written == want.written and len(got) == len(want)
    assert np.array_equal(got.pad, want.pad)
    valid = ~want.pad
    assert np.array_equal(got.actions[valid], want.actions[valid])
    assert np.array_equal(got.rewards[valid], want.rewards[valid])
    assert np.array_equal(got.terminated[valid], want.terminated[valid])
    assert np.array_equal(got.frames, want.frames)


class BoundedQueueSpy:
    """Stands in for the multiprocessing context: its Queues record their bound and, at every
    get, how many items wait (the player can be at most that far ahead of the trainer)."""

    def __init__(self, ctx):
        self.ctx = ctx
        self.queues = []

    def __getattr__(self, name):
        return getattr(self.ctx, name)

    def Queue(self, maxsize):
        queue = self.ctx.Queue(maxsize=maxsize)
        waiting = []
        get = queue.get

        def counted_get(*args, **kwargs):
            waiting.append(queue.qsize())
            return get(*args, **kwargs)

        queue.get = counted_get
        self.queues.append((maxsize, waiting))
        return queue


@pytest.mark.parametrize("stage", ["02", "03", "04", "05", "06"])
def test_stored_transitions_equal_a_single_process_run(stage, explore_only, runs, monkeypatch):
    """With epsilon 1, the frames, actions, rewards and episode edges in the trainer's buffer
    equal those of the single-process loop with the same wrapper set and seed, slot for slot;
    the Queue between play process and trainer stays within its bound of 2*N."""
    spy = BoundedQueueSpy(parallel.context())
    monkeypatch.setattr(parallel, "context", lambda: spy)
    frames, size = 1200, 2000  # past Pong's first lost points (rewards, episode edges), no training
    res = run_inprocess(stage, "--game", explore_only, "--seed", 5, "--max-frames", frames,
                        "--replay-initial", size, "--replay-size", size, "--run-dir", runs, "--quiet")  # fmt: skip
    assert res.code == 0, res.stderr
    want = reference_buffer(STAGES[stage].wrappers == "new", 5, frames, size)
    assert (want.rewards != 0).any()
    assert_same_ring(res.run.buffer, want)
    if stage != "02":
        (maxsize, waiting), *_ = spy.queues
        assert maxsize == 8 and max(waiting) <= maxsize and len(waiting) >= frames


def test_vector_play_stores_what_the_vector_env_gives(explore_only, runs, monkeypatch):
    """Stage 07's rings hold, per game, exactly the frames, actions and rewards that ale-py's
    vector env gives when driven directly with the same actions (epsilon 1: the play process's
    seeded generator picks them), with a game's autoreset step never stored."""
    from lib.buffer_games import StreamReplayBuffer

    envs, seed, frames, size = 2, 4, 1200, 4000
    res = run_inprocess("07", "--game", explore_only, "--envs", envs, "--seed", seed, "--max-frames", frames,
                        "--replay-initial", size, "--replay-size", size, "--run-dir", runs, "--quiet")  # fmt: skip
    assert res.code == 0, res.stderr
    got = res.run.buffer

    venv = vector_env.make_vector_env("PongNoFrameskip-v4", envs, threads=1)
    rng = np.random.default_rng(seed)
    obs, _ = venv.reset(seed=seed)
    want = StreamReplayBuffer(size, envs, seed=seed)
    for i in range(envs):
        want.streams[i].start_episode(obs[i])
    resetting = np.zeros(envs, dtype=bool)
    stored = 0
    n_actions = venv.single_action_space.n
    while stored < res.run.frame_idx + 2 * envs:
        explore = rng.random(envs) < 1.0  # the draws choose_actions makes: all explore
        actions = rng.integers(0, n_actions, size=int(explore.sum()))
        obs, rewards, terminated, truncated, info = venv.step(actions)
        for i in range(envs):
            if resetting[i]:
                want.streams[i].start_episode(obs[i])
                continue
            done = bool(terminated[i] or truncated[i])
            want.streams[i].add_step(actions[i], np.sign(rewards[i]), terminated[i], obs[i, -1], done)
            stored += 1
            if done and not (info["lives"][i] == 0 or truncated[i]):  # a lost life: the game goes on
                want.streams[i].start_episode(obs[i])
        resetting = (terminated | truncated) & ~resetting & ((info["lives"] == 0) | truncated)
    venv.close()
    # The trainer stops reading at its last train-step boundary; the player may be ahead of it.
    for g, w in zip(got.streams, want.streams):
        n = g.written
        assert n > 100 and w.written >= n
        assert np.array_equal(g.frames[:n], w.frames[:n])
        # The newest slot is the current state's frame: its transition is still open in ``got``.
        assert np.array_equal(g.pad[: n - 1], w.pad[: n - 1])
        valid = ~g.pad[: n - 1]
        for field in ("actions", "rewards", "terminated"):
            assert np.array_equal(getattr(g, field)[: n - 1][valid], getattr(w, field)[: n - 1][valid]), field


def test_graph_learner_stores_what_vector_play_stores(explore_only, runs, monkeypatch):
    """Stage 08's device ring, after a run, holds what stage 07's rings hold after the same run
    (same seed, epsilon 1: the same games): frames, pad slots, valid slots, transitions."""
    from tests.test_replay_device import assert_same_as_reference

    got = {}
    for stage in ("07", "08"):
        res = run_inprocess(stage, "--game", explore_only, "--envs", 2, "--seed", 4, "--max-frames", 600,
                            "--replay-initial", 1000, "--replay-size", 1000, "--run-dir", runs / stage, "--quiet")  # fmt: skip
        assert res.code == 0, res.stderr
        got[stage] = res.run.buffer
    assert len(got["07"]) >= 600
    assert_same_as_reference(got["08"], got["07"])


def test_stage_08_capture_graph_needs_cuda(runs):
    """--capture graph on a CPU run is bad input: one line, exit code 2, no run folder."""
    res = run_inprocess("08", "--capture", "graph", "--run-dir", runs)
    assert res.code == 2
    assert res.stderr == "08_graph_learner.py: error: --capture graph needs CUDA (use --capture none on CPU)\n"
    assert not runs.exists()


def test_stage_08_play_process_takes_the_trainers_capture(runs, monkeypatch):
    """--capture none holds on both sides (the GPU check's fallback after a failed capture):
    the play process gets the trainer's capture and builds its Actor without a graph; with a
    captured trainer the Actor picks its own form. (07's play process, the same function, gets
    no capture: it acts eagerly.)"""
    from lib import vector_play

    mod = load_script("08")
    started = {}
    start_player = parallel.start_player

    def spy(run, target, args, *rest):
        started["args"] = args
        return start_player(run, target, args, *rest)

    monkeypatch.setattr(parallel, "start_player", spy)
    res = run_inprocess("08", "--capture", "none", "--max-frames", 64, "--replay-initial", 100, "--replay-size", 1000,
                        "--run-dir", runs, "--quiet")  # fmt: skip
    assert res.code == 0, res.stderr
    assert started["args"].capture == "none"

    class Built(BaseException):  # not an Exception: play's own handler would end this process
        pass

    def actor(*args, capture, **kwargs):
        acting.append(capture)
        raise Built

    acting = []
    monkeypatch.setattr(vector_play, "Actor", actor)
    monkeypatch.setattr(parallel, "child_setup", lambda seed: None)  # no signals nor parent watch here
    for capture in ("none", "graph"):
        with pytest.raises(Built):
            mod.play(dataclasses.replace(started["args"], capture=capture))
    assert acting == ["none", "auto"] and mod.play is load_script("07").play


# -- stage 08 against stage 07: a whole run, drawing the same slots ----------------------------

# Two games of Pong at random, rings of 500 slots each (they wrap from frame ~1000), training
# from 900 stored transitions at frame 900 to frame 2100: 301 train steps of 4*4 transitions,
# the target synced before the steps at frames 900 (a copy of the untrained net), 1200, 1500,
# 1800 and 2100, one game finished (-21).
SAME_RUN = ("--envs", 2, "--seed", 4, "--max-frames", 2100, "--replay-initial", 900, "--replay-size", 1000, "--quiet")


class SharedSlots:
    """One seeded stream of draws in place of a buffer's sampler: each draw ``u`` in
    ``[0, sampleable)`` names the ``u``-th sampleable slot counting ring after ring, and a batch
    comes sorted (ordered by ring, as 07 gathers it). 07's rings map ``u`` by their own validity
    rule, 08's ring by its own cumsum and searchsorted (``indices_for``), so one stream gives the
    two stages the same (ring, slot) pairs where, and only where, they agree on what may be drawn."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.slots = []

    def _draw(self, fill: int, batch_size: int) -> np.ndarray:
        return np.sort(self.rng.integers(0, fill, batch_size))

    def for_07(self, buffer, batch_size):
        from tests.test_replay_device import reference_valid

        valid = reference_valid(buffer)
        idx = valid[self._draw(len(valid), batch_size)]
        self.slots.append(idx.copy())
        return idx

    def for_08(self, buffer, batch_size):
        idx = buffer.indices_for(torch.from_numpy(self._draw(int(buffer.fill()), batch_size)))
        self.slots.append(idx.numpy().copy())
        return idx


def recorded(inner, into, record):
    """``inner``, appending ``record(result, args)`` to ``into`` after each call that returns
    anything but False."""

    def spy(*args, **kwargs):
        out = inner(*args, **kwargs)
        if out is not False:
            into.append(record(out, args))
        return out

    return spy


# Epsilon 1 throughout: every action comes from the play process's seeded generator, whatever
# the weights. Falling, as in a real run but over 1,500 agent steps instead of 100k: from 1 at
# the first frame to 0.41 at frame 900, where training starts, and 0.02 from frame 1500 on, so
# that most actions of the 301 train steps' stretch are the argmax of the learned weights.
EPSILON = {
    "one": {"epsilon_start": 1.0, "epsilon_final": 1.0},
    "falling": {"epsilon_start": 1.0, "epsilon_final": 0.02, "epsilon_frames": 1500},
}


def whole_run(stage, precision, run_dir, monkeypatch, epsilon="one"):
    """A run of ``SAME_RUN`` with Pong at ``EPSILON[epsilon]``, a target sync every 300 agent
    steps, 4 transitions a batch per step of play, one thread (a sweep's; the same kernels for
    both stages), and its draws from ``SharedSlots(11)``: the run, its draws, each train step's
    loss and the frames at which the target net was synced. With epsilon falling the play
    process is held to zero lag (``lib.run.probes.weights_age``): it then picks each greedy action
    with the weights of every train step before its frame's iteration and none after, in 07 and
    08 alike, so that greedy play is deterministic too."""
    from lib.buffer_games import StreamReplayBuffer
    from lib.params import GAMES
    from lib.replay_device import DeviceReplayBuffer

    game = GAMES["pong"].replace(**EPSILON[epsilon], target_net_sync=300, batch_size=4)
    monkeypatch.setitem(GAMES, "pongsame", game)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    shared = SharedSlots(11)
    seen = {"slots": shared.slots, "losses": [], "syncs": []}
    loss, frame = (lambda out, args: out.detach().clone()), (lambda out, args: args[1])
    mod = load_script(stage)
    monkeypatch.setattr(mod, "train_step", recorded(mod.train_step, seen["losses"], loss))
    monkeypatch.setattr(mod, "crossed", recorded(mod.crossed, seen["syncs"], frame))
    if stage == "07":
        monkeypatch.setattr(StreamReplayBuffer, "sample_indices", lambda self, n: shared.for_07(self, n))
        extra = ()
    else:
        monkeypatch.setattr(DeviceReplayBuffer, "sample_indices", lambda self, n: shared.for_08(self, n))
        extra = ("--capture", "none")
    if epsilon == "falling":
        extra += ("--lag", "zero")
    threads = torch.get_num_threads()
    try:
        res = run_inprocess(
            stage, "--game", "pongsame", *SAME_RUN, "--precision", precision, "--run-dir", run_dir, *extra
        )
    finally:
        torch.set_num_threads(threads)  # the stage set the trainer's
    assert res.code == 0, res.stderr
    return res.run, seen


@pytest.fixture(scope="module")
def runs_07(tmp_path_factory):
    """Stage 07's whole run for a precision and epsilon, run once per module."""
    done = {}

    def get(precision, epsilon="one"):
        if (precision, epsilon) not in done:
            with pytest.MonkeyPatch.context() as mp:
                folder = tmp_path_factory.mktemp(f"07-{precision}-{epsilon}")
                done[precision, epsilon] = whole_run("07", precision, folder, mp, epsilon)
        return done[precision, epsilon]

    return get


def differences(got, want) -> list[str]:
    """What differs between two whole runs (``whole_run``'s results), by name."""
    from tests.test_replay_device import assert_same_as_reference

    (run, seen), (ref, ref_seen) = got, want
    out = [name for name in ("frame_idx",) if getattr(run, name) != getattr(ref, name)]
    out += ["games"] if run.tracker.rewards != ref.tracker.rewards else []
    try:
        assert_same_as_reference(run.buffer, ref.buffer)
    except AssertionError:
        out.append("ring")
    pairs = zip(seen["slots"], ref_seen["slots"])
    if len(seen["slots"]) != len(ref_seen["slots"]) or not all(np.array_equal(a, b) for a, b in pairs):
        out.append("slots")
    pairs = zip(seen["losses"], ref_seen["losses"])
    if len(seen["losses"]) != len(ref_seen["losses"]) or not all(torch.equal(a, b) for a, b in pairs):
        out.append("losses")
    out += ["syncs"] if seen["syncs"] != ref_seen["syncs"] else []
    for name in ("net", "tgt_net"):
        mine, theirs = run.saveables[name].state_dict(), ref.saveables[name].state_dict()
        if not all(torch.equal(mine[k], theirs[k]) for k in theirs):
            out.append(name)
    mine, theirs = run.saveables["optimizer"].state_dict()["state"], ref.saveables["optimizer"].state_dict()["state"]
    if not all(torch.equal(mine[i][k], theirs[i][k]) for i in theirs for k in theirs[i]):
        out.append("adam")
    return out


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_graph_learner_learns_what_vector_play_learns(precision, runs_07, runs, monkeypatch):
    """Stage 08 (--capture none, the ring in host memory) against stage 07, whole runs on the
    real emulator drawing the same slots: the same games, rings, batches, losses at every train
    step, target syncs, weights and Adam state, bit for bit, in fp32 and in bf16 (on one CPU
    thread both stages run the same kernels). Covered: 08's trainer loop against 07's (the
    items read, the ring writes, when training starts, the sync schedule, the loss, backward
    and Adam), over 301 train steps and 4 target syncs after the first update, with both rings
    wrapped and a game finished.
    Not covered here: the learned weights' way back into play (epsilon is 1 throughout, so the
    play process never reads them; the next test covers it), the samplers' own draws (replaced by one shared stream here; their law is
    compared in tests/test_replay_device.py), a CUDA device and the captured graph
    (tests/test_graph_step.py, on a GPU)."""
    want = runs_07(precision)
    got = whole_run("08", precision, runs, monkeypatch)
    ref, seen = want
    assert len(seen["losses"]) == 301 and seen["syncs"] == [900, 1200, 1500, 1800, 2100]
    assert len(ref.tracker.rewards) == 1 and all(s.written > s.capacity for s in ref.buffer.streams)
    assert differences(got, want) == []


def test_graph_learner_learns_what_vector_play_learns_as_it_acts_on_what_it_learned(runs_07, runs, monkeypatch):
    """The comparison above with epsilon falling from 1 to 0.02 (``EPSILON``), both stages held
    to zero lag: most actions after training starts are the argmax of the learned weights (by
    the schedule, about 1,060 of the 1,200 from frame 900 on), so the games, and all that is
    learned from them, depend on the weights the play process acts with. Zero lag holds for K
    games: the play process waits, before a vector step, until the trainer has done every
    iteration before the step's first frame, and the trainer cannot train again before it has
    that step's item, whichever iterations the step's frames fall in. Not covered: greedy play
    at the lag a run has (2-3 train steps on a CPU, not deterministic: the play process runs
    ahead of the trainer as far as the scheduler lets it); each greedy action being the
    trainer's argmax is checked per action in tests/test_weights_age.py."""
    want = runs_07("fp32", "falling")
    got = whole_run("08", "fp32", runs, monkeypatch, "falling")
    ref, seen = want
    assert len(seen["losses"]) == 301 and seen["syncs"] == [900, 1200, 1500, 1800, 2100]
    assert all(s.written > s.capacity for s in ref.buffer.streams)
    assert differences(got, want) == []


def sync_one_step_late(monkeypatch):
    from lib import schedules

    late = lambda prev, frame, period: schedules.crossed(prev - 4, frame - 4, period)
    monkeypatch.setattr(load_script("08"), "crossed", late)  # 08's one use of it: the target sync


def skip_the_100th_train_step(monkeypatch):
    from lib.graph_step import Captured

    inner, calls = Captured.__call__, []

    def call(self, *args):
        calls.append(args)
        return torch.zeros(()) if len(calls) == 100 else inner(self, *args)

    monkeypatch.setattr(Captured, "__call__", call)


def stale_frame_at_item_600(monkeypatch):
    from lib.replay_device import DeviceReplayBuffer

    inner, items = DeviceReplayBuffer.add_vector_step, []

    def add(self, stepped, actions, rewards, terminated, dones, next_frames, starts=()):
        items.append(next_frames)
        if len(items) == 600:  # the frames of the item before, written again
            next_frames = items[-2]
        return inner(self, stepped, actions, rewards, terminated, dones, next_frames, starts)

    monkeypatch.setattr(DeviceReplayBuffer, "add_vector_step", add)


def frozen_weights_in_play(monkeypatch):
    from tests.support import broken_play

    broken_play.start_inside(monkeypatch, broken_play.frozen_weights)


@pytest.mark.parametrize(
    ("break_08", "epsilon", "shows"),
    [
        (sync_one_step_late, "one", {"syncs", "losses", "net", "tgt_net", "adam"}),
        (skip_the_100th_train_step, "one", {"slots", "losses", "net", "tgt_net", "adam"}),
        (stale_frame_at_item_600, "one", {"ring", "losses", "net", "tgt_net", "adam"}),
        (frozen_weights_in_play, "falling", {"ring", "losses", "net", "tgt_net", "adam"}),
    ],
    ids=["sync-one-step-late", "skipped-update", "stale-frame", "play-frozen-weights"],
)
def test_the_whole_run_comparison_catches_a_broken_graph_learner(break_08, epsilon, shows, runs_07, runs, monkeypatch):
    """The comparisons above fail when 08's loop is broken, each break on the figures it moves,
    the losses and the weights among them; a play process that acts with a private copy of its
    first weights changes the games once epsilon falls. Stage 07's run is made first: a break
    installed before it (the play process's is installed for every stage) would reach it too."""
    want = runs_07("fp32", epsilon)
    break_08(monkeypatch)
    assert shows <= set(differences(whole_run("08", "fp32", runs, monkeypatch, epsilon), want))


# -- stage 06's learner ----------------------------------------------------------------------


def test_bf16_learner_runs_bf16_with_an_fp32_head_and_fused_adam(runs, monkeypatch):
    seen = {}
    mod = load_script("06")
    inner = mod.train_step

    def spy(batch, net, tgt_net, optimizer, params, device, *precision):
        if not seen:

            def dtypes(name):
                def hook(module, inputs, output):
                    seen.setdefault(name, (inputs[0].dtype, output.dtype))  # the first call: net's own forward

                return hook

            hooks = [
                net.fc[0].register_forward_hook(dtypes("hidden")),
                net.fc[-1].register_forward_hook(dtypes("head")),
            ]
            loss = inner(batch, net, tgt_net, optimizer, params, device, *precision)
            for h in hooks:
                h.remove()
            seen["weights"] = {p.dtype for p in net.parameters()}
            seen["memory"] = net.conv[0].weight.is_contiguous(memory_format=torch.channels_last)
            return loss
        return inner(batch, net, tgt_net, optimizer, params, device, *precision)

    monkeypatch.setattr(mod, "train_step", spy)
    res = run_inprocess("06", *TINY, "--precision", "bf16", "--run-dir", runs)
    assert res.code == 0, res.stderr
    # The hidden layer computes in bf16 under autocast; the head takes fp32 and computes in fp32.
    assert seen["hidden"] == (torch.bfloat16, torch.bfloat16)
    assert seen["head"] == (torch.float32, torch.float32)
    assert seen["weights"] == {torch.float32} and seen["memory"]
    group = res.run.saveables["optimizer"].param_groups[0]
    assert adam_options(torch.device("cpu")) == {"fused": True}  # torch >= 2.4 has a fused CPU Adam
    assert group["fused"] is True


# -- the registry ------------------------------------------------------------------------------


def test_cpu_budget_is_what_the_run_was_given(monkeypatch):
    cores = len(os.sched_getaffinity(0))
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert parallel.cpu_budget() == 3 and parallel.split_threads("cpu") == (3, 1)
    for unset in ("", "0", "two"):
        monkeypatch.setenv("OMP_NUM_THREADS", unset)
        assert parallel.cpu_budget() == cores
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert parallel.cpu_budget() == cores and parallel.split_threads("cpu", 4) == (4, 1)
    assert parallel.split_threads("cuda", 4) == (1, 3) and parallel.split_threads("cuda", 1) == (1, 1)


def test_envs_auto_is_four_on_cpu_and_two_games_per_play_thread_on_cuda(tmp_path):
    from lib.run.cores import auto_envs

    # On CUDA the trainer keeps one thread and the play process the rest (split_threads):
    # 16 cores give the vector env 15 threads, two games each.
    assert auto_envs("cpu", 16) == 4 and auto_envs("cuda", 16) == 30 and auto_envs("cuda", 2) == 2
    assert auto_envs(torch.device("cuda"), 1) == 2
    # The stages resolve it before anything is built, and the checkpoint keeps the number.
    res = run_inprocess("07", "--max-frames", 48, "--replay-initial", 40, "--replay-size", 400, "--save-every", 48,
                        "--run-dir", tmp_path, "--quiet")  # fmt: skip
    assert res.code == 0, res.stderr
    assert res.run.args.envs == 4
    assert torch.load(run_folder(tmp_path) / "checkpoint.pt", weights_only=True)["knobs"]["envs"] == 4
    bad = run_inprocess("08", "--envs", "many", "--run-dir", tmp_path / "no")
    assert bad.code == 2 and "--envs" in bad.stderr and not (tmp_path / "no").exists()


def test_each_stage_takes_the_knobs_it_lists_as_the_registry_declares_them():
    """A stage's command line has a flag for each knob the registry lists for it, read and
    defaulted as the knob says; a knob it lacks is no flag, and its run sees the knob's unset
    value (one env step per train step, one game, no capture)."""
    from lib.run.cli import UsageError
    from lib.run.knobs import KNOBS
    from lib.run.stage_args import make_parser

    for stage in STAGES.values():
        parser = make_parser(stage.id, None)
        args = parser.parse_args([])
        for knob in KNOBS.values():
            if knob.name in stage.knobs:
                assert getattr(args, knob.name) == knob.default
            else:
                assert getattr(args, knob.name) == knob.unset
                with pytest.raises(UsageError, match="unrecognized"):
                    parser.parse_args([f"--{knob.name}", "1"])
    args = make_parser("08", None).parse_args(["--steps", "2", "--envs", "3", "--capture", "none"])
    assert (args.steps, args.envs, args.capture) == (2, 3, "none")
    for bad in (["--steps", "0"], ["--envs", "x"], ["--capture", "fast"]):
        with pytest.raises(UsageError, match=bad[0]):
            make_parser("08", None).parse_args(bad)


def test_capture_as_each_device_runs_it():
    from lib.run.knobs import resolve_capture

    assert resolve_capture("auto", "cpu") == "none" and resolve_capture("auto", "cuda") == "graph"
    assert resolve_capture("compile", "cpu") == "compile" and resolve_capture("graph", "cuda") == "graph"
    with pytest.raises(ValueError, match="needs CUDA"):
        resolve_capture("graph", "cpu")
    with pytest.raises(ValueError, match="unknown capture"):
        resolve_capture("fast", "cpu")


def test_every_script_keeps_the_contract_the_bench_times_it_by():
    """``lib.run.scripts.load_script``'s contract, read from the registry: the bench times a stage's
    learner through its ``build`` and ``train_step`` as the stage's ``sampling`` says, so a
    script must have them with these parameters, and must sample as its entry says."""
    import inspect

    from lib.run.knobs import KNOBS

    host = ["shape", "n_actions", "params", "device"]
    for stage in STAGES.values():
        mod = load_script(stage.id)
        source = pathlib.Path(stage.path).read_text()
        assert mod.STAGE == stage.id and list(inspect.signature(mod.main).parameters) == ["argv"]
        build = inspect.signature(mod.build).parameters
        precision = ["precision"] if "precision" in stage.knobs else []  # last, defaulting to bf16 (the stage's own)
        taker = inspect.signature(mod.train_step).parameters
        if stage.sampling == "device":
            assert list(build) == host + ["envs", "capture"] and stage.learner == "graph"
            assert (
                list(taker) == ["buffer", "batch_size", "net", "tgt_net", "optimizer", "params", "device"] + precision
            )
            assert "graph_step.capture(train_step," in source  # the trick, in one visible call
        else:
            assert list(build) == host and stage.learner != "graph"
            assert list(taker) == ["batch", "net", "tgt_net", "optimizer", "params", "device"] + precision
            pinned = stage.sampling == "pinned"
            assert ("stager.sample(buffer," in source) == pinned and ("buffer.sample(" in source) != pinned
        if precision:  # the runner passes the resolved value; called without it, a stage is what its docstring says
            assert taker["precision"].default == "bf16" and "bf16" in KNOBS["precision"].choices


def test_registry_is_the_scripts_and_the_docs_table():
    """Every numbered script is registered under its own number (and each registered one
    exists), and the table of stages in docs/stages.md is the registry's, word for word (the
    README's table of measured stages: tests/test_docs.py)."""
    from lib.run.stages import ROOT, markdown_table

    on_disk = sorted(p.name for p in pathlib.Path(ROOT).glob("[0-9][0-9]_*.py"))
    assert on_disk == [s.script for s in STAGES.values()]
    for stage_id in STAGES:
        mod = load_script(stage_id)
        assert mod.STAGE == stage_id and mod.__doc__.startswith(f"Stage {stage_id} (")
    assert markdown_table() in (pathlib.Path(ROOT) / "docs" / "stages.md").read_text()


# The most lines that may differ between a stage's script and the one before it: each diff shows
# the stage's trick and little else (docs/stages.md, "Reading a script"), and grows only on purpose.
DIFF_BUDGETS = {"02": 40, "03": 68, "04": 22, "05": 16, "06": 37, "07": 92, "08": 66}


@pytest.mark.skipif(shutil.which("diff") is None, reason="needs diff (GNU diffutils)")
def test_each_script_differs_from_the_one_before_within_its_budget():
    """Changed lines as a reader counts them: ``diff a b | grep -c '^[<>]'``."""
    ids = sorted(STAGES)
    assert sorted(DIFF_BUDGETS) == ids[1:]
    changed = {}
    for before, stage in zip(ids, ids[1:]):
        out = subprocess.run(["diff", STAGES[before].path, STAGES[stage].path], capture_output=True, text=True)
        assert out.returncode == 1, out.stderr  # 1: the files differ
        changed[stage] = sum(line.startswith(("<", ">")) for line in out.stdout.splitlines())
    assert {s: n for s, n in changed.items() if n > DIFF_BUDGETS[s]} == {}, changed


PRECISION_STAGES = [s.id for s in STAGES.values() if "precision" in s.knobs]


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
@pytest.mark.parametrize("stage_id", PRECISION_STAGES)
def test_precision_decides_whether_the_learner_runs_under_autocast(stage_id, precision, monkeypatch):
    """``--precision``: bf16 runs both nets' forward passes of a train step under bf16 autocast,
    fp32 runs them outside it, as stages 01-05 do; the weights, their gradients and the loss are
    fp32 either way, and the step changes the weights."""
    from lib.bench.parts import fill, fill_rings
    from lib.buffer import ReplayBuffer
    from lib.model import DQN
    from lib.params import GAMES

    seen = []
    forward = DQN.forward

    def recording(self, x):
        seen.append(torch.is_autocast_enabled("cpu"))
        return forward(self, x)

    monkeypatch.setattr(DQN, "forward", recording)
    module, stage = load_script(stage_id), STAGES[stage_id]
    params = GAMES["pong"].replace(replay_size=256, batch_size=8)
    device, shape, n_actions = torch.device("cpu"), (4, 84, 84), 6
    pool = np.random.default_rng(0).integers(0, 256, (16, 84, 84), dtype=np.uint8)
    if stage.sampling == "device":
        net, tgt_net, optimizer, buffer = module.build(shape, n_actions, params, device, 2, "none")
        fill_rings(buffer, 100, pool, n_actions)
        before = [p.detach().clone() for p in net.parameters()]
        loss = module.train_step(buffer, 32, net, tgt_net, optimizer, params, device, precision)
    else:
        net, tgt_net, optimizer = module.build(shape, n_actions, params, device)
        buffer = ReplayBuffer(params.replay_size, seed=0)
        fill(buffer, 100, pool, n_actions)
        before = [p.detach().clone() for p in net.parameters()]
        loss = module.train_step(buffer.sample(32), net, tgt_net, optimizer, params, device, precision)
    assert seen == [precision == "bf16"] * 2  # the online net, then the target net
    assert loss.dtype == torch.float32 and all(p.dtype == torch.float32 for p in net.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(before, net.parameters()))


def test_precision_is_a_knob_of_the_bf16_stages_kept_by_a_resume(runs, monkeypatch):
    """Stages 06-08 take ``--precision`` (auto by default: bf16 where the device has it natively,
    here made a device without it, then one with it). A checkpoint saves the value as given: a
    resume goes on with a given ``bf16`` (and says so where the device would emulate it), while
    ``auto`` is resolved again on the resuming device; ``--precision`` given again wins. A stage
    without the knob refuses the flag, and a value not among its choices is bad input."""
    from lib import precision
    from lib.run.checkpoint import load_checkpoint
    from lib.run.knobs import KNOBS

    assert PRECISION_STAGES == ["06", "07", "08"] and KNOBS["precision"].default == "auto"
    assert KNOBS["precision"].per_device and KNOBS["capture"].per_device and not KNOBS["envs"].per_device
    monkeypatch.setattr(precision, "native_bf16", lambda device_type: False)
    tiny = ["--replay-size", "100", "--replay-initial", "40", "--steps", "1", "--envs", "2", "--run-dir", runs]
    first = run_inprocess("08", "--precision", "bf16", "--save-every", "50", "--max-frames", "50", *tiny)
    assert first.code == 0, first.stderr
    assert "learner bf16" in first.stdout and "emulates" not in first.stdout
    ckpt_path = str(run_folder(runs) / "checkpoint.pt")
    saved = {"steps": 1, "envs": 2, "capture": "auto", "precision": "bf16", "lag": "free"}
    assert load_checkpoint(ckpt_path)["knobs"] == saved
    resumed = run_inprocess("08", "--resume", ckpt_path, "--max-frames", "60", "--run-dir", runs)
    assert resumed.code == 0, resumed.stderr
    assert "learner bf16" in resumed.stdout
    assert "note: the checkpoint's learner is bf16, which cpu here emulates" in resumed.stdout
    assert resumed.outcome.summary["knobs"]["precision"] == "bf16"
    again = run_inprocess("08", "--resume", ckpt_path, "--precision", "fp32", "--max-frames", "70", "--run-dir", runs)
    assert again.code == 0, again.stderr
    assert "learner fp32" in again.stdout and "emulates" not in again.stdout
    assert load_checkpoint(ckpt_path)["knobs"]["precision"] == "fp32"

    fresh = run_inprocess("07", "--save-every", "50", "--max-frames", "50", *tiny[:-2], "--run-dir", runs / "auto")
    assert fresh.code == 0, fresh.stderr
    assert "learner fp32" in fresh.stdout  # auto, on a device without native bf16
    assert fresh.outcome.summary["knobs"]["precision"] == "fp32"
    auto_ckpt = str(run_folder(runs / "auto") / "checkpoint.pt")
    assert load_checkpoint(auto_ckpt)["knobs"]["precision"] == "auto"
    monkeypatch.setattr(precision, "native_bf16", lambda device_type: True)  # moved to a device with bf16
    moved = run_inprocess("07", "--resume", auto_ckpt, "--max-frames", "60", "--run-dir", runs / "auto")
    assert moved.code == 0, moved.stderr
    assert "learner bf16" in moved.stdout and moved.outcome.summary["knobs"]["precision"] == "bf16"
    assert load_checkpoint(auto_ckpt)["knobs"]["precision"] == "auto"
    bad = run_inprocess("07", "--precision", "fp16", "--run-dir", runs)
    assert bad.code == 2 and "--precision" in bad.stderr
    refused = run_inprocess("05", "--precision", "fp32", "--run-dir", runs)
    assert refused.code == 2 and "--precision" in refused.stderr

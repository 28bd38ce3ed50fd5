"""The weights an action uses (``lib.run.probes.weights_age``), and whole runs compared.

From 03 on the play process acts with the trainer's live weights while it runs ahead of the
trainer; held to zero lag (``--lag zero``, the knob's other value) it acts with the
weights stage 02 acts with, and a whole run of 03 or 04 must then be 02's run bit for bit: the
same games (every stored frame, action, reward and episode edge), the same loss at every train
step, the same final weights, target weights and Adam state, and the trainer's sampling stream
at the same point. Runs on the real emulator, in-process, over 251 train steps and 11 target
syncs, with a Pong set made small and fast (below). The comparison must catch a broken loop:
each deliberate break (the target sync one train step late, one update skipped, the play
process sending the frame before the new one) is run and must be reported. (A play process that
acts on the state before the current one is not caught: this early in training the greedy action
hardly depends on the frames, and over 400 frames it picked the same actions. Acting with weights
of another age is caught: left free, 03 acted with weights 1.7 train steps old on average and
picked 167 of 404 actions otherwise.)
"""

import copy
import dataclasses

import gymnasium
import numpy as np
import pytest
import torch

from lib import parallel
from lib.params import GAMES
from lib.run.probes.weights_age import ONE_PROCESS_AGE, WeightsAge
from lib.run.scripts import load_script
from lib.schedules import crossed
from tests.conftest import run_inprocess
from tests.support import broken_play

pytestmark = pytest.mark.xdist_group("whole-runs")  # one worker runs them all: stage 02's run is made once

# Pong with a small batch (2*N: fast train steps), a target sync every 100 frames, a larger
# learning rate and epsilon 0.1 throughout: nine actions in ten are greedy and the weights move
# enough between train steps to change them, so an action picked with other weights shows.
SMALL = GAMES["pong"].replace(batch_size=2, target_net_sync=100, learning_rate=1e-3, epsilon_start=0.1,
                              epsilon_final=0.1)  # fmt: skip
# Train steps at frames 100, 104, ..., 1100 (the buffer holds 100 transitions at frame 100): 251,
# and target syncs at 100, 200, ..., 1100: 11.
FRAMES, INITIAL, STEPS = 1100, 100, 4
TRAIN_STEPS = (FRAMES - INITIAL) // STEPS + 1


def whole_run(stage, run_dir, monkeypatch, break_=None, frames=FRAMES):
    """One run of ``stage`` on SMALL, one thread a process (02's forward and train step then do
    the arithmetic 03's play process and trainer do), with every train step's loss recorded."""
    monkeypatch.setitem(GAMES, "pongsmall", SMALL)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    lag = ("--lag", "zero") if stage != "02" else ()  # 02 has no play process, and no knob
    mod = load_script(stage)
    inner = mod.train_step
    losses = []

    def recording(batch, net, tgt_net, optimizer, params, device):
        loss_v = inner(batch, net, tgt_net, optimizer, params, device)
        losses.append(loss_v.item())
        return loss_v

    monkeypatch.setattr(mod, "train_step", recording)
    if break_ is not None:
        break_(mod, monkeypatch)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        res = run_inprocess(stage, "--game", "pongsmall", "--steps", STEPS, "--max-frames", frames,
                            "--replay-initial", INITIAL, "--replay-size", 2000, "--seed", 7, "--run-dir", run_dir,
                            "--quiet", *lag)  # fmt: skip
    finally:
        torch.set_num_threads(threads)
    assert res.code == 0, res.stderr
    return res, losses


def differences(want, got) -> list[str]:
    """What differs between two whole runs: games, game scores, losses, weights (net, tgt_net,
    optimizer), sampling stream. A shorter run ``got`` is compared with the start of ``want``:
    its games and losses only."""
    (res_a, losses_a), (res_b, losses_b) = want, got
    a, b = res_a.run, res_b.run
    whole = a.frame_idx == b.frame_idx
    out = []
    ga, gb, n = a.buffer, b.buffer, b.buffer.written  # no wrap: 2000 slots
    valid = ~ga.pad[: n - 1]
    same = np.array_equal(ga.frames[:n], gb.frames[:n]) and np.array_equal(ga.pad[: n - 1], gb.pad[: n - 1])
    same = same and all(np.array_equal(getattr(ga, f)[: n - 1][valid], getattr(gb, f)[: n - 1][valid])
                        for f in ("actions", "rewards", "terminated"))  # fmt: skip
    if not same or (whole and ga.written != gb.written):
        out.append("games")
    if b.tracker.rewards != a.tracker.rewards[: len(b.tracker.rewards)]:
        out.append("game scores")
    if losses_b != (losses_a if whole else losses_a[: len(losses_b)]):
        out.append("losses")
    if not whole:
        return out
    for name in ("net", "tgt_net"):
        sa, sb = a.saveables[name].state_dict(), b.saveables[name].state_dict()
        if any(not torch.equal(sa[k], sb[k]) for k in sa):
            out.append(name)
    oa, ob = a.saveables["optimizer"].state_dict()["state"], b.saveables["optimizer"].state_dict()["state"]
    if any(not torch.equal(oa[i][k], ob[i][k]) for i in oa for k in oa[i]):
        out.append("optimizer")
    if a.buffer.rng.bit_generator.state != b.buffer.rng.bit_generator.state:
        out.append("sampling stream")
    return out


class _Run:
    """What ``WeightsAge`` reads of a run: its first frame, N and device."""

    def __init__(self, frame_idx, steps, device="cpu"):
        self.frame_idx, self.device = frame_idx, torch.device(device)
        self.args = type("Args", (), {"steps": steps, "lag": "free"})()


def test_weights_age_by_hand():
    """N = 2 from frame 10 (a resumed run). 02 acts at frames 11-12 with the weights of 0 train
    steps (not counted: before its first train step every age is 0), at 13-14 with 1 (its train
    step at 12), at 15-16 with 2. Here the play process acts at 11-14 before the trainer's first
    iteration (it reads 0 steps: ages 1, 1 at 13-14), at 15 with one step done (age 1), its
    forward torn by the second step writing the weights meanwhile, and at 16 after that step
    (age 0)."""
    net = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    run = _Run(10, 2)
    age = WeightsAge(run)
    assert age.count_steps(optimizer.step, optimizer) == optimizer.step  # an eager step: the optimizer's hooks count
    assert not age.zero_lag
    age.watch(None, net)  # 03-06: by the net's hooks
    for _ in (11, 12, 13, 14):
        age.acting()
        age.acted()
    age.due(12)  # the trainer's first iteration, no train step before it
    optimizer.step()  # its train step: the optimizer's hooks take the counter to odd and back
    age.due(14)
    age.acting()  # frame 15's pick: 11-14 are resolved, the trainer has reached their iterations
    assert age.totals() == (2, 2, 1)
    age.writing()  # the second train step writes the weights ...
    net(torch.ones(1))  # ... during this forward
    age.written()
    age.acted()
    age.acting()  # frame 16's
    net(torch.ones(1))
    age.acted()
    age.due(16)
    age.acting()
    age.acted(0)  # a vector step whose games all autoreset: no frame
    assert age.totals() == (4, 3, 1) and age._frame == 16
    assert age.stats() == {"mean": 0.75, "max": 1, "actions": 4, "forwards": 2, "torn_reads": 1}


class StandInGraph:
    """What the Actor's captured graph does on a replay, without CUDA: the argmax of the net's Q
    into the host actions, computed without calling the net module (a replay never does), and
    ``during`` (a train step writing the weights, say) while it runs."""

    def __init__(self, actor, during=lambda: None):
        self.actor, self.during, self.replays = actor, during, 0

    def replay(self):
        self.replays += 1
        self.during()
        q = type(self.actor.net).forward(self.actor.net, self.actor._device_states)  # the module's hooks do not run
        self.actor._host_actions.copy_(q.argmax(dim=1))


def test_the_actor_counts_its_forwards_eager_and_replayed():
    """07-08's Actor has its greedy forwards counted by the play process's WeightsAge (``watch``,
    around ``Actor.greedy_actions``): the eager ones and the graph's replays alike (the net's hooks
    see only the eager ones), none when every game explores; a replay during which a train step
    writes the weights is a torn read. On CUDA the torn reads are reported as None (not
    measurable), the forwards still counted."""
    from lib.actor import Actor
    from lib.model import DQN

    torch.manual_seed(0)
    net = DQN((4, 84, 84), 6)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    age = WeightsAge(_Run(0, 4))
    age.count_steps(optimizer.step, optimizer)
    calls = []
    net.register_forward_hook(lambda *_: calls.append(1))
    states = np.random.default_rng(0).integers(0, 256, (4, 4, 84, 84), dtype=np.uint8)
    with torch.no_grad():
        want = net(torch.from_numpy(states)).argmax(dim=1).tolist()
    calls.clear()
    actor = Actor(net, 4, (4, 84, 84), 6, "cpu", np.random.default_rng(0), staged=True)
    age.watch(actor, net)
    assert actor(states, 0.0).tolist() == want  # eager
    actor(states, 1.0)  # every game explores: no forward
    actor._graph = graph = StandInGraph(actor)  # what capture leaves (CUDA only)
    for _ in range(5):
        assert actor(states, 0.0).tolist() == want
    assert graph.replays == 5 and len(calls) == 1
    assert age.stats()["forwards"] == 6 and age.stats()["torn_reads"] == 0
    graph.during = optimizer.step  # a train step meanwhile: its hooks take the counter to odd and back
    actor(states, 0.0)
    assert age.stats()["forwards"] == 7 and age.stats()["torn_reads"] == 1
    on_cuda = WeightsAge(_Run(0, 4, "cuda"))
    on_cuda.forward_starts()
    on_cuda.forward_ends()
    assert on_cuda.stats()["forwards"] == 1 and on_cuda.stats()["torn_reads"] is None


@pytest.fixture(scope="module")
def stage_02(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        return whole_run("02", tmp_path_factory.mktemp("runs02"), mp)


def test_the_reference_run_covers_what_the_comparison_needs(stage_02):
    res, losses = stage_02
    assert len(losses) == TRAIN_STEPS == 251
    assert sum(crossed(f - STEPS, f, SMALL.target_net_sync) for f in range(INITIAL, FRAMES + 1, STEPS)) == 11
    assert (res.run.buffer.rewards != 0).any()  # points were played, won and lost
    assert res.outcome.summary["weights_age"] == ONE_PROCESS_AGE  # one process: age 0 by construction


@pytest.mark.parametrize("stage", ["03", "04"])
def test_whole_run_at_zero_lag_equals_stage_02(stage, stage_02, tmp_path, monkeypatch):
    got = whole_run(stage, tmp_path, monkeypatch)
    assert differences(stage_02, got) == []
    age = got[0].outcome.summary["weights_age"]
    # Every action from 02's first train step to the last frame (101-1100) was picked with 02's
    # weights, and no train step ran during a forward.
    assert age["mean"] == 0 and age["max"] == 0 and age["torn_reads"] == 0
    assert age["actions"] == FRAMES - INITIAL and age["forwards"] > 0.8 * FRAMES


def sync_one_step_late(mod, monkeypatch):
    monkeypatch.setattr(mod, "crossed", lambda prev, frame, period: crossed(prev - STEPS, frame - STEPS, period))


def skip_one_update(mod, monkeypatch):
    inner, calls = mod.train_step, []

    def skipping(batch, net, tgt_net, optimizer, params, device):
        calls.append(1)
        if len(calls) != 40:
            return inner(batch, net, tgt_net, optimizer, params, device)
        step, optimizer.step = optimizer.step, lambda: None
        try:
            return inner(batch, net, tgt_net, optimizer, params, device)
        finally:
            optimizer.step = step

    monkeypatch.setattr(mod, "train_step", skipping)


def send_stale_frames(mod, monkeypatch):
    broken_play.start_inside(monkeypatch, broken_play.send_stale_frames)


# A break shows within the first 75 train steps (the late sync at the second sync, frame 204; the
# skipped update at train step 40): the broken runs stop at frame 400, and their games and losses
# are compared with the start of 02's. Changed weights change greedy actions, so every break that
# reaches the weights shows in the games too.
def test_a_shorter_run_is_compared_with_the_start_of_02s(stage_02, tmp_path, monkeypatch):
    res, losses = whole_run("03", tmp_path, monkeypatch, frames=400)
    assert len(losses) == 76 and differences(stage_02, (res, losses)) == []


@pytest.mark.parametrize("break_", [sync_one_step_late, skip_one_update, send_stale_frames])
def test_whole_run_comparison_catches_a_broken_loop(break_, stage_02, tmp_path, monkeypatch):
    assert differences(stage_02, whole_run("03", tmp_path, monkeypatch, break_, frames=400)) == ["games", "losses"]


# -- each action picked with the trainer's weights (05-08) -----------------------------------

# On SMALL nine actions in ten are greedy: each must be the argmax of the trainer's net as it
# was when the action was picked. Train steps at frames 100, 104, ..., 300: 51, the target net
# synced at frames 100 (the first weights) and 200.
ACTING_FRAMES, SEED = 300, 7
ROUNDING = 1e-5  # relative: the play process's forward may run over another batch than the check's


class ArgmaxCheck:
    """Held to zero lag, the play process picks the actions of the frames from ``f`` on with the
    weights of the train steps of the iterations before ``f``'s, and the trainer takes their item
    before its next train step: as the trainer receives an item, its net holds the weights each
    action in it was picked with. Wrapped round ``parallel.receive`` (in the trainer), this
    follows the state each action was picked on (an episode's first stack, then each new frame,
    per game), replays the play process's seeded draws (03-06: ``choose_action``'s from numpy's
    global generator, seeded by ``child_setup``, and the action space's, seeded by the run's
    seed; 07-08: the ``Actor``'s, from its own generator) to tell the random actions from the
    greedy ones, and records:
    - ``random_wrong``: random actions other than the replayed draw;
    - ``gaps``: for each greedy action that reached the trainer, Q's gap under the trainer's net,
      max Q minus the Q of the action picked, over max |Q| (0 for the argmax);
    - ``first_gaps``: the same gap for the action the net's first weights pick (what a play
      process that never saw a train step would have picked)."""

    def __init__(self, monkeypatch, seed: int, epsilon: float):
        self.seed, self.epsilon = seed, epsilon
        self.net = self.first = self.generators = None
        self.stacks = {}  # game -> the state its next action is picked on
        self.gaps, self.first_gaps, self.random_wrong, self.random = [], [], 0, 0
        start, receive = parallel.start_player, parallel.receive

        def starting(run, target, args, *rest):
            self.net = run.saveables["net"]
            self.first = copy.deepcopy(self.net)
            return start(run, target, args, *rest)

        def receiving(queue, proc):
            item = receive(queue, proc)
            self.check(item)
            return item

        monkeypatch.setattr(parallel, "start_player", starting)
        monkeypatch.setattr(parallel, "receive", receiving)

    def draws(self, games: int, vector: bool) -> tuple[np.ndarray, np.ndarray]:
        """The play process's draws for one act over ``games`` games: which explore, and the
        random actions of those that do."""
        n_actions = self.net.fc[-1].out_features
        if self.generators is None:
            if vector:
                self.generators = np.random.default_rng(self.seed)
            else:
                self.generators = (
                    np.random.RandomState(self.seed),
                    gymnasium.spaces.Discrete(n_actions, seed=self.seed),
                )
        if vector:
            explore = self.generators.random(games) < self.epsilon
            return explore, self.generators.integers(0, n_actions, size=int(explore.sum()))
        numpy_global, space = self.generators
        explore = numpy_global.random_sample() < self.epsilon
        return np.array([explore]), np.array([space.sample()] if explore else [], dtype=np.int64)

    @torch.no_grad()
    def check(self, item) -> None:
        vector = isinstance(item, parallel.VectorStep)
        if not vector:  # 03-06: one game, one action
            if item.first_state is not None:
                self.stacks[0] = np.asarray(item.first_state)
            acted, actions, frames, starts = np.array([True]), np.array([item.action]), [item.next_frame], []
        elif item.stepped is None:  # 07-08's first item: only the games' first stacks
            acted, starts = np.zeros(0, dtype=bool), item.starts
        else:  # 07-08: the games that did not step were reset (their action went unused)
            acted, actions, frames, starts = item.stepped, item.actions, item.next_frames, item.starts
        if len(acted):
            explore, random_actions = self.draws(len(acted), vector)
            self.random_wrong += int((actions[explore] != random_actions).sum())
            self.random += int((explore & acted).sum())
            greedy = np.flatnonzero(~explore & acted)
            if len(greedy):
                states = torch.from_numpy(np.stack([self.stacks[g] for g in greedy]))
                q = self.net(states).float()
                best = q.max(dim=1).values
                picked = q.gather(1, torch.from_numpy(actions[greedy].astype(np.int64))[:, None])[:, 0]
                first = q.gather(1, self.first(states).argmax(dim=1, keepdim=True))[:, 0]
                scale = q.abs().max(dim=1).values.clamp_min(1e-6)
                self.gaps += ((best - picked) / scale).tolist()
                self.first_gaps += ((best - first) / scale).tolist()
            for g in np.flatnonzero(acted):
                self.stacks[g] = np.concatenate([self.stacks[g][1:], frames[g][None]])
        for g, stack in starts:
            self.stacks[g] = stack

    def otherwise(self) -> int:
        """The greedy actions that are not the trainer's argmax (beyond rounding)."""
        return int((np.asarray(self.gaps) > ROUNDING).sum())


def acting_run(stage, run_dir, monkeypatch, break_=None) -> ArgmaxCheck:
    """A run of ``stage`` on SMALL at zero lag, 3 games at once in 07-08 (a vector step's
    frames then straddle the N=4 iterations), each action checked by ``ArgmaxCheck``."""
    monkeypatch.setitem(GAMES, "pongsmall", SMALL)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    check = ArgmaxCheck(monkeypatch, SEED, SMALL.epsilon_start)
    if break_ is not None:
        break_(monkeypatch)
    envs = ("--envs", 3) if stage in ("07", "08") else ()
    threads = torch.get_num_threads()
    try:
        res = run_inprocess(stage, "--game", "pongsmall", "--steps", STEPS, "--max-frames", ACTING_FRAMES,
                            "--replay-initial", INITIAL, "--replay-size", 1000, "--seed", SEED, *envs,
                            "--run-dir", run_dir, "--quiet", "--lag", "zero")  # fmt: skip
    finally:
        torch.set_num_threads(threads)
    assert res.code == 0, res.stderr
    assert len(check.gaps) + check.random >= ACTING_FRAMES and check.random_wrong == 0
    assert res.outcome.summary["knobs"]["lag"] == "zero"  # what an ablation's arm is read by
    check.age, check.frames = res.outcome.summary["weights_age"], res.outcome.summary["frames"]
    return check


@pytest.mark.parametrize("stage", ["05", "06", "07", "08"])
def test_every_greedy_action_is_the_argmax_of_the_trainers_net(stage, tmp_path, monkeypatch):
    """At zero lag, each greedy action the trainer receives is the argmax of its own net on that
    action's state (and each random one the play process's seeded draw): the play process acts
    with the weights the trainer learns. The check can see a play process that does not: the
    net's first weights would have picked another action (by more than rounding) at many of the
    same states."""
    check = acting_run(stage, tmp_path, monkeypatch)
    assert len(check.gaps) > 0.8 * ACTING_FRAMES and check.otherwise() == 0
    assert (np.asarray(check.first_gaps) > ROUNDING).sum() > 0.2 * len(check.gaps)
    # The weights' age counts each action from 02's first train step once (all but the last
    # vector step's few, which the trainer had not reached). At zero lag each is 0 in 05-06; in
    # 07-08 a vector step's 3 frames share one read and can straddle two of N=4's iterations,
    # the later ones one train step older than 02's.
    age, vector = check.age, stage in ("07", "08")
    assert age["max"] == (1 if vector else 0) and (age["mean"] > 0) == vector and age["torn_reads"] == 0, age
    assert check.frames - INITIAL - 3 <= age["actions"] <= check.frames - INITIAL, (age, check.frames)


def play_inside(wrap):
    """A break: every play process runs inside ``wrap`` (``tests/support/broken_play.py``)."""
    return lambda monkeypatch: broken_play.start_inside(monkeypatch, wrap)


def act_with_the_target_net(monkeypatch):
    """A break in the trainer: the play process is handed the target net (shared by pickling)."""
    start = parallel.start_player

    def starting(run, play, args):
        return start(run, play, dataclasses.replace(args, net=run.saveables["tgt_net"]))

    monkeypatch.setattr(parallel, "start_player", starting)


@pytest.mark.parametrize(
    ("stage", "break_"),
    [
        ("08", play_inside(broken_play.frozen_weights)),
        ("07", act_with_the_target_net),
        ("08", play_inside(broken_play.rare_snapshot)),
    ],
    ids=["08-frozen-copy", "07-target-net", "08-rare-snapshot"],
)
def test_the_argmax_check_catches_a_play_process_that_stops_following_the_trainer(stage, break_, tmp_path, monkeypatch):
    check = acting_run(stage, tmp_path, monkeypatch, break_)
    assert check.otherwise() > 0

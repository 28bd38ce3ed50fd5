"""lib.agent and lib.actor: epsilon-greedy for one env and for a batch of envs. A net that counts its calls
and returns fixed Q-values shows which actions come from it and when it is not called."""

from __future__ import annotations

from collections import Counter

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from lib import actor as actor_module
from lib.actor import Actor, choose_actions
from lib.agent import choose_action
from lib.graph_step import wait_event
from tests.support.host_syncs import HostSyncs

N_ACTIONS = 6


class CountingNet(torch.nn.Module):
    """Q(s, a) = 1 where a == s[0, 0, 0] % N_ACTIONS, else 0; records each batch size."""

    def __init__(self):
        super().__init__()
        self.batches: list[int] = []

    def forward(self, x):
        self.batches.append(len(x))
        best = x[:, 0, 0, 0].long() % N_ACTIONS
        return (torch.arange(N_ACTIONS) == best.unsqueeze(1)).float()  # one-hot, with no value read on the host


def states_with_best(best):
    s = np.zeros((len(best), 4, 84, 84), dtype=np.uint8)
    s[:, 0, 0, 0] = best
    return s


def test_greedy_batch_takes_each_envs_argmax_in_one_forward():
    net = CountingNet()
    actions = choose_actions(net, states_with_best([3, 0, 5, 1]), 0.0, N_ACTIONS, "cpu", np.random.default_rng(0))
    assert actions.tolist() == [3, 0, 5, 1] and actions.dtype == np.int64
    assert net.batches == [4]


def test_all_exploring_skips_the_forward_pass():
    net = CountingNet()
    rng = np.random.default_rng(0)
    for _ in range(20):
        actions = choose_actions(net, states_with_best([3, 0, 5, 1]), 1.0, N_ACTIONS, "cpu", rng)
        assert ((actions >= 0) & (actions < N_ACTIONS)).all()
    assert net.batches == []


def test_mixed_batch_forwards_only_the_greedy_envs():
    # The same rng draws decide who explores: rng.random(4) < epsilon, then one integer per
    # exploring env. Replaying them shows which envs must carry the net's argmax.
    epsilon, best = 0.5, [3, 0, 5, 1]
    explore = np.random.default_rng(7).random(4) < epsilon
    assert 0 < explore.sum() < 4  # this seed mixes both kinds
    net = CountingNet()
    actions = choose_actions(net, states_with_best(best), epsilon, N_ACTIONS, "cpu", np.random.default_rng(7))
    assert net.batches == [int((~explore).sum())]
    assert actions[~explore].tolist() == np.array(best)[~explore].tolist()


def test_exploration_share_follows_epsilon():
    # With Q preferring action 0 everywhere, an action differs from 0 only when exploring and
    # drawing one of the 5 others: expected share epsilon * 5/6 = 0.25 at epsilon 0.3.
    net = CountingNet()
    rng = np.random.default_rng(1)
    actions = np.concatenate([choose_actions(net, states_with_best([0] * 4), 0.3, N_ACTIONS, "cpu", rng)
                              for _ in range(5000)])  # fmt: skip
    assert (actions != 0).mean() == pytest.approx(0.25, abs=0.01)


def test_single_env_choice():
    net = CountingNet()
    space = gym.spaces.Discrete(N_ACTIONS, seed=0)
    state = states_with_best([4])[0]
    assert choose_action(net, state, 0.0, space, "cpu") == 4 and net.batches == [1]
    rng = np.random.default_rng(0)
    picks = {choose_action(net, state, 1.0, space, "cpu", rng=rng) for _ in range(200)}
    assert picks == set(range(N_ACTIONS)) and net.batches == [1]


# -- Actor: stages 07-08's acting, one host round trip per call -------------------------------


@pytest.mark.parametrize("staged", [False, True])
def test_actor_draws_what_choose_actions_draws(staged):
    # Same seed, same states, same epsilons: the same actions, whether the net runs on the
    # greedy states alone (CPU) or on all K through the staging buffers (the CUDA path).
    states = states_with_best([3, 0, 5, 1])
    actor = Actor(CountingNet(), 4, states.shape[1:], N_ACTIONS, "cpu", np.random.default_rng(3), staged=staged)
    rng = np.random.default_rng(3)
    for epsilon in (1.0, 0.7, 0.3, 0.0, 0.5):
        want = choose_actions(CountingNet(), states, epsilon, N_ACTIONS, "cpu", rng)
        assert actor(states, epsilon).tolist() == want.tolist()


class CopyCounter(TorchDispatchMode):
    """Records each copy between tensors (``copy_``, ``_to_copy``) with its non_blocking flag,
    and each read of a tensor's value into Python (``_local_scalar_dense``, as ``.item()``)."""

    def __init__(self):
        super().__init__()
        self.copies: list[bool] = []
        self.reads = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten.copy_.default:
            self.copies.append(bool(args[2] if len(args) > 2 else kwargs.get("non_blocking", False)))
        elif func is torch.ops.aten._to_copy.default and "device" in kwargs:
            self.copies.append(bool(kwargs.get("non_blocking", False)))
        elif func is torch.ops.aten._local_scalar_dense.default:
            self.reads += 1
        return func(*args, **kwargs)


def test_staged_actor_makes_one_blocking_step_per_call(monkeypatch):
    # The staged path (the one CUDA runs, here on CPU tensors): the states go in with one
    # non-blocking copy, the argmax comes back with one non-blocking copy, and the one wait
    # that makes the actions readable is the only blocking step. No value is read from a
    # tensor on the way (an .item() or .cpu() would block on a GPU).
    states = states_with_best([3, 0, 5, 1])
    actor = Actor(CountingNet(), 4, states.shape[1:], N_ACTIONS, "cpu", np.random.default_rng(0), staged=True)
    waits = []
    monkeypatch.setattr(actor, "_wait", lambda: waits.append(1))
    for epsilon, calls in ((0.0, 1), (0.5, 2), (1.0, 2)):  # all greedy; mixed (this seed); all explore: no forward
        with CopyCounter() as counter:
            actor(states, epsilon)
        assert len(waits) == calls
        if epsilon < 1.0:
            assert counter.copies == [True, True] and counter.reads == 0
        else:
            assert counter.copies == [] and counter.reads == 0
    assert actor.net.batches == [4, 4]  # all K states, a fixed shape, whichever envs explore


class StandInGraph:
    """What a captured graph's replay does, without CUDA: the net's argmax into the host actions."""

    def __init__(self, actor):
        self.actor = actor

    def replay(self):
        self.actor._forward()


def test_the_actors_hot_path_waits_once_per_forward_and_reads_nothing_back(monkeypatch):
    # The staged path (the one CUDA runs, here on CPU tensors) with the event a CUDA Actor makes
    # (lib.graph_step.wait_event for a CUDA device, torch.cuda.Event counted by HostSyncs): a call
    # with a greedy game waits once, on a blocking event, eager or replayed (a stand-in graph),
    # and reads no tensor value back; a call where every game explores waits for nothing. The
    # CPU path (unstaged) names its one .cpu() per forward, free on CPU tensors.
    syncs = HostSyncs(monkeypatch)
    monkeypatch.setattr(actor_module, "wait_event", lambda device: wait_event(torch.device("cuda")))
    states = states_with_best([3, 0, 5, 1])
    actor = Actor(CountingNet(), 4, states.shape[1:], N_ACTIONS, "cpu", np.random.default_rng(0), staged=True)
    assert [e.blocking for e in syncs.events] == [True]
    for graph in (None, StandInGraph(actor)):
        actor._graph, actor.rng = graph, np.random.default_rng(0)  # the same draws each time
        for epsilon, waits in ((0.0, 1), (0.5, 1), (1.0, 0)):  # all greedy; mixed (this seed); all explore
            with syncs:
                actor(states, epsilon)
            assert syncs.counts == Counter(event_sync=waits), (graph, epsilon, syncs.counts)
            syncs.counts.clear()
    actor = Actor(CountingNet(), 4, states.shape[1:], N_ACTIONS, "cpu", np.random.default_rng(0), staged=False)
    with syncs:
        actor(states, 0.0)
    assert syncs.counts == Counter(cpu=1)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("capture", ["none", "graph", "auto"])
def test_actor_on_cuda_makes_no_hidden_sync(capture):
    # Under sync debug mode "error", any implicit host sync (.item(), .cpu(), a pageable copy)
    # raises; the actor's wait on its event is its one blocking step. The actions are the
    # net's argmax in every form, before and after capture (and after auto's choice).
    from lib.model import DQN

    torch.manual_seed(0)
    net = DQN((4, 84, 84), N_ACTIONS).cuda()
    states = np.random.default_rng(0).integers(0, 256, (6, 4, 84, 84), dtype=np.uint8)
    with torch.no_grad():
        want = net(torch.from_numpy(states).cuda()).argmax(dim=1).cpu().numpy()
    actor = Actor(net, 6, (4, 84, 84), N_ACTIONS, "cuda", np.random.default_rng(0), capture=capture)
    for _ in range(2 * Actor.TRIAL_CALLS + 5):  # warm-up, capture (it synchronises the device) and auto's trial
        assert actor(states, 0.0).tolist() == want.tolist()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(10):  # the steady state
            assert actor(states, 0.0).tolist() == want.tolist()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert actor.form in (("eager",) if capture == "none" else ("graph",) if capture == "graph" else ("eager", "graph"))
    if capture == "auto":
        assert set(actor.trial) == {"eager_ms", "graph_ms"}

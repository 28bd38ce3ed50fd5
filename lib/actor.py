"""Stage 07-08's acting: epsilon-greedy for a batch of games, in one host round trip a call on a GPU."""

from __future__ import annotations

import time

import numpy as np
import torch

from lib.graph_step import WARMUP_CALLS, wait_event


def choose_actions(net, states: np.ndarray, epsilon: float, n_actions: int, device, rng) -> np.ndarray:
    """Batched epsilon-greedy over a (num_envs, 4, 84, 84) array: one forward pass over the
    envs that act greedily, none when all of them explore (most steps while epsilon is near
    1: with 4 envs at epsilon 0.95, 81 % of steps). ``Actor`` unstaged, for one call."""
    return Actor(net, len(states), states.shape[1:], n_actions, device, rng, staged=False)(states, epsilon)


class Actor:
    """Stage 07-08's batched epsilon-greedy for a fixed number of games: ``actor(states, epsilon)``.

    The random draws are ``choose_actions``'s, in the same order, so a seed picks the same
    actions either way. Where the net sits on a GPU (``staged``, the default on CUDA) a call
    makes one host round trip: the states are copied into a reused pinned buffer and sent with
    ``non_blocking=True``, the forward runs over all K states (a fixed shape), the argmax comes
    back into pinned memory without blocking, and one wait on an event recorded after it
    makes it readable. (Eagerly, ``.to(device)`` from pageable memory and ``.cpu()`` each block.) On CPU
    the net runs on the greedy states alone, as ``choose_actions`` does.

    On CUDA the staged forward can also run as a CUDA graph (``capture``, stage 08's; 07 acts
    eagerly): ``auto`` times both
    forms over the first calls and keeps the faster, since which one wins depends on the
    machine (a graph saves the launches; the eager form needs no warm-up). The choice and its
    per-call medians are in ``self.form`` and ``self.trial`` (and go to ``log``, a print function, once).

    A call's one forward, eager or replayed, is ``greedy_actions``: from its start to its actions
    on the host, made only when some game acts greedily. The wait is on a blocking event
    (``lib.graph_step.wait_event``): the play process's thread sleeps instead of spinning a core.
    """

    TRIAL_CALLS = 20  # calls of each form, their seconds kept, before ``capture="auto"`` decides

    def __init__(
        self,
        net,
        num_envs: int,
        obs_shape,
        n_actions: int,
        device,
        rng,
        staged=None,
        capture="none",
        log=None,
    ):
        self.net, self.num_envs, self.n_actions, self.rng, self.log = net, num_envs, n_actions, rng, log
        self.device = torch.device(device)
        cuda = self.device.type == "cuda"
        self.staged = cuda if staged is None else staged
        self.form = "eager"
        self.trial: dict[str, float] = {}
        self._trying = capture == "auto" and cuda and self.staged
        self._want_graph = capture == "graph" and cuda and self.staged
        self._graph = None
        self._copied = None  # on CUDA: recorded after the copy-out, waited on
        if self.staged:
            shape = (num_envs, *obs_shape)
            self._host_states = torch.empty(shape, dtype=torch.uint8, pin_memory=cuda)
            self._device_states = torch.empty(shape, dtype=torch.uint8, device=self.device)
            self._host_actions = torch.empty(num_envs, dtype=torch.int64, pin_memory=cuda)
            self._copied = wait_event(self.device)

    @torch.no_grad()
    def __call__(self, states: np.ndarray, epsilon: float) -> np.ndarray:
        explore = self.rng.random(len(states)) < epsilon
        actions = np.empty(len(states), dtype=np.int64)
        actions[explore] = self.rng.integers(0, self.n_actions, size=int(explore.sum()))
        greedy = ~explore
        if greedy.any():
            actions[greedy] = self.greedy_actions(states, greedy)
        return actions

    @torch.no_grad()
    def greedy_actions(self, states: np.ndarray, greedy: np.ndarray) -> np.ndarray:
        """Q's argmax for the states where ``greedy``, on the host: the call's one forward."""
        if self.staged:
            return self._staged_argmax(states)[greedy]
        batch = states if greedy.all() else states[greedy]
        return self.net(torch.from_numpy(batch).to(self.device)).argmax(dim=1).cpu().numpy()

    def _staged_argmax(self, states: np.ndarray) -> np.ndarray:
        """Q's argmax for all K states: copy in, forward, copy out, one wait."""
        np.copyto(self._host_states.numpy(), states)
        self._device_states.copy_(self._host_states, non_blocking=True)
        started = time.perf_counter()
        if self._graph is not None:
            self._graph.replay()
            self._wait()
            self._try_forms("graph", time.perf_counter() - started)
        else:
            self._forward()
            self._wait()
            self._try_forms("eager", time.perf_counter() - started)
            if self._want_graph:  # captured after this call's forward: the next call replays
                actions = self._host_actions.numpy().copy()  # the capture's warm-up writes the buffer again
                self._capture()
                return actions
        return self._host_actions.numpy()

    def _forward(self) -> None:
        self._host_actions.copy_(self.net(self._device_states).argmax(dim=1), non_blocking=True)

    def _wait(self) -> None:
        """The call's one blocking step: the actions have reached host memory (an event
        recorded after the copy-out, waited on; the GPU's other work is not waited for)."""
        if self._copied is not None:
            self._copied.record()
            self._copied.synchronize()

    def _capture(self) -> None:
        try:
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                for _ in range(WARMUP_CALLS):
                    self._forward()
            torch.cuda.current_stream(self.device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                self._forward()
            self._graph, self.form = graph, "graph"
            self._want_graph = False
        except RuntimeError as e:  # keep acting eagerly; say why once
            self._want_graph = self._trying = False
            self.form = f"eager (graph capture failed: {str(e).splitlines()[0]})"
            if self.log is not None:
                self.log(f"acting on {self.device}: {self.form}")

    def _try_forms(self, form: str, seconds: float) -> None:
        """``capture="auto"``: the first TRIAL_CALLS eager calls, then as many graph replays;
        then keep the faster form (median per call)."""
        if not self._trying:
            return
        samples = self.trial.setdefault(f"{form}_samples", [])
        samples.append(seconds)
        if form == "eager" and len(samples) == self.TRIAL_CALLS:
            self._want_graph = True
        elif form == "graph" and len(samples) == self.TRIAL_CALLS:
            self._trying = False
            eager_ms = 1000 * float(np.median(self.trial.pop("eager_samples")))
            graph_ms = 1000 * float(np.median(self.trial.pop("graph_samples")))
            self.trial = {"eager_ms": eager_ms, "graph_ms": graph_ms}
            if eager_ms <= graph_ms:
                self._graph, self.form = None, "eager"
            else:
                self.form = "graph"
            if self.log is not None:
                self.log(
                    f"acting on {self.device}: {self.form} (per call of {self.num_envs} states: "
                    f"eager {eager_ms:.3f} ms, graph {graph_ms:.3f} ms)"
                )

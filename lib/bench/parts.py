"""Measuring the parts of a stage's bound, in the bench's process, with the stage's own code.

The registry's fields say what to time, and the stage's script (``lib.run.scripts.load_script``, its
contract) gives the code:

- env: env steps of the stage's wrapper set, random actions (``wrappers``); the vector env
  with the play process's thread count, as stage 07's play process makes it.
- act: ``lib.agent.choose_action`` (``Actor`` over K states for a vector stage) with
  the net that the stage's own ``build`` returns, on the torch threads its player has.
- learn: the stage's own ``build`` and ``train_step`` on batches sampled as the stage samples
  them (``sampling``): from a ReplayBuffer (a StreamReplayBuffer of K rings for a vector stage)
  holding as many transitions as the stage's holds at the end of its bench run, through a
  ``PinnedStager`` where the stage samples into pinned buffers; on the torch threads its
  trainer has. A stage whose batches are drawn on the device is timed the way it trains: the
  rings its ``build`` returns filled alike (``fill_rings``) and its ``train_step`` called,
  after capture.

Each rate is timed in ``WINDOWS`` windows that together last ``--bound-seconds``, each of at
least ``MIN_CALLS`` calls, after warm-up windows that end when two in a row agree: the rate is
the windows' median and its spread their min-max (``Rate``). A train step of 0.1-0.2 s on a
2-core CPU thus gets 15 timed calls or more, none of its first slow ones among them (one second
after two warm-up calls, as the quick bench once timed it, gave 5-10 calls, a cold one among
them: a rate well below the stage's own, docs/measurements.md). A part whose windows spread more than
``bounds.UNSTEADY`` leaves its stage's bound untrusted: no efficiency is taken from it.
A part that the machine cannot run (out of memory, an env that cannot start: ``PART_ERRORS``)
is recorded and leaves the stage unbounded; any other exception is a bug in the code and ends
the bench at once, so that it never hides behind hours of stage runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import statistics
import time

import numpy as np
import torch

from lib import graph_step, parallel, vector_env, wrappers
from lib.actor import Actor
from lib.agent import choose_action
from lib.bench.bounds import PARAMS, BoundForm, bound_form
from lib.bench.floor import floor_ms, matmul_rate
from lib.buffer import ReplayBuffer
from lib.buffer_games import StreamReplayBuffer
from lib.run.knobs import KNOBS, resolve_capture
from lib.run.runtime import process_settings
from lib.run.scripts import load_script
from lib.run.stages import STAGES, Stage
from lib.staging import PinnedStager

PART_ERRORS = (RuntimeError, OSError, ValueError, MemoryError)
EPISODE = 1000  # transitions per episode in the filled buffer (about one Pong game)


WINDOWS = 5  # timed windows per part: the rate is their median, its spread their min-max
MIN_CALLS = 3  # calls per window at least, however short --bound-seconds
STEADY = 0.10  # warm-up ends when a window's rate is within this share of the window's before it
WARMUP_WINDOWS = (2, 6)  # warm-up windows: at least, at most (then the timed windows' spread tells)


@dataclasses.dataclass(frozen=True)
class Rate:
    """A part's rate in calls per second: the median of its timed windows, and their min and max."""

    median: float
    low: float
    high: float

    @property
    def spread(self) -> float:
        """(max - min) / median of the windows' rates: 0.1 is a window 10% off another."""
        return (self.high - self.low) / self.median

    def times(self, k: float) -> Rate:
        return Rate(k * self.median, k * self.low, k * self.high)


def measure_rate(fn, seconds: float, sync=None) -> Rate:
    """Calls of ``fn`` per second in ``WINDOWS`` windows over ``seconds`` of wall time in all
    (each at least ``MIN_CALLS`` calls), after warm-up windows of the same length until two in a
    row agree within ``STEADY`` (or the warm-up has lasted ``seconds``: a part whose calls are
    longer than its windows then takes 21 calls, not up to 33); ``sync`` (CUDA) runs before each
    reading of the clock, so queued work is counted."""
    sync = sync or (lambda: None)
    length = seconds / WINDOWS

    def window() -> float:
        sync()
        t0, n = time.perf_counter(), 0
        while n < MIN_CALLS or time.perf_counter() - t0 < length:
            fn()
            n += 1
        sync()
        return n / (time.perf_counter() - t0)

    least, most = WARMUP_WINDOWS
    started = time.perf_counter()
    warm = [window() for _ in range(least)]
    while abs(warm[-1] - warm[-2]) > STEADY * warm[-2] and len(warm) < most:
        if time.perf_counter() - started >= seconds:  # a slow part: its first windows were warm-up enough
            break
        warm.append(window())
    rates = [window() for _ in range(WINDOWS)]
    return Rate(statistics.median(rates), min(rates), max(rates))


@contextlib.contextmanager
def torch_threads(n: int | None):
    """torch's intra-op thread count set to ``n`` (unchanged for None), restored after."""
    old = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def fill(ring: ReplayBuffer, count: int, pool: np.ndarray, n_actions: int) -> None:
    """``count`` transitions in episodes of EPISODE; frame contents do not change the cost."""
    ring.start_episode(pool[: ring.stack])
    for i in range(count):
        done = i % EPISODE == EPISODE - 1
        ring.add_step(i % n_actions, 0.0, done, pool[i % len(pool)], done)
        if done:
            ring.start_episode(pool[: ring.stack])


def fill_rings(buffer, per_ring: int, pool: np.ndarray, n_actions: int) -> None:
    """``fill`` for each ring of a ``DeviceReplayBuffer``, all rings in step: one vector step,
    so one copy to the device, per transition of each ring."""
    k, first = buffer.streams, pool[: buffer.stack]
    buffer.add_vector_step(None, None, None, None, None, None, [(r, first) for r in range(k)])
    stepped, rewards = np.ones(k, dtype=bool), np.zeros(k, dtype=np.float32)
    for i in range(per_ring):
        done = np.full(k, i % EPISODE == EPISODE - 1)
        frames = np.broadcast_to(pool[i % len(pool)], (k,) + pool.shape[1:])
        starts = [(r, first) for r in range(k)] if done[0] else []
        buffer.add_vector_step(stepped, np.full(k, i % n_actions), rewards, done, done, frames, starts)


class PartMeter:
    """Measures the parts of each stage's bound on the bench's device."""

    def __init__(self, settings: dict):
        self.device = torch.device(settings["device"])
        self.seconds, self.seed, self.envs = settings["bound_seconds"], settings["seed"], settings["envs"]
        self.steps = settings["steps"]
        self.precision = settings.get("precision", "bf16")  # a bench from before the knob: the stages' bf16
        self.transitions = settings["replay_initial"] + settings["frames"]  # what a stage's buffer ends with
        self.sync = torch.cuda.synchronize if self.device.type == "cuda" else None
        self.rng = np.random.default_rng(self.seed)
        probe = wrappers.make_env(PARAMS.env_name)
        self.shape, self.action_space = probe.observation_space.shape, probe.action_space
        probe.close()
        self.n_actions = int(self.action_space.n)
        self.pool = self.rng.integers(0, 256, (64,) + self.shape[1:], dtype=np.uint8)
        self.trainer_threads, self.player_threads = parallel.split_threads(self.device)
        process_settings()  # as every stage does at its start
        self._matmul = {}  # precision -> FLOP/s, measured once per bench process (trainstep.matmul_rate)

    def learn_floor(self, stage: Stage, steps: int) -> float:
        """ms of the stage's train step at this machine's matmul rate in the stage's precision:
        the arithmetic floor its measured learn rate is read against (``lib.bench.trainstep``)."""
        precision = "fp32"
        if "precision" in stage.knobs:
            precision = KNOBS["precision"].resolve(self.precision, self.device.type)
        if precision not in self._matmul:
            with torch_threads(self.trainer_threads):
                self._matmul[precision] = matmul_rate(self.device, precision, seconds=min(1.0, self.seconds))
        return floor_ms(self.shape, PARAMS.batch_size * steps, self._matmul[precision], self.n_actions)

    def form(self, stage_id: str) -> BoundForm:
        return bound_form(STAGES[stage_id], self.steps)

    def measure(self, stage_id: str, log=print) -> dict:
        """{"parts": {name: rate}, "spreads": {name: [min, max]}, "errors": {name: one line}} for
        the stage's bound: each part's rate (the median of its windows), its windows' min-max."""
        stage, module, form = STAGES[stage_id], load_script(stage_id), self.form(stage_id)
        jobs = {
            form.env: lambda: self.env_rate(stage.wrappers),
            form.act: lambda: self.act_rate(stage, module, form.steps),
            form.learn: lambda: self.learn_rate(stage, module, form.steps),
        }
        out = {"parts": {}, "spreads": {}, "errors": {}, "floors": {form.learn: self.learn_floor(stage, form.steps)}}
        for name, job in jobs.items():
            torch.manual_seed(self.seed)
            try:
                rate = job()
                out["parts"][name], out["spreads"][name] = rate.median, [rate.low, rate.high]
            except PART_ERRORS as e:
                out["errors"][name] = f"{type(e).__name__}: {e}".splitlines()[0]
                log(f"[bounds {stage_id}] {name}: FAILED ({out['errors'][name]})")
        return out

    def build(self, stage: Stage, module, steps: int) -> tuple:
        """The learner as the stage's own ``build`` makes it (net, tgt_net, optimizer; for a
        learner on the device also its rings), with the bench's K."""
        if stage.sampling == "device":
            capture = resolve_capture("auto", self.device.type)
            return module.build(self.shape, self.n_actions, PARAMS, self.device, self.envs, capture)
        return module.build(self.shape, self.n_actions, PARAMS, self.device)

    def precision_arg(self, stage: Stage) -> tuple:
        """The bench's learner precision, for a stage that has the knob (the contract's last parameter)."""
        return (self.precision,) if "precision" in stage.knobs else ()

    def env_rate(self, wrapper_set: str) -> Rate:
        if wrapper_set == "vector":
            venv = vector_env.make_vector_env(PARAMS.env_name, self.envs, threads=min(self.player_threads, self.envs))
            venv.reset(seed=self.seed)
            try:
                step = lambda: venv.step(self.rng.integers(0, self.n_actions, self.envs))
                return measure_rate(step, self.seconds).times(self.envs)
            finally:
                venv.close()
        env = wrappers.make_env(PARAMS.env_name, new_wrappers=wrapper_set == "new")
        env.action_space.seed(self.seed)
        env.reset(seed=self.seed)

        def step():
            _, _, terminated, truncated, _ = env.step(env.action_space.sample())
            if terminated or truncated:
                env.reset()

        try:
            return measure_rate(step, self.seconds)
        finally:
            env.close()

    def act_rate(self, stage: Stage, module, steps: int) -> Rate:
        net = self.build(stage, module, steps)[0]
        threads = None if stage.play == "inline" else self.player_threads
        with torch_threads(threads):
            if stage.play == "vector":
                states = self.rng.integers(0, 256, (self.envs,) + self.shape, dtype=np.uint8)
                acting = "auto" if stage.learner == "graph" else "none"  # as the stage's play process acts
                actor = Actor(net, self.envs, self.shape, self.n_actions, self.device, self.rng, capture=acting)
                act = lambda: actor(states, 0.0)
            else:
                state = self.rng.integers(0, 256, self.shape, dtype=np.uint8)
                act = lambda: choose_action(net, state, 0.0, self.action_space, self.device)
            return measure_rate(act, self.seconds, self.sync)

    def filled_buffer(self, play: str):
        """A buffer like the stage's, holding what the stage's holds at the end of its run."""
        frame_shape, stack = self.shape[1:], self.shape[0]
        if play == "vector":
            buffer = StreamReplayBuffer(PARAMS.replay_size, self.envs, frame_shape, stack, seed=self.seed)
            rings = buffer.streams
        else:
            buffer = ReplayBuffer(PARAMS.replay_size, frame_shape, stack, seed=self.seed)
            rings = [buffer]
        for ring in rings:
            fill(ring, max(1, self.transitions // len(rings)), self.pool, self.n_actions)
        return buffer

    def device_learn_rate(self, stage: Stage, module, steps: int) -> Rate:
        """A train step that draws its batch from rings on the device (stage 08), captured as
        the stage captures it, timed after capture."""
        net, tgt_net, optimizer, buffer = self.build(stage, module, steps)
        fill_rings(buffer, max(1, self.transitions // buffer.streams), self.pool, self.n_actions)
        step = graph_step.capture(module.train_step, resolve_capture("auto", self.device.type))
        args = (buffer, PARAMS.batch_size * steps, net, tgt_net, optimizer, PARAMS, self.device)

        def call():
            step(*args, *self.precision_arg(stage))

        with torch_threads(self.trainer_threads):
            while not step.ready:  # warm-up and capture are not the steady state
                call()
            return measure_rate(call, self.seconds, self.sync)

    def learn_rate(self, stage: Stage, module, steps: int) -> Rate:
        if stage.sampling == "device":
            return self.device_learn_rate(stage, module, steps)
        net, tgt_net, optimizer = self.build(stage, module, steps)
        buffer = self.filled_buffer(stage.play)
        stager = PinnedStager(self.device) if stage.sampling == "pinned" else None
        threads = None if stage.play == "inline" else self.trainer_threads
        batch_size = PARAMS.batch_size * steps
        precision = self.precision_arg(stage)

        def step():
            batch = stager.sample(buffer, batch_size) if stager else buffer.sample(batch_size)
            module.train_step(batch, net, tgt_net, optimizer, PARAMS, self.device, *precision)

        with torch_threads(threads):
            return measure_rate(step, self.seconds, self.sync)

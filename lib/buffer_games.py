"""Replay over several games played side by side (stage 07): one ring (lib.buffer) a game."""

from __future__ import annotations

import numpy as np

from lib.buffer import ReplayBuffer
from lib.params import FRAME_SHAPE, STACK


class StreamReplayBuffer:
    """Replay over several envs played side by side (stage 07): one ReplayBuffer ring per
    env (``streams[i]``, capacity // n each), so that each env's frames stay consecutive.
    ``sample`` is uniform over all sampleable transitions (rule 5 over the union of the rings):
    it splits the batch across the rings by a multinomial draw in proportion to what each may
    give (``sampleable()``), then draws uniformly within each, so every sampleable transition
    of every ring has the same chance, as in stage 08's single draw over all rings
    (``lib.replay_device``); the batch comes ordered by ring.

    The split once weighed the rings by ``len()``, which counts a wrapped ring's up to
    ``stack - 1`` transitions of rule 4: those rings got slightly more than their share (3 in
    a ring's 25k at K=4, a relative 1.2e-4 at most; 3 in 3.3k at K=30, 9e-4; far too little
    for 10^6 draws to detect, see tests/test_replay_device.py), and a ring holding only such
    transitions would have been asked for a draw it could never make."""

    def __init__(
        self, capacity: int, streams: int, frame_shape=FRAME_SHAPE, stack: int = STACK, seed: int | None = None
    ):
        per_stream = capacity // streams
        self.capacity = per_stream * streams
        self.stack = stack
        self.frame_shape = tuple(frame_shape)
        self.rng = np.random.default_rng(seed)
        self._out: dict[int, tuple] = {}
        self.streams = [
            ReplayBuffer(per_stream, frame_shape, stack, seed=None if seed is None else seed + 1 + i)
            for i in range(streams)
        ]

    def __len__(self) -> int:
        return sum(len(s) for s in self.streams)

    def add_vector_step(self, stepped, actions, rewards, terminated, dones, next_frames, starts=()) -> None:
        """One item of stage 07's play process (``parallel.VectorStep``), as stage 08's
        ``DeviceReplayBuffer.add_vector_step`` takes it: first env i's step for every i with
        ``stepped[i]``, then each ``(i, stack)`` of ``starts`` opens an episode of env i.
        ``stepped`` None: no step (the first item)."""
        if stepped is not None:
            for i in np.flatnonzero(stepped):
                self.streams[i].add_step(actions[i], rewards[i], terminated[i], next_frames[i], dones[i])
        for i, stack in starts:
            self.streams[i].start_episode(stack)

    def state_dict(self) -> dict:
        return {"streams": [s.state_dict() for s in self.streams], "rng": self.rng.bit_generator.state}

    def load_state_dict(self, state: dict) -> None:
        if len(state["streams"]) != len(self.streams):
            raise ValueError(f"a saved buffer of {len(state['streams'])} rings does not fit {len(self.streams)}")
        for stream, saved in zip(self.streams, state["streams"]):
            stream.load_state_dict(saved)
        self.rng.bit_generator.state = state["rng"]

    def batch_layout(self, batch_size: int):
        return self.streams[0].batch_layout(batch_size)

    def sample_indices(self, batch_size: int) -> np.ndarray:
        """``batch_size`` flat slot numbers (ring * ring capacity + slot), ordered by ring."""
        sizes = np.array([s.sampleable() for s in self.streams], dtype=np.float64)
        if sizes.sum() < 1:
            raise ValueError("the replay buffer holds no transition yet")
        counts = self.rng.multinomial(batch_size, sizes / sizes.sum())
        per = self.streams[0].capacity
        parts = [r * per + s.sample_indices(int(c)) for r, (s, c) in enumerate(zip(self.streams, counts)) if c]
        return np.concatenate(parts)

    def gather(self, idx: np.ndarray, out=None):
        """The transitions starting at flat slots ``idx`` (ordered by ring), as ``sample`` returns them."""
        batch_size = len(idx)
        if out is None:  # reused by the next call, as in ReplayBuffer.sample
            out = self._out.get(batch_size)
            if out is None:
                out = self._out[batch_size] = tuple(np.empty(s, d) for s, d in self.batch_layout(batch_size))
        per = self.streams[0].capacity
        rings = idx // per
        if np.any(rings[1:] < rings[:-1]):
            raise ValueError("slots to gather must come ordered by ring")
        bounds = np.searchsorted(rings, np.arange(len(self.streams) + 1))
        for r, stream in enumerate(self.streams):
            start, end = bounds[r], bounds[r + 1]
            if end > start:
                stream.gather(idx[start:end] - r * per, out=tuple(a[start:end] for a in out))
        return out

    def sample(self, batch_size: int, out=None):
        return self.gather(self.sample_indices(batch_size), out)

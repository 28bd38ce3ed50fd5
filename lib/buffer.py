"""Uniform experience replay that stores each 84x84 frame once.

The ring rules, which stage 08's rings on the device (``lib.replay_device``) follow as well, and
which one table of cases in ``tests/test_buffer.py`` checks on both kinds of ring:

1. A ring of ``capacity`` slots, written in order and wrapping around. A slot holds one frame
   and, when it starts a transition, that transition's action, reward and terminal flag.
2. The state of the transition in slot ``i`` is the stack of frames in slots ``i-3 .. i``; its
   next state is ``i-2 .. i+1`` (modulo ``capacity``; ``stack`` = 4 frames).
3. An episode begins with its first observation's four frames, written as *pad* slots; each
   step turns the slot of the state's newest frame into a transition and writes the new frame
   after it, as a pad slot. So an episode's three older first frames and its final frame are
   pads, a stack never crosses an episode boundary, and the stacking convention (first frame
   repeated, or zeros) is whatever the env gave.
4. Pad slots are never sampled; neither are the ``stack - 1`` oldest slots (from the cursor on)
   once the ring has wrapped: their transitions' older frames have been overwritten.
5. A batch is drawn uniformly, with replacement, from the transitions that rule 4 leaves
   (``sampleable()`` of them). ``len()`` counts the stored transitions, those of rule 4
   included until overwritten (up to ``stack - 1`` more than ``sampleable()``).

Each episode costs 4 extra slots, so a buffer of 100k slots holds about 99.6k Pong transitions
(a game lasts ~1000 agent steps).

Memory: 100k x 84 x 84 bytes = 706 MB of frames, plus the rest of each slot (``lib.run.memory.SLOT_BYTES``).

Stage 04 samples into pinned memory (``lib.staging``); stage 07 keeps a ring a game
(``lib.buffer_games``).
"""

from __future__ import annotations

import numpy as np
import torch

from lib.params import FRAME_SHAPE, STACK


class ReplayBuffer:
    def __init__(self, capacity: int, frame_shape=FRAME_SHAPE, stack: int = STACK, seed: int | None = None):
        if capacity < stack + 2:
            raise ValueError(f"replay capacity must be at least {stack + 2}")
        self.capacity = capacity
        self.stack = stack
        self.frame_shape = tuple(frame_shape)
        self.frames = np.zeros((capacity,) + self.frame_shape, dtype=np.uint8)
        self.actions = np.zeros(capacity, dtype=np.int64)
        self.rewards = np.zeros(capacity, dtype=np.float32)
        self.terminated = np.zeros(capacity, dtype=np.bool_)
        self.pad = np.ones(capacity, dtype=np.bool_)  # True: not the start of a transition
        self.cursor = 0  # next slot to write
        self.written = 0  # slots written in all
        self.transitions = 0  # sampleable transitions (pad slots excluded)
        self._open = False  # inside an episode: the last written frame is the current state
        self.rng = np.random.default_rng(seed)
        self._offsets = np.arange(-stack + 1, 2)  # -3 .. +1
        self._out: dict[int, tuple] = {}
        self._sampleable = (-1, 0)  # (written, sampleable) when last counted

    def __len__(self) -> int:
        """Transitions stored (not counting the up to three being overwritten at the wrap)."""
        return self.transitions

    _ARRAYS = ("frames", "actions", "rewards", "terminated", "pad")
    _COUNTERS = ("cursor", "written", "transitions", "_open")

    def state_dict(self) -> dict:
        """The ring as tensors (sharing this buffer's memory) and counters, with its RNG."""
        state = {name: torch.from_numpy(getattr(self, name)) for name in self._ARRAYS}
        state.update({name: getattr(self, name) for name in self._COUNTERS})
        state["rng"] = self.rng.bit_generator.state
        return state

    def load_state_dict(self, state: dict) -> None:
        if tuple(state["frames"].shape) != self.frames.shape:
            raise ValueError(f"a saved ring of {tuple(state['frames'].shape)} frames does not fit {self.frames.shape}")
        for name in self._ARRAYS:
            np.copyto(getattr(self, name), state[name].numpy())
        for name in self._COUNTERS:
            setattr(self, name, state[name])
        self.rng.bit_generator.state = state["rng"]
        self._sampleable = (-1, 0)

    def _write(self, frame) -> int:
        slot = self.cursor
        if not self.pad[slot]:
            self.transitions -= 1
        self.frames[slot] = frame
        self.pad[slot] = True
        self.cursor = (slot + 1) % self.capacity
        self.written += 1
        return slot

    def start_episode(self, state) -> None:
        """Write the first observation of an episode: ``stack`` frames, oldest first."""
        for i in range(self.stack):
            self._write(state[i])
        self._open = True

    def add_step(self, action: int, reward: float, terminated: bool, next_frame, done: bool) -> None:
        """Complete the transition from the current state: ``next_frame`` is the newest frame
        of the next state; ``done`` (terminated or truncated) closes the episode."""
        assert self._open, "start_episode() first"
        slot = (self.cursor - 1) % self.capacity
        self.actions[slot] = action
        self.rewards[slot] = reward
        self.terminated[slot] = terminated
        self.pad[slot] = False
        self.transitions += 1
        self._write(next_frame)
        self._open = not done

    def add(self, state, action: int, reward: float, terminated: bool, next_state, done: bool) -> None:
        """Add one transition of full stacked observations, storing only the new frames."""
        if not self._open:
            self.start_episode(state)
        self.add_step(action, reward, terminated, next_state[-1], done)

    def valid(self, idx: np.ndarray) -> np.ndarray:
        """Which of the slots ``idx`` start a transition that ``sample`` may draw."""
        ok = ~self.pad[idx]
        if self.written > self.capacity:
            # The three slots after the cursor hold transitions whose older frames are gone.
            ok &= (idx - self.cursor) % self.capacity >= self.stack - 1
        return ok

    def sampleable(self) -> int:
        """Transitions that ``sample`` may draw: ``len()`` less those of rule 4 still stored.
        Counted again only after a write (stage 07 asks each of its rings before every batch)."""
        if self.written <= self.capacity:
            return self.transitions
        if self._sampleable[0] != self.written:
            behind = (self.cursor + k for k in range(self.stack - 1))
            self._sampleable = (self.written, self.transitions - sum(not self.pad[i % self.capacity] for i in behind))
        return self._sampleable[1]

    def sample_indices(self, batch_size: int) -> np.ndarray:
        if self.sampleable() < 1:
            raise ValueError("the replay buffer holds no transition yet")
        high = min(self.written, self.capacity)
        out = np.empty(0, dtype=np.int64)
        while out.size < batch_size:
            cand = self.rng.integers(0, high, size=batch_size + batch_size // 8 + 4)
            out = np.concatenate([out, cand[self.valid(cand)]])
        return out[:batch_size]

    def batch_layout(self, batch_size: int):
        """(shape, dtype) of each array that ``sample`` returns."""
        stacked = (batch_size, self.stack) + self.frame_shape
        return [
            (stacked, np.uint8),
            ((batch_size,), np.int64),
            ((batch_size,), np.float32),
            ((batch_size,), np.bool_),
            (stacked, np.uint8),
        ]

    def sample(self, batch_size: int, out=None):
        """Uniform batch as contiguous arrays: states, actions, rewards, dones, next_states.

        ``out``: arrays of ``batch_layout(batch_size)`` to fill (pinned staging buffers).
        Without it, the arrays are the buffer's own, reused by the next call of the same size:
        a fresh 7 MB batch faults in new pages every step, which costs more than the gather.
        """
        return self.gather(self.sample_indices(batch_size), out)

    def gather(self, idx: np.ndarray, out=None):
        """The transitions starting at slots ``idx``, as ``sample`` returns them."""
        batch_size = len(idx)
        if out is None:
            out = self._out.get(batch_size)
            if out is None:
                out = self._out[batch_size] = tuple(np.empty(s, d) for s, d in self.batch_layout(batch_size))
        states, actions, rewards, dones, next_states = out
        rows = (idx[:, None] + self._offsets) % self.capacity
        # mode="clip": the indices are valid already, and the default mode="raise" copies
        # through a temporary buffer when out= is given (3x slower for a batch of 128).
        np.take(self.frames, rows[:, :-1], axis=0, out=states, mode="clip")
        np.take(self.frames, rows[:, 1:], axis=0, out=next_states, mode="clip")
        np.take(self.actions, idx, out=actions, mode="clip")
        np.take(self.rewards, idx, out=rewards, mode="clip")
        np.take(self.terminated, idx, out=dones, mode="clip")
        return states, actions, rewards, dones, next_states

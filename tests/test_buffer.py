"""Tests for lib.buffer.ReplayBuffer: what it gives back must be exactly the transitions that
were played, never a state paired with a next state from another episode or an overwritten
slot, in the dtypes the learner expects; and 100k Pong frames must fit in memory. The ring
rules themselves are one table of cases, run against this ring and stage 08's."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lib.buffer import ReplayBuffer
from lib.replay_device import DeviceReplayBuffer

ON_CUDA = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


# -- the ring rules (lib.buffer's docstring), one table for both kinds of ring ------------------
#
# Each case: capacity, what is written (one-pixel frames), then by hand the frame in every
# slot, each transition that may be sampled (slot: state, action, reward, terminated, next
# state) and len(). Run against ReplayBuffer and against stage 08's DeviceReplayBuffer with one
# ring, in each of its forms.
RING_CASES = {
    # Episode A from a repeated first frame (1 1 1 1) steps to 2, then to 3 where it terminates.
    # Episode B from a zero-padded stack (0 0 0 5) steps to 6, which wraps into slot 0:
    #
    #   slot:    0  1  2  3  4  5  6  7  8  9
    #   frame:   6  1  1  1  2  3  0  0  0  5
    #   starts:        .  x  A  .  .  .  .  B      (. pad slot, never sampled)
    #
    # x (slot 3, 1 1 1 1 -> 1 1 1 2) has lost its oldest frame (slot 0) to the wrap: never
    # sampled, but counted by len() until overwritten.
    "episode edges and the wrap": (
        10,
        [("start", 1, 1, 1, 1), ("step", 0, 1.0, False, 2, False), ("step", 1, -1.0, True, 3, True),
         ("start", 0, 0, 0, 5), ("step", 2, 0.5, False, 6, False)],
        [6, 1, 1, 1, 2, 3, 0, 0, 0, 5],
        {4: ((1, 1, 1, 2), 1, -1.0, True, (1, 1, 2, 3)), 9: ((0, 0, 0, 5), 2, 0.5, False, (0, 0, 5, 6))},
        3,
    ),
    # A truncated episode (done, not terminated) keeps its real last frame as next state and
    # bootstraps; the next episode's frames never enter its stack:
    #
    #   slot:    0  1  2  3  4  5  6  7  8  9 10 11
    #   frame:   1  1  1  1  2  9  9  9  9 10  0  0
    #   starts:  .  .  .  C  .  .  .  .  D  .
    "truncation keeps the next state": (
        12,
        [("start", 1, 1, 1, 1), ("step", 0, 0.0, False, 2, True), ("start", 9, 9, 9, 9),
         ("step", 1, 0.0, False, 10, False)],
        [1, 1, 1, 1, 2, 9, 9, 9, 9, 10, 0, 0],
        {3: ((1, 1, 1, 1), 0, 0.0, False, (1, 1, 1, 2)), 8: ((9, 9, 9, 9), 1, 0.0, False, (9, 9, 9, 10))},
        2,
    ),
    # One episode longer than the ring (6 slots): 1 1 1 1 -> 2 -> 3 -> 4 -> 5. Frames 4 and 5
    # wrap into slots 0 and 1; the cursor is at 2, so slots 2, 3, 4 are the oldest: 3 (1 1 1 1
    # -> 1 1 1 2) and 4 (1 1 1 2 -> 1 1 2 3) have lost older frames. Left: 5 and 0.
    #
    #   slot:    0  1  2  3  4  5
    #   frame:   4  5  1  1  2  3
    #   starts:  F  .  .  x  x  E
    "an episode longer than the ring": (
        6,
        [("start", 1, 1, 1, 1), ("step", 0, 0.0, False, 2, False), ("step", 1, 0.0, False, 3, False),
         ("step", 2, 1.0, False, 4, False), ("step", 3, 0.0, False, 5, False)],
        [4, 5, 1, 1, 2, 3],
        {5: ((1, 1, 2, 3), 2, 1.0, False, (1, 2, 3, 4)), 0: ((1, 2, 3, 4), 3, 0.0, False, (2, 3, 4, 5))},
        4,
    ),
}  # fmt: skip


class HostRing:
    """ReplayBuffer, as the table drives it."""

    def __init__(self, capacity):
        self.buffer = ReplayBuffer(capacity, frame_shape=(1,), seed=0)

    def write(self, op):
        if op[0] == "start":
            self.buffer.start_episode(np.array(op[1:], np.uint8)[:, None])
        else:
            action, reward, terminated, frame, done = op[1:]
            self.buffer.add_step(action, reward, terminated, [frame], done)

    def frames(self):
        return self.buffer.frames[:, 0].tolist()

    def sampleable(self):
        return np.flatnonzero(self.buffer.valid(np.arange(self.buffer.capacity))).tolist()

    def gather(self, slots):
        self.buffer.sample_indices = lambda n: np.array(slots)
        try:
            return self.buffer.sample(len(slots))
        finally:
            del self.buffer.sample_indices

    def sampled_states(self, batch_size):
        return self.buffer.sample(batch_size)[0]


class DeviceRing(HostRing):
    """Stage 08's DeviceReplayBuffer with one ring: written in place and gathered by numpy
    (its CPU form), or through one staged copy and gathered by torch (its CUDA form)."""

    def __init__(self, capacity, device="cpu", staged=False):
        self.buffer = DeviceReplayBuffer(
            capacity, 1, device=device, frame_shape=(1,), staged=staged, host_gather=not staged
        )

    def write(self, op):
        if op[0] == "start":
            self.buffer.start_episode(0, np.array(op[1:], np.uint8)[:, None])
        else:
            action, reward, terminated, frame, done = op[1:]
            self.buffer.add_step(0, action, reward, terminated, [frame], done)

    def frames(self):
        return self.buffer.frames[:, 0].tolist()

    def sampleable(self):
        return torch.nonzero(self.buffer.valid).flatten().tolist()

    def gather(self, slots):
        idx = torch.tensor(slots, device=self.buffer.device)
        return tuple(t.cpu().numpy() for t in self.buffer.gather(idx))

    def sampled_states(self, batch_size):
        return self.buffer.sample(batch_size)[0].cpu().numpy()


RINGS = {
    "host": HostRing,
    "device-cpu": DeviceRing,
    "device-cpu-staged": lambda capacity: DeviceRing(capacity, staged=True),
    "device-cuda": lambda capacity: DeviceRing(capacity, "cuda", staged=True),
}


@pytest.mark.parametrize("case", list(RING_CASES))
@pytest.mark.parametrize(
    "ring",
    [pytest.param(name, marks=ON_CUDA if name.endswith("cuda") else ()) for name in RINGS],
)
def test_ring_rules(ring, case):
    capacity, writes, frames, transitions, length = RING_CASES[case]
    r = RINGS[ring](capacity)
    for op in writes:
        r.write(op)
    assert r.frames() == frames
    assert r.sampleable() == sorted(transitions)
    assert len(r.buffer) == length
    slots = sorted(transitions)
    states, actions, rewards, dones, next_states = r.gather(slots)
    got = [
        (tuple(states[i, :, 0]), actions[i], rewards[i], dones[i], tuple(next_states[i, :, 0]))
        for i in range(len(slots))
    ]
    assert got == [transitions[s] for s in slots]
    # Rule 5: a batch comes from those transitions only, and (sampled long enough) all of them.
    drawn = {tuple(int(v) for v in state[:, 0]) for state in r.sampled_states(256)}
    assert drawn == {transitions[s][0] for s in slots}


def frame(episode: int, step: int) -> np.ndarray:
    """A frame that says which episode and step it is."""
    return np.array([episode, step], dtype=np.uint8)


def play(buffer: ReplayBuffer, episodes: int, rng, check_every_episode=None):
    """Play ``episodes`` scripted episodes into ``buffer`` and return the reference: every
    transition keyed by (episode, step) of its state's newest frame, with the index (among all
    frames ever written) of its state's oldest frame, and the number of frames written.

    Episodes vary in length, in reset convention (odd: first frame repeated; even: zero-padded,
    like ale_py's vector env), in how they end (terminated, or truncated: done without
    terminated) and in the API used (``add`` with full stacks, or ``start_episode``/``add_step``).
    """
    reference = {}
    writes = 0
    for e in range(1, episodes + 1):
        length = int(rng.integers(1, 12))
        terminated_at_end = e % 3 != 0
        first = frame(e, 0)
        zero = np.zeros_like(first)
        state = np.stack([first] * 4) if e % 2 else np.stack([zero, zero, zero, first])
        use_add = e % 4 in (1, 2)
        if not use_add:
            buffer.start_episode(state)
        writes += 4
        for t in range(1, length + 1):
            next_state = np.concatenate([state[1:], frame(e, t)[None]])
            action = (1 << 40) + 1000 * e + t  # needs int64
            reward = e + t / 8  # exact in float32
            terminated = terminated_at_end and t == length
            done = t == length
            if use_add:
                buffer.add(state, action, reward, terminated, next_state, done)
            else:
                buffer.add_step(action, reward, terminated, frame(e, t), done)
            reference[(e, t - 1)] = (state, action, reward, terminated, next_state, writes - 4)
            writes += 1
            state = next_state
            assert len(buffer) <= buffer.capacity
        if check_every_episode is not None:
            check_every_episode(reference, writes)
    return reference, writes


def available(reference, writes, capacity):
    """The transitions whose five frames (state and next state) are all among the last
    ``capacity`` frames written: exactly those the buffer may sample."""
    return {key for key, value in reference.items() if value[-1] >= writes - capacity}


def check_sample(buffer, reference, writes, batch_size=256):
    states, actions, rewards, dones, next_states = buffer.sample(batch_size)
    keys = set()
    for i in range(batch_size):
        key = tuple(int(v) for v in states[i, -1])
        state, action, reward, terminated, next_state, _ = reference[key]
        np.testing.assert_array_equal(states[i], state)
        np.testing.assert_array_equal(next_states[i], next_state)
        assert actions[i] == action and rewards[i] == np.float32(reward) and dones[i] == terminated
        keys.add(key)
    assert keys <= available(reference, writes, buffer.capacity)
    return keys


def test_episode_boundaries_and_wrap_around_with_unique_frames():
    capacity = 37
    buffer = ReplayBuffer(capacity, frame_shape=(2,), seed=1)
    wrapped = []

    def check(reference, writes):
        check_sample(buffer, reference, writes)
        expected = available(reference, writes, capacity)
        if writes <= capacity:
            assert len(buffer) == len(reference)
        else:
            wrapped.append(True)
            # len() may still count up to 3 transitions whose oldest frames the wrap overwrote.
            assert len(expected) <= len(buffer) <= len(expected) + 3
            assert len(buffer) <= capacity

    reference, writes = play(buffer, 60, np.random.default_rng(2), check)
    assert len(wrapped) > 40  # the ring went round many times
    # Sampled long enough, every available transition comes back, and only those.
    keys = set()
    for _ in range(40):
        keys |= check_sample(buffer, reference, writes)
    assert keys == available(reference, writes, capacity)


def test_dtypes_and_contiguous_outputs():
    buffer = ReplayBuffer(50, frame_shape=(84, 84), seed=0)
    play_pixels(buffer)
    batch = buffer.sample(8)
    dtypes = [np.uint8, np.int64, np.float32, np.bool_, np.uint8]
    shapes = [(8, 4, 84, 84), (8,), (8,), (8,), (8, 4, 84, 84)]
    for array, dtype, shape in zip(batch, dtypes, shapes):
        assert array.dtype == dtype
        assert array.shape == shape
        assert array.flags.c_contiguous
    assert [(s, d) for s, d in buffer.batch_layout(8)] == list(zip(shapes, dtypes))


def play_pixels(buffer, steps=20):
    state = np.stack([np.full((84, 84), 200, np.uint8)] * 4)
    buffer.start_episode(state)
    for t in range(1, steps + 1):
        buffer.add_step(t % 6, float(t % 3 - 1), t == steps, np.full((84, 84), t, np.uint8), t == steps)


def test_sample_fills_the_arrays_given():
    a = ReplayBuffer(50, frame_shape=(84, 84), seed=3)
    b = ReplayBuffer(50, frame_shape=(84, 84), seed=3)
    play_pixels(a)
    play_pixels(b)
    # Filled with junk first, so that a value left unwritten would show.
    out = tuple(np.full(shape, 1 if dtype == np.bool_ else 0xAB, dtype) for shape, dtype in b.batch_layout(16))
    result = b.sample(16, out=out)
    assert all(r is o for r, o in zip(result, out))
    for got, want in zip(out, a.sample(16)):  # same seed: the same draw
        np.testing.assert_array_equal(got, want)


def test_zero_padded_reset_stack_is_reproduced_exactly():
    buffer = ReplayBuffer(20, frame_shape=(84, 84), seed=0)
    first = np.random.default_rng(0).integers(1, 256, (84, 84), dtype=np.uint8)
    second = np.random.default_rng(1).integers(1, 256, (84, 84), dtype=np.uint8)
    zero = np.zeros((84, 84), np.uint8)
    buffer.start_episode(np.stack([zero, zero, zero, first]))
    buffer.add_step(3, 1.0, False, second, False)
    states, actions, rewards, dones, next_states = buffer.sample(4)
    for i in range(4):
        np.testing.assert_array_equal(states[i], np.stack([zero, zero, zero, first]))
        np.testing.assert_array_equal(next_states[i], np.stack([zero, zero, first, second]))
    assert (actions == 3).all() and (rewards == 1.0).all() and not dones.any()


def test_empty_and_too_small():
    with pytest.raises(ValueError):
        ReplayBuffer(5)
    buffer = ReplayBuffer(10, frame_shape=(1,))
    with pytest.raises(ValueError):
        buffer.sample(1)
    buffer.start_episode(np.zeros((4, 1), np.uint8))
    with pytest.raises(ValueError):
        buffer.sample(1)  # a first state alone is no transition


def vm_rss_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def test_footprint_of_100k_pong_transitions_is_under_1_gb():
    before = vm_rss_bytes()
    buffer = ReplayBuffer(100_000, frame_shape=(84, 84), seed=0)
    frame = np.full((84, 84), 7, np.uint8)  # every page of the ring gets written
    buffer.start_episode(np.stack([frame] * 4))
    for i in range(100_000):
        buffer.add_step(i % 6, 1.0, False, frame, False)
    grown = vm_rss_bytes() - before
    print(f"\nreplay buffer, 100k transitions of 84x84 frames: resident memory grew {grown / 2**20:.0f} MiB")
    assert len(buffer) <= 100_000
    assert grown >= 0.95 * buffer.frames.nbytes  # the figure measures the frames really stored
    assert grown < 1_000_000_000
    states = buffer.sample(32)[0]
    assert (states == 7).all()


def test_stream_buffer_keeps_each_env_apart_and_samples_all():
    """Stage 07's buffer: two envs interleaved step by step must never mix their frames.

    Env e's frame at step t is filled with 100*e + t, so a stack of a transition is exactly
    [t-3, t-2, t-1, t] + 100*e (clamped at the episode's first frame) and its next stack is
    shifted by one, all from the same e."""
    from lib.buffer_games import StreamReplayBuffer

    buf = StreamReplayBuffer(capacity=200, streams=2, seed=0)
    for e in range(2):
        buf.streams[e].start_episode(np.full((4, 84, 84), 100 * e, dtype=np.uint8))
    for t in range(1, 41):
        for e in range(2):
            buf.streams[e].add_step(e, float(t), False, np.full((84, 84), 100 * e + t, dtype=np.uint8), False)
    assert len(buf) == 80
    states, actions, rewards, dones, next_states = buf.sample(256)
    assert set(actions.tolist()) == {0, 1}  # both envs are sampled
    for s, a, r, n in zip(states, actions, rewards, next_states):
        t = int(r)
        want = [100 * a + max(0, t - k) for k in (4, 3, 2, 1)]
        assert s[:, 0, 0].tolist() == want
        assert n[:, 0, 0].tolist() == want[1:] + [100 * a + t]


def test_stream_buffer_takes_a_vector_step_as_stage_07_applied_it_by_hand():
    """``StreamReplayBuffer.add_vector_step`` (stage 07's write of one play-process item, as 08's
    device ring takes it) leaves the rings as the per-ring writes of tests/test_replay_device.py's
    reference do: over games with autoresets, lost lives and rings that wrap, slot for slot."""
    from lib.buffer_games import StreamReplayBuffer
    from tests.test_replay_device import apply_to_reference, vector_stream

    got, want = (StreamReplayBuffer(3 * 23, 3, frame_shape=(3,)) for _ in range(2))
    for starts, *step in vector_stream(3, 150, seed=3, max_length=9):
        got.add_vector_step(*step, starts)
        apply_to_reference(want, (starts, *step))
    for g, w in zip(got.streams, want.streams):
        assert w.written > 2 * w.capacity and (g.cursor, g.written) == (w.cursor, w.written)
        for name in ("frames", "pad", "actions", "rewards", "terminated"):
            assert np.array_equal(getattr(g, name), getattr(w, name)), name


def test_stream_buffer_samples_in_proportion_to_unequal_rings():
    # Rings holding 10, 30 and 60 transitions: a uniform draw over all 100 stored transitions
    # takes 10%, 30% and 60% of each batch from them. Over 400 batches of 50 (20,000 draws)
    # the standard deviation of a share is at most sqrt(0.6 * 0.4 / 20000) = 0.35 points;
    # a tolerance of 1.5 points is over four of those.
    from lib.buffer_games import StreamReplayBuffer

    buf = StreamReplayBuffer(capacity=600, streams=3, frame_shape=(2, 2), seed=0)
    for ring, (stream, count) in enumerate(zip(buf.streams, (10, 30, 60))):
        stream.start_episode(np.full((4, 2, 2), 200 + ring, dtype=np.uint8))
        for i in range(count):
            stream.add_step(ring, float(i), False, np.full((2, 2), ring, dtype=np.uint8), False)
    assert [len(s) for s in buf.streams] == [10, 30, 60]
    taken = np.zeros(3)
    for _ in range(400):
        states, actions, rewards, dones, next_states = buf.sample(50)
        # The action of each transition names its ring; its next frame was written in that ring.
        assert np.array_equal(next_states[:, -1, 0, 0], actions)
        taken += np.bincount(actions, minlength=3)
        # Rewards are the step numbers 0..count-1 of that ring: every draw is a stored transition.
        assert all(0 <= r < (10, 30, 60)[a] for r, a in zip(rewards, actions))
    shares = taken / taken.sum()
    assert np.allclose(shares, [0.1, 0.3, 0.6], atol=0.015), shares


def test_stream_buffer_weighs_rings_by_the_transitions_they_may_give():
    # Two rings of 8 slots, one-pixel frames. Ring 0: an episode from (1 1 1 1) steps 8 times
    # to a game over, wrapping; the next episode's first stack (5 5 5 5) fills slots 4-7.
    #
    #   slot:        0  1  2  3  4  5  6  7
    #   frame:       6  7  8  9  5  5  5  5     cursor 0: slots 0-2 lost their oldest frames
    #   transition:  T  T  T  .  .  .  .  .     len 3, sampleable 0
    #
    # Ring 1: one transition, sampleable. Weighed by len() (the rule before), ring 0 would get
    # 3/4 of every batch and its draw could never end; by what each may give, all of it goes to
    # ring 1. One more step in ring 0 makes slot 7 (5 5 5 5 -> 5 5 5 11) a transition and
    # overwrites slot 0: len 3 (1, 2, 7), sampleable 1 (7), so each ring's due is 1/2 (the rule
    # before: 3/4 to ring 0). 20,000 draws: the standard deviation of a share is 0.35 points.
    from lib.buffer_games import StreamReplayBuffer

    buf = StreamReplayBuffer(capacity=16, streams=2, frame_shape=(1,), seed=0)
    ring0, ring1 = buf.streams
    ring0.start_episode(np.full((4, 1), 1, np.uint8))
    for t in range(8):
        ring0.add_step(0, 0.0, t == 7, np.full(1, 2 + t, np.uint8), t == 7)
    ring0.start_episode(np.full((4, 1), 5, np.uint8))
    ring1.start_episode(np.full((4, 1), 20, np.uint8))
    ring1.add_step(1, 0.0, False, np.full(1, 21, np.uint8), False)
    assert ring0.frames[:, 0].tolist() == [6, 7, 8, 9, 5, 5, 5, 5] and ring0.cursor == 0
    assert (len(ring0), ring0.sampleable(), len(ring1), ring1.sampleable()) == (3, 0, 1, 1)
    with pytest.raises(ValueError):
        ring0.sample(1)  # nothing it may give: an error, not an endless redraw
    assert set(buf.sample_indices(1000).tolist()) == {8 + 4 - 1}  # ring 1's slot 3
    ring0.add_step(2, 0.0, False, np.full(1, 11, np.uint8), False)
    assert (len(ring0), ring0.sampleable()) == (3, 1)
    draws = np.concatenate([buf.sample_indices(100) for _ in range(200)])
    assert set(draws.tolist()) == {7, 11}  # ring 0's slot 7, ring 1's slot 3
    share0 = np.mean(draws == 7)
    assert abs(share0 - 0.5) < 0.015, share0
    states, actions, _, _, next_states = buf.gather(np.array([7, 11]))
    assert states[:, :, 0].tolist() == [[5, 5, 5, 5], [20, 20, 20, 20]]
    assert next_states[:, :, 0].tolist() == [[5, 5, 5, 11], [20, 20, 20, 21]] and actions.tolist() == [2, 1]
    with pytest.raises(ValueError):
        buf.gather(np.array([11, 7]))  # a batch comes ordered by ring

"""Tests for lib.replay_device.DeviceReplayBuffer: for the same stream of vector steps it must
hold and return exactly what stage 07's StreamReplayBuffer holds and returns (frames, pad
slots, which transitions may be sampled, actions, rewards, terminal flags, stacks), sample
only valid transitions and all of them alike, and do so with no host synchronisation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from lib.buffer_games import StreamReplayBuffer
from lib.replay_device import DeviceReplayBuffer

ON_CUDA = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


# -- a scripted stream of stage 07's play-process items ------------------------------------------


def vector_stream(streams: int, vector_steps: int, seed: int, frame_shape=(3,), max_length: int = 12):
    """Stage 07's items (starts, stepped, actions, rewards, terminated, dones, next_frames) for
    ``streams`` scripted games. Each frame is unique where frame_shape is (3,): (env, episode,
    step). Episodes last 1..max_length steps and end three ways: a lost life (done and terminated; the
    next episode starts in the same item from the current stack, the game goes on), game over
    (done and terminated; the next item is the env's reset step: not stepped, a start), or
    truncation (done, not terminated; then a reset step). Start stacks alternate between the
    first frame repeated and zero-padded (ale-py's vector env)."""
    rng = np.random.default_rng(seed)
    episode = np.zeros(streams, dtype=np.int64)
    step = np.zeros(streams, dtype=np.int64)
    length = rng.integers(1, max_length + 1, streams)
    obs = np.zeros((streams, 4) + frame_shape, dtype=np.uint8)

    def frame(i):
        if frame_shape == (3,):
            return np.array([i, episode[i] % 256, step[i] % 256], dtype=np.uint8)
        return rng.integers(0, 256, frame_shape, dtype=np.uint8)

    def new_stack(i):
        first = frame(i)
        if episode[i] % 2:
            return np.stack([first] * 4)
        return np.stack([np.zeros_like(first)] * 3 + [first])

    for i in range(streams):
        obs[i] = new_stack(i)
    yield [(i, obs[i].copy()) for i in range(streams)], None, None, None, None, None, None
    resetting = np.zeros(streams, dtype=bool)
    for _ in range(vector_steps):
        stepped = ~resetting
        actions = rng.integers(0, 6, streams)
        rewards = rng.choice(np.array([-1.0, 0.0, 1.0], np.float32), streams)
        terminated = np.zeros(streams, dtype=bool)
        dones = np.zeros(streams, dtype=bool)
        game_over = np.zeros(streams, dtype=bool)
        starts = []
        for i in range(streams):
            if resetting[i]:  # the autoreset step: no transition, a new episode
                episode[i] += 1
                step[i] = 0
                obs[i] = new_stack(i)
                starts.append((i, obs[i].copy()))
                continue
            step[i] += 1
            obs[i] = np.concatenate([obs[i][1:], frame(i)[None]])
            if step[i] == length[i]:
                how = rng.choice(["life", "over", "truncated"])
                dones[i] = True
                terminated[i] = how != "truncated"
                length[i] = rng.integers(1, max_length + 1)
                if how == "life":
                    episode[i] += 1
                    step[i] = 0
                    starts.append((i, obs[i].copy()))
                else:
                    game_over[i] = True
        yield starts, stepped, actions, rewards, terminated, dones, obs[:, -1].copy()
        resetting = game_over


def apply_to_reference(ref: StreamReplayBuffer, item) -> None:
    """What stage 07's trainer does with an item."""
    starts, stepped, actions, rewards, terminated, dones, next_frames = item
    if stepped is not None:
        for i in np.flatnonzero(stepped):
            ref.streams[i].add_step(actions[i], rewards[i], terminated[i], next_frames[i], dones[i])
    for i, stack in starts:
        ref.streams[i].start_episode(stack)


def apply_to_device(buffer: DeviceReplayBuffer, item) -> None:
    starts, stepped, actions, rewards, terminated, dones, next_frames = item
    buffer.add_vector_step(stepped, actions, rewards, terminated, dones, next_frames, starts)


def reference_batch(ref: StreamReplayBuffer, flat) -> tuple:
    """The reference's own gather (ReplayBuffer.sample) for flat slot numbers, in their order."""
    per = ref.streams[0].capacity
    rows = []
    for f in np.asarray(flat):
        ring = ref.streams[int(f) // per]
        ring.sample_indices = lambda n, slot=int(f) % per: np.array([slot])
        rows.append(tuple(a.copy() for a in ring.sample(1)))
        del ring.sample_indices
    return tuple(np.concatenate(parts) for parts in zip(*rows))


def reference_valid(ref: StreamReplayBuffer) -> np.ndarray:
    """Flat slot numbers the reference may sample, ring after ring."""
    per = ref.streams[0].capacity
    return np.concatenate([r * per + np.flatnonzero(s.valid(np.arange(per))) for r, s in enumerate(ref.streams)])


def as_numpy(batch) -> tuple:
    return tuple(t.cpu().numpy() for t in batch)


def assert_same_as_reference(buffer: DeviceReplayBuffer, ref: StreamReplayBuffer) -> None:
    k, per = buffer.streams, buffer.per_stream
    assert len(buffer) == len(ref)
    frames = buffer.frames.cpu().view((k, per) + buffer.frame_shape).numpy()
    valid = buffer.valid.cpu().view(k, per).numpy()
    actions = buffer.actions.cpu().view(k, per).numpy()
    rewards = buffer.rewards.cpu().view(k, per).numpy()
    terminated = buffer.terminated.cpu().view(k, per).numpy()
    for r, ring in enumerate(ref.streams):
        np.testing.assert_array_equal(frames[r], ring.frames)
        np.testing.assert_array_equal(buffer.pad[r], ring.pad)
        np.testing.assert_array_equal(valid[r], ring.valid(np.arange(per)))
        starts = ~ring.pad
        np.testing.assert_array_equal(actions[r][starts], ring.actions[starts])
        np.testing.assert_array_equal(rewards[r][starts], ring.rewards[starts])
        np.testing.assert_array_equal(terminated[r][starts], ring.terminated[starts])
    flat = reference_valid(ref)
    assert int(buffer.fill()) == len(flat) == sum(ring.sampleable() for ring in ref.streams)
    if len(flat):
        got = as_numpy(buffer.gather(torch.from_numpy(flat).to(buffer.device)))
        for g, want in zip(got, reference_batch(ref, flat)):
            assert g.dtype == want.dtype
            np.testing.assert_array_equal(g, want)


# -- the same contents as stage 07's buffer ----------------------------------------------------


def one_pixel_frames(*values) -> np.ndarray:
    return np.array(values, np.uint8).reshape(-1, 1)


def test_small_case_written_out_by_hand():
    # Two rings of 10 slots each (capacity 20), one-pixel frames. Ring 0 replays the first case
    # of test_buffer's ring rules: episode A from (1 1 1 1) steps to 2, then to 3 where the game
    # ends; after its reset step, episode B from (0 0 0 5) steps to 6, which wraps into slot 0.
    # Ring 1: one episode from (7 7 7 7) steps to 8.
    #
    #   flat slot:  0  1  2  3  4  5  6  7  8  9 | 10 11 12 13 14 15 16 17 18 19
    #   frame:      6  1  1  1  2  3  0  0  0  5 |  7  7  7  7  8  0  0  0  0  0
    #   starts:        .  x  A  .  .  .  .  B   |  .  .  .  C
    #
    # x (3) lost its oldest frame to ring 0's wrap; A (4), B (9) and C (13) may be sampled:
    # A: 1 1 1 2 -> 1 1 2 3, action 1, reward -1, terminated
    # B: 0 0 0 5 -> 0 0 5 6 (slot 9's next frame is slot 0, not ring 1's slot 10)
    # C: 7 7 7 7 -> 7 7 7 8, action 3, reward 0.25
    buffer = DeviceReplayBuffer(20, 2, frame_shape=(1,))
    f = one_pixel_frames
    no = np.zeros(2)
    buffer.add_vector_step(None, None, None, None, None, None, [(0, f(1, 1, 1, 1)), (1, f(7, 7, 7, 7))])
    buffer.add_vector_step([True, True], [0, 3], [1.0, 0.25], [False, False], [False, False], f(2, 8), [])
    buffer.add_vector_step([True, False], [1, 0], [-1.0, 0], [True, False], [True, False], f(3, 0), [])
    buffer.add_vector_step([False, False], no, no, no, no, f(0, 0), [(0, f(0, 0, 0, 5))])
    buffer.add_vector_step([True, False], [2, 0], [0.5, 0], [False, False], [False, False], f(6, 0), [])

    assert buffer.frames[:, 0].tolist() == [6, 1, 1, 1, 2, 3, 0, 0, 0, 5, 7, 7, 7, 7, 8, 0, 0, 0, 0, 0]
    assert torch.nonzero(buffer.valid).flatten().tolist() == [4, 9, 13]
    assert int(buffer.fill()) == 3
    assert len(buffer) == 4  # as StreamReplayBuffer counts: x is still counted until overwritten
    # The u-th valid slot for every u in [0, fill): exactly A, B, C.
    assert buffer.indices_for(torch.arange(3)).tolist() == [4, 9, 13]
    states, actions, rewards, dones, next_states = buffer.gather(torch.tensor([4, 9, 13]))
    assert states[:, :, 0].tolist() == [[1, 1, 1, 2], [0, 0, 0, 5], [7, 7, 7, 7]]
    assert next_states[:, :, 0].tolist() == [[1, 1, 2, 3], [0, 0, 5, 6], [7, 7, 7, 8]]
    assert actions.tolist() == [1, 2, 3]
    assert rewards.tolist() == [-1.0, 0.5, 0.25]
    assert dones.tolist() == [True, False, False]


@pytest.mark.parametrize(
    ("device", "staged"),
    [("cpu", False), ("cpu", True), pytest.param("cuda", True, marks=ON_CUDA)],
    ids=["cpu-in-place-numpy-gather", "cpu-staged-torch-gather", "cuda"],
)
@pytest.mark.parametrize("streams", [1, 3])
@pytest.mark.parametrize("max_length", [12, 60], ids=["short-episodes", "episodes-longer-than-a-ring"])
def test_same_contents_and_batches_as_stage_07_buffer(max_length, streams, device, staged):
    """After every vector step: the same frames, pad slots, valid slots, transitions and stacks,
    through short and long episodes, lost lives, resets, truncations and many wraps of small
    rings (23 slots each). On CPU both the CPU form (writes in place, numpy gather) and the
    CUDA form (one staged copy, index_select gather) run."""
    capacity = 23 * streams
    ref = StreamReplayBuffer(capacity, streams, frame_shape=(3,))
    buffer = DeviceReplayBuffer(
        capacity, streams, device=device, frame_shape=(3,), staged=staged, host_gather=not staged
    )
    wraps = 0
    for item in vector_stream(streams, 150, seed=streams, max_length=max_length):
        apply_to_reference(ref, item)
        apply_to_device(buffer, item)
        assert_same_as_reference(buffer, ref)
        wraps = int(buffer.written.min()) // buffer.per_stream
    assert wraps >= 4  # every ring went round several times


def test_pixel_frames_through_the_staged_copy():
    """84x84 frames through the packed host buffer, against the reference and the in-place path."""
    ref = StreamReplayBuffer(60, 2)
    staged = DeviceReplayBuffer(60, 2, staged=True, host_gather=False)
    in_place = DeviceReplayBuffer(60, 2, staged=False, host_gather=True)
    items = list(vector_stream(2, 40, seed=5, frame_shape=(84, 84)))
    for item in items:
        apply_to_reference(ref, item)
        apply_to_device(staged, item)
        apply_to_device(in_place, item)
    assert_same_as_reference(staged, ref)
    assert_same_as_reference(in_place, ref)
    assert torch.equal(staged.frames, in_place.frames) and torch.equal(staged.valid, in_place.valid)


class OpLog(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func.overloadpacket)
        return func(*args, **(kwargs or {}))


def test_one_copy_per_vector_step():
    """The staged path sends a vector step's frames, actions, rewards, flags and validity in one copy."""
    buffer = DeviceReplayBuffer(60, 3, staged=True)
    items = vector_stream(3, 20, seed=1, frame_shape=(84, 84))
    copies = []
    for item in items:
        with OpLog() as log:
            apply_to_device(buffer, item)
        copies.append(log.ops.count(torch.ops.aten.copy_))
    assert copies == [1] * len(copies)


# -- sampling: valid transitions only, uniformly, with no host synchronisation ------------------


def filled(streams=3, capacity=69, vector_steps=120, seed=2):
    ref = StreamReplayBuffer(capacity, streams, frame_shape=(3,))
    buffer = DeviceReplayBuffer(capacity, streams, frame_shape=(3,))
    for item in vector_stream(streams, vector_steps, seed=seed):
        apply_to_reference(ref, item)
        apply_to_device(buffer, item)
    return buffer, ref


def test_every_draw_maps_to_a_distinct_valid_slot():
    """By construction: the integers 0 .. fill-1 map one to one onto the valid slots, so a
    uniform integer gives a uniform transition, and a pad slot has no integer."""
    buffer, ref = filled()
    expected = reference_valid(ref)
    fill = int(buffer.fill())
    assert fill == len(expected) > 20
    assert len(expected) < buffer.capacity - 10  # plenty of pad and overwritten slots to avoid
    np.testing.assert_array_equal(buffer.indices_for(torch.arange(fill)).numpy(), expected)


def test_sampling_is_uniform_over_valid_transitions_and_never_a_pad():
    buffer, ref = filled()
    expected = reference_valid(ref)
    torch.manual_seed(0)
    draws = torch.cat([buffer.sample_indices(512) for _ in range(60)]).numpy()
    assert set(draws.tolist()) == set(expected.tolist())  # every valid slot, nothing else
    counts = np.bincount(draws, minlength=buffer.capacity)[expected]
    mean = len(draws) / len(expected)
    # ~560 draws per slot, standard deviation ~24: 25 % is more than 5 sigma either way.
    assert counts.min() > 0.75 * mean and counts.max() < 1.25 * mean, counts


def test_sample_shapes_dtypes_and_reused_tensors():
    buffer, _ = filled()
    first = buffer.sample(16)
    second = buffer.sample(16)
    layout = buffer.batch_layout(16)
    for t, (shape, dtype) in zip(second, layout):
        assert tuple(t.shape) == shape and t.dtype == dtype
    assert all(a.data_ptr() == b.data_ptr() for a, b in zip(first, second))  # no new tensors per step
    states, _, _, _, next_states = second
    assert torch.equal(states[:, 1:], next_states[:, :-1])  # one gather: next state is the shifted stack


# -- 07's and 08's samplers in distribution, over a Pong-sized ring ------------------------------
#
# 07 (StreamReplayBuffer) splits a batch across its K rings by a multinomial draw weighted by what
# each ring may give, then draws uniformly within each; 08 draws once, uniformly, over the valid
# slots of all rings (cumsum and searchsorted). Both should be the uniform law over the valid
# slots. A ring of 100k slots in K rings, each written ~1.4-1.9 laps with Pong-length episodes
# (800-1000 transitions, each with its 3 leading pads and its final one; the last one still open)
# and wrapped mid-episode, so that every ring holds 3 unsampleable transitions at its cursor;
# 10^6 draws from each sampler (10 batches of 100k: the law of a draw does not depend on the
# batch size), with fixed seeds. Each figure is tested where a true uniform sampler fails it
# with probability under 1e-4: the share per ring (chi-square, K - 1 degrees of freedom), the
# count per valid slot (chi-square, ~10 expected per slot), 07 against 08 slot by slot
# (chi-square of homogeneity) and the mean age of the sampled transitions (slots written to
# the ring since, against the exact mean over the valid slots: a z-score).

DRAWS, DRAW_BATCH = 10**6, 100_000


def pong_rings(streams: int, capacity: int = 100_000, seed: int = 0):
    """A StreamReplayBuffer and a DeviceReplayBuffer holding the same Pong-sized rings (one-pixel
    frames), written through ReplayBuffer's own start_episode and add_step."""
    rng = np.random.default_rng(seed)
    ref = StreamReplayBuffer(capacity, streams, frame_shape=(1,), seed=seed)
    stack, frame = np.zeros((4, 1), np.uint8), np.zeros(1, np.uint8)
    for ring in ref.streams:
        until = int(1.4 * ring.capacity) + int(rng.integers(0, ring.capacity // 2))
        while ring.written < until:
            ring.start_episode(stack)
            length = int(rng.integers(800, 1001))
            for t in range(min(length, until - ring.written)):
                ring.add_step(0, 0.0, t == length - 1, frame, t == length - 1)
    rings = ref.state_dict()["streams"]
    state = {"capacity": ref.capacity, "streams": streams, "stack": 4, "frame_shape": [1]}
    for name in ("frames", "actions", "rewards", "terminated"):
        state[name] = torch.cat([r[name] for r in rings])
    state["pad"] = torch.stack([r["pad"] for r in rings])
    for name in ("cursor", "written", "transitions"):
        state[name] = torch.tensor([r[name] for r in rings])
    state["open"] = torch.tensor([r["_open"] for r in rings])
    device = DeviceReplayBuffer(ref.capacity, streams, frame_shape=(1,), generator=torch.Generator().manual_seed(seed))
    device.load_state_dict(state)
    return ref, device


def chi_square_p(statistic: float, df: int) -> float:
    """P(X >= statistic) for X chi-square with ``df`` degrees of freedom."""
    half = torch.tensor([df / 2, statistic / 2], dtype=torch.float64)
    return float(torch.special.gammaincc(half[0], half[1]))


def sampler_figures(draws: np.ndarray, ref: StreamReplayBuffer) -> dict:
    """Share per ring, per-slot counts and age of ``draws`` (flat slot numbers) against the
    uniform law over ``ref``'s valid slots; chi-square statistics with their p-values."""
    per, k, n = ref.streams[0].capacity, len(ref.streams), len(draws)
    valid = reference_valid(ref)
    counts = np.bincount(draws, minlength=ref.capacity)
    expected_share = np.bincount(valid // per, minlength=k) / len(valid)
    taken = np.bincount(draws // per, minlength=k)
    ring_chi2 = float(((taken - n * expected_share) ** 2 / (n * expected_share)).sum())
    slot_mean = n / len(valid)
    slot_chi2 = float(((counts[valid] - slot_mean) ** 2).sum() / slot_mean)
    cursors = np.array([s.cursor for s in ref.streams])

    def age(flat):  # slots written to the transition's ring after it
        return (cursors[flat // per] - 1 - flat % per) % per

    ages = age(valid)
    return {
        "share": taken / n,
        "expected_share": expected_share,
        "ring_chi2": ring_chi2,
        "ring_p": chi_square_p(ring_chi2, k - 1),
        "slot_chi2": slot_chi2,
        "slot_df": len(valid) - 1,
        "slot_p": chi_square_p(slot_chi2, len(valid) - 1),
        "outside": int(n - counts[valid].sum()),  # draws of a pad or an unsampleable slot
        "mean_age": float(age(draws).mean()),
        "expected_age": float(ages.mean()),
        "age_z": float((age(draws).mean() - ages.mean()) / (ages.std() / np.sqrt(n))),
        "counts": counts,
    }


def homogeneity(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """Chi-square of two samplers' per-slot counts (equal totals) having one law; with its p-value."""
    both = (a + b) > 0
    statistic = float(((a[both] - b[both]) ** 2 / (a[both] + b[both])).sum())
    return statistic, chi_square_p(statistic, int(both.sum()) - 1)


def draws_07(ref: StreamReplayBuffer) -> np.ndarray:
    return np.concatenate([ref.sample_indices(DRAW_BATCH) for _ in range(DRAWS // DRAW_BATCH)])


def draws_08(device: DeviceReplayBuffer) -> np.ndarray:
    return torch.cat([device.sample_indices(DRAW_BATCH) for _ in range(DRAWS // DRAW_BATCH)]).numpy()


def assert_uniform(figures: dict) -> None:
    assert figures["outside"] == 0
    assert figures["ring_p"] > 1e-4, figures["ring_chi2"]
    assert figures["slot_p"] > 1e-4, figures["slot_chi2"]
    assert abs(figures["age_z"]) < 4, figures["age_z"]


@pytest.mark.parametrize("streams", [4, 30])
def test_samplers_of_07_and_08_draw_the_same_uniform_law(streams):
    ref, device = pong_rings(streams)
    per = ref.streams[0].capacity
    # The rings as described: wrapped mid-episode, 3 unsampleable transitions at each cursor.
    assert all(s.written > per and len(s) - s.sampleable() == 3 for s in ref.streams)
    assert int(device.fill()) == sum(s.sampleable() for s in ref.streams) > 0.99 * ref.capacity
    got07, got08 = sampler_figures(draws_07(ref), ref), sampler_figures(draws_08(device), ref)
    assert_uniform(got07)
    assert_uniform(got08)
    _, p = homogeneity(got07["counts"], got08["counts"])
    assert p > 1e-4


def nudged_draws(ref: StreamReplayBuffer, rng) -> np.ndarray:
    """A sampler with a plausible bug: a draw that lands on a pad or an unsampleable slot moves
    on to the next valid slot, so an episode's first transition is drawn ~5 times as often."""
    valid = reference_valid(ref)
    return valid[np.searchsorted(valid, rng.integers(0, ref.capacity, DRAWS)) % len(valid)]


def tilted_draws(ref: StreamReplayBuffer, rng, tilt: float = 1.03) -> np.ndarray:
    """07's split with ring 0 weighed ``tilt`` times its due, then uniform within each ring."""
    per, valid = ref.streams[0].capacity, reference_valid(ref)
    weights = np.bincount(valid // per, minlength=len(ref.streams)).astype(np.float64)
    weights[0] *= tilt
    rings = rng.choice(len(weights), DRAWS, p=weights / weights.sum())
    out = np.empty(DRAWS, np.int64)
    for r in range(len(weights)):
        mine = valid[valid // per == r]
        out[rings == r] = mine[rng.integers(0, len(mine), int((rings == r).sum()))]
    return out


def recent_draws(ref: StreamReplayBuffer, rng, keep: float = 0.9) -> np.ndarray:
    """Uniform over the valid slots among the newest ``keep`` of each ring, as if the rings
    were 10 % smaller: the oldest transitions are never drawn."""
    per, valid = ref.streams[0].capacity, reference_valid(ref)
    cursors = np.array([s.cursor for s in ref.streams])
    young = valid[(cursors[valid // per] - 1 - valid % per) % per < keep * per]
    return young[rng.integers(0, len(young), DRAWS)]


def test_the_sampler_comparison_rejects_a_biased_sampler():
    """The same figures and bounds fail samplers that are off, each on the figure its bias
    moves: a draw moved on to the next valid slot (the count per slot), a ring given 3 % more
    than its share (the share per ring), the oldest tenth of each ring never drawn (the age)."""
    ref, _ = pong_rings(4)
    rng = np.random.default_rng(1)
    nudged = sampler_figures(nudged_draws(ref, rng), ref)
    assert nudged["outside"] == 0 and nudged["slot_p"] < 1e-12 and nudged["ring_p"] > 1e-4
    tilted = sampler_figures(tilted_draws(ref, rng), ref)
    assert tilted["outside"] == 0 and tilted["ring_p"] < 1e-12 and tilted["slot_p"] > 1e-4
    recent = sampler_figures(recent_draws(ref, rng), ref)
    assert recent["outside"] == 0 and recent["age_z"] < -100


FORBIDDEN = {
    torch.ops.aten._local_scalar_dense,  # .item(), float(t), bool(t): a host read
    torch.ops.aten.is_nonzero,
    torch.ops.aten.nonzero,
    torch.ops.aten.masked_select,
    torch.ops.aten._unique,
    torch.ops.aten._unique2,
    torch.ops.aten.unique_dim,
    torch.ops.aten.unique_consecutive,
}
INDEXING = {torch.ops.aten.index, torch.ops.aten.index_put, torch.ops.aten.index_put_, torch.ops.aten._index_put_impl_}


class NoHostSync(TorchDispatchMode):
    """Fails on the ops a CUDA graph cannot hold: host reads of device values, and ops whose
    output shape depends on the data (nonzero, masked_select, boolean-mask indexing, unique)."""

    def __init__(self):
        super().__init__()
        self.seen = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        packet = func.overloadpacket
        self.seen.add(packet)
        if packet in FORBIDDEN:
            raise AssertionError(f"{func} needs the host or has a data-dependent shape")
        if packet in INDEXING:
            for index in args[1]:
                if index is not None and index.dtype in (torch.bool, torch.uint8):
                    raise AssertionError(f"{func} with a boolean mask has a data-dependent shape")
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize(
    "forbidden",
    [
        lambda t: t.sum().item(),
        lambda t: float(t.max()),
        lambda t: t[t > 0.5],
        lambda t: t.masked_select(t > 0.5),
        lambda t: torch.nonzero(t),
        lambda t: torch.unique(t),
        lambda t: t.index_put_((t > 0.5,), torch.tensor(0.0)),
    ],
    ids=["item", "float", "mask-index", "masked_select", "nonzero", "unique", "mask-index_put"],
)
def test_the_guard_catches_what_a_capture_cannot_hold(forbidden):
    with pytest.raises(AssertionError), NoHostSync():
        forbidden(torch.rand(8))


def test_sampling_loss_and_backward_never_read_the_device_on_the_host():
    """Stage 08's draw, gather, loss (07's form: bf16 autocast, channels_last, target under
    inference_mode) and backward, all under the guard. Adam's CPU step reads its step counter
    on the host; the CUDA tests cover the optimizer in the captured step."""
    from lib.loss import calc_loss
    from lib.model import DQN

    buffer = DeviceReplayBuffer(120, 2, host_gather=False)  # the CUDA form's gather
    for item in vector_stream(2, 40, seed=3, frame_shape=(84, 84)):
        apply_to_device(buffer, item)
    torch.manual_seed(0)
    net = DQN((4, 84, 84), 6).to(memory_format=torch.channels_last)
    tgt_net = DQN((4, 84, 84), 6).to(memory_format=torch.channels_last)
    with NoHostSync() as guard:
        batch = buffer.sample(32)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss_v = calc_loss(
                batch, net, tgt_net, 0.99, buffer.device, True, channels_last=True, inference_target=True
            )
        loss_v.backward()
    assert net.conv[0].weight.grad is not None and net.conv[0].weight.grad.abs().sum() > 0
    # What ran under the guard: the draw, the gather, the forward and the backward.
    for op in ("cumsum", "searchsorted", "index_select", "convolution", "convolution_backward", "mse_loss_backward"):
        assert getattr(torch.ops.aten, op) in guard.seen, op


# -- checkpoints -------------------------------------------------------------------------------


def test_state_dict_round_trip_continues_identically(tmp_path):
    items = list(vector_stream(3, 100, seed=4))
    buffer = DeviceReplayBuffer(69, 3, frame_shape=(3,))
    for item in items[:60]:
        apply_to_device(buffer, item)
    path = tmp_path / "ring.pt"
    torch.save(buffer.state_dict(), path)
    restored = DeviceReplayBuffer(69, 3, frame_shape=(3,), staged=True)
    restored.load_state_dict(torch.load(path, weights_only=True))
    for item in items[60:]:
        apply_to_device(buffer, item)
        apply_to_device(restored, item)
    for name in ("frames", "actions", "rewards", "terminated", "valid"):
        assert torch.equal(getattr(buffer, name), getattr(restored, name)), name
    for name in ("pad", "cursor", "written", "transitions", "open"):
        np.testing.assert_array_equal(getattr(buffer, name), getattr(restored, name))
    assert len(buffer) == len(restored) and int(restored.fill()) > 0
    with pytest.raises(ValueError):
        DeviceReplayBuffer(72, 3, frame_shape=(3,)).load_state_dict(buffer.state_dict())


def test_bad_arguments():
    with pytest.raises(ValueError):
        DeviceReplayBuffer(11, 2)  # 5 slots per ring: fewer than a stack and a transition
    with pytest.raises(ValueError):
        DeviceReplayBuffer(20, 0)
    buffer = DeviceReplayBuffer(20, 2, frame_shape=(1,))
    with pytest.raises(ValueError):
        buffer.add_step(0, 1, 0.0, False, [1], False)  # no episode started

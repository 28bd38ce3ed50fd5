"""Stage 08's replay: stage 07's per-env rings, held as tensors on the training device.

K rings (one per env, capacity // K slots each), each following ``lib.buffer``'s ring rules
exactly (stated there once, and checked on both kinds of ring by one table of cases). The K
rings sit end to end in one flat tensor of ``K * (capacity // K)`` slots, so that a sampled
index names a ring and a slot at once.

Who knows what:
- The host keeps the bookkeeping (per ring: cursor, slots written, open episode, which slots
  are pad), the same integers ``ReplayBuffer`` keeps, so ``len()`` and every write position
  are known on the host without reading the device.
- The device holds the frames, actions, rewards, terminal flags, and a validity mask: 1
  where a slot starts a transition that may be sampled. The mask (its sum is the fill level)
  is device state, so a captured train step reads the current fill level, not the one it was
  captured with.

Writing (``add_vector_step``, once per vector step of stage 07's play process): the new frames
of the K envs, their actions, rewards and flags, and the slots whose validity changed are
packed into one host buffer (pinned on CUDA) and sent with one non-blocking host-to-device
copy, then scattered into the rings by index on the device. On CPU the rings are host memory
and every value is written in place, as ``ReplayBuffer`` does (``staged=True`` runs the packed
path on CPU too, for tests).

Sampling (``sample``): uniform over all valid transitions of all rings, drawn and gathered on
the device with fixed shapes and no host synchronisation, by inverting the cumulative count of
valid slots: ``c = cumsum(valid)``, ``u = floor(U[0,1) * c[-1])`` (an integer in
``[0, fill)``), ``index = searchsorted(c, u, right=True)``. The index is the first slot whose
count exceeds ``u``, so the count steps up there: the slot is valid. Each valid slot is the
answer for exactly one ``u``, so the draw is uniform, and a pad slot can never come out (the
tests check both by enumerating every ``u``). ``torch.multinomial`` over the mask would draw
the same law, but whether its input checks read the device differs by device, algorithm and
version; ``cumsum``, ``rand`` and ``searchsorted`` are plain kernels that a CUDA graph holds and
that a CPU test can check op by op, and "never a pad" becomes a property of the arithmetic.
The float64 draw keeps ``u`` uniform to within 2^-53 * fill. Stage 07 splits a batch across its
rings with a multinomial weighed by what each ring may give, then draws within each ring: the
same uniform law over all sampleable transitions, with the batch ordered by ring
(``tests/test_replay_device.py`` compares the two over 10^6 draws from a Pong-sized ring).

Memory: 100k slots of 84x84 uint8 = 706 MB of device memory, plus 29 bytes a slot of the rest
(action, reward, flag, validity, and the cumulative count a draw builds).
"""

from __future__ import annotations

import numpy as np
import torch

from lib.params import FRAME_SHAPE, STACK


def _align(n: int, to: int = 8) -> int:
    return -(-n // to) * to


class DeviceReplayBuffer:
    """K per-env replay rings on ``device``, with ``StreamReplayBuffer``'s semantics.

    ``streams`` K: envs played side by side; ``capacity``: slots in all (``capacity // K`` per
    ring, as stage 07). ``staged``: pack each write into one host buffer and copy it (default:
    on CUDA only). ``staging_slots``: host buffers used in turn, so that a copy still in flight
    is never overwritten. ``generator``: torch generator for sampling (default: torch's).
    ``host_gather``: gather the frames with numpy (default: on CPU; see ``gather``).
    """

    def __init__(
        self,
        capacity: int,
        streams: int,
        device="cpu",
        frame_shape=FRAME_SHAPE,
        stack: int = STACK,
        staged: bool | None = None,
        staging_slots: int = 4,
        generator: torch.Generator | None = None,
        host_gather: bool | None = None,
    ):
        if streams < 1:
            raise ValueError("a replay needs at least one stream")
        per_stream = capacity // streams
        if per_stream < stack + 2:
            raise ValueError(f"replay capacity per stream must be at least {stack + 2}")
        self.device = torch.device(device)
        self.streams = streams
        self.per_stream = per_stream
        self.capacity = per_stream * streams
        self.stack = stack
        self.frame_shape = tuple(frame_shape)
        self.generator = generator
        n, dev = self.capacity, self.device
        # Device state: what a train step reads. On CPU the frames are numpy's zeros, as in
        # ReplayBuffer: the kernel maps their pages on first write, where torch.zeros writes all
        # 0.7 GB at once, so a run's memory grows with what it stores.
        if dev.type == "cpu":
            self.frames = torch.from_numpy(np.zeros((n,) + self.frame_shape, dtype=np.uint8))
        else:
            self.frames = torch.zeros((n,) + self.frame_shape, dtype=torch.uint8, device=dev)
        self.actions = torch.zeros(n, dtype=torch.int64, device=dev)
        self.rewards = torch.zeros(n, dtype=torch.float32, device=dev)
        self.terminated = torch.zeros(n, dtype=torch.bool, device=dev)
        # 1 where a sampleable transition starts, else 0; int64, so that its cumulative sum
        # (each draw) converts nothing.
        self.valid = torch.zeros(n, dtype=torch.int64, device=dev)
        # Host bookkeeping, per ring: ReplayBuffer's fields.
        self.pad = np.ones((streams, per_stream), dtype=np.bool_)
        self.cursor = np.zeros(streams, dtype=np.int64)
        self.written = np.zeros(streams, dtype=np.int64)
        self.transitions = np.zeros(streams, dtype=np.int64)
        self.open = np.zeros(streams, dtype=np.bool_)
        self._offsets = torch.arange(-stack + 1, 2, device=dev)  # -3 .. +1: state and next state
        self._out: dict[int, tuple] = {}
        self._cumsum = torch.zeros(n, dtype=torch.int64, device=dev)
        self.staged = self.device.type != "cpu" if staged is None else staged
        self.host_gather = self.device.type == "cpu" if host_gather is None else host_gather
        if (not self.staged or self.host_gather) and self.device.type != "cpu":
            raise ValueError("only a replay in host memory can be written in place or gathered by numpy")
        self._pending_frames = 0
        self._pending_meta: list[tuple] = []
        self._touched: set[int] = set()
        if self.staged:
            self._setup_staging(staging_slots)
        else:
            self._views = tuple(t.numpy() for t in (self.frames, self.actions, self.rewards, self.terminated))
        self._frames_np = self.frames.numpy() if self.host_gather else None

    def __len__(self) -> int:
        """Transitions stored, as ``StreamReplayBuffer`` counts them."""
        return int(self.transitions.sum())

    # -- writing ------------------------------------------------------------------------------
    def add_vector_step(self, stepped, actions, rewards, terminated, dones, next_frames, starts=()) -> None:
        """One item of stage 07's play process, in the order stage 07's trainer applies it:
        first env i's step for every i with ``stepped[i]`` (action, reward, terminated, its new
        frame ``next_frames[i]``, ``dones[i]`` closing the episode), then every ``(i, stack)``
        of ``starts`` opens an episode of env i from that stacked observation. ``stepped`` None:
        no step (the first item). All of it reaches the device in one copy."""
        if stepped is not None:
            for i in np.flatnonzero(stepped):
                self._add_step(int(i), actions[i], rewards[i], terminated[i], next_frames[i], dones[i])
        for i, state in starts:
            self._start_episode(int(i), state)
        self._flush()

    def start_episode(self, stream: int, state) -> None:
        """Write the first observation of an episode of ring ``stream``: ``stack`` frames, oldest first."""
        self._start_episode(stream, state)
        self._flush()

    def add_step(self, stream: int, action: int, reward: float, terminated: bool, next_frame, done: bool) -> None:
        """``ReplayBuffer.add_step`` on ring ``stream``."""
        self._add_step(stream, action, reward, terminated, next_frame, done)
        self._flush()

    def _write(self, stream: int, frame) -> None:
        slot = int(self.cursor[stream])
        if not self.pad[stream, slot]:
            self.transitions[stream] -= 1
        self.pad[stream, slot] = True
        self.cursor[stream] = (slot + 1) % self.per_stream
        self.written[stream] += 1
        flat = stream * self.per_stream + slot
        self._touched.add(flat)
        if self.written[stream] > self.per_stream:
            # The slots from the cursor on hold transitions whose older frames are gone.
            base, cursor = stream * self.per_stream, int(self.cursor[stream])
            for k in range(self.stack - 1):
                self._touched.add(base + (cursor + k) % self.per_stream)
        if self.staged:
            if self._pending_frames >= self._max_frames:
                raise ValueError("more frames in one write than a vector step can bring")
            self._host["frames"][self._pending_frames] = frame
            self._host["frame_slots"][self._pending_frames] = flat
        else:
            self._views[0][flat] = frame
        self._pending_frames += 1

    def _start_episode(self, stream: int, state) -> None:
        for i in range(self.stack):
            self._write(stream, state[i])
        self.open[stream] = True

    def _add_step(self, stream: int, action, reward, terminated, next_frame, done) -> None:
        if not self.open[stream]:
            raise ValueError(f"stream {stream}: start_episode() first")
        slot = int(self.cursor[stream] - 1) % self.per_stream
        flat = stream * self.per_stream + slot
        self.pad[stream, slot] = False
        self.transitions[stream] += 1
        self._touched.add(flat)
        self._pending_meta.append((flat, action, reward, terminated))
        self._write(stream, next_frame)
        self.open[stream] = not done

    def _valid_host(self, flat: np.ndarray) -> np.ndarray:
        """ReplayBuffer.valid for flat slot numbers, from the host bookkeeping."""
        stream, slot = np.divmod(flat, self.per_stream)
        ok = ~self.pad[stream, slot]
        wrapped = self.written[stream] > self.per_stream
        behind = (slot - self.cursor[stream]) % self.per_stream < self.stack - 1
        return ok & ~(wrapped & behind)

    def _flush(self) -> None:
        touched = np.fromiter(self._touched, dtype=np.int64, count=len(self._touched))
        values = self._valid_host(touched)
        meta = self._pending_meta
        if self.staged:
            self._send(touched, values, meta)
        else:
            _, actions, rewards, terminated = self._views
            for flat, action, reward, term in meta:
                actions[flat], rewards[flat], terminated[flat] = action, reward, term
            self.valid.numpy()[touched] = values
        self._pending_frames = 0
        self._pending_meta = []
        self._touched = set()

    # -- the staged path: one host-to-device copy per write ------------------------------------
    def _setup_staging(self, slots: int) -> None:
        # At most, per ring and vector step: one step (a frame, a transition) and a new
        # episode (``stack`` frames); each write changes the validity of its slot and of the
        # ``stack - 1`` slots after the cursor.
        k = self.streams
        self._max_frames = k * (1 + self.stack)
        self._max_meta = k
        self._max_valid = k * (1 + (1 + self.stack) * self.stack)
        frame_bytes = int(np.prod(self.frame_shape))
        layout = [
            ("frame_slots", np.int64, (self._max_frames,)),
            ("meta_slots", np.int64, (self._max_meta,)),
            ("valid_slots", np.int64, (self._max_valid,)),
            ("actions", np.int64, (self._max_meta,)),
            ("rewards", np.float32, (self._max_meta,)),
            ("terminated", np.uint8, (self._max_meta,)),
            ("valid_values", np.int64, (self._max_valid,)),
            ("frames", np.uint8, (self._max_frames,) + self.frame_shape),
        ]
        self._layout, offset = {}, 0
        for name, dtype, shape in layout:
            offset = _align(offset)
            self._layout[name] = (offset, dtype, shape)
            offset += int(np.prod(shape)) * np.dtype(dtype).itemsize
        self._frames_offset = self._layout["frames"][0]
        self._frame_bytes = frame_bytes
        pin = self.device.type == "cuda"
        self._host_sets = [torch.zeros(offset, dtype=torch.uint8, pin_memory=pin) for _ in range(slots)]
        # On CUDA, one event per host buffer, made at the first write and recorded after each copy
        # that reads the buffer: the host waits on it before writing the buffer again.
        self._device_runs_behind = self.device.type == "cuda"
        self._events: list | None = None
        self._recorded = [False] * slots
        self._turn = 0
        self._device_stage = torch.zeros(offset, dtype=torch.uint8, device=self.device)
        self._select_host_set()

    def _select_host_set(self) -> None:
        slot = self._turn
        if self._recorded[slot]:
            self._events[slot].synchronize()  # the copy that last read this buffer has ended
            self._recorded[slot] = False
        raw = self._host_sets[slot].numpy()
        self._host = {
            name: raw[off : off + int(np.prod(shape)) * np.dtype(dtype).itemsize].view(dtype).reshape(shape)
            for name, (off, dtype, shape) in self._layout.items()
        }

    def _device_view(self, name: str, count: int, dtype: torch.dtype) -> torch.Tensor:
        offset = self._layout[name][0]
        size = torch.empty(0, dtype=dtype).element_size()
        return self._device_stage[offset : offset + count * size].view(dtype)

    def _send(self, touched: np.ndarray, values: np.ndarray, meta: list) -> None:
        n, m, v = self._pending_frames, len(meta), len(touched)
        if n == 0 and m == 0 and v == 0:
            return
        host = self._host
        if m:
            flats, actions, rewards, terms = zip(*meta)
            host["meta_slots"][:m] = flats
            host["actions"][:m] = actions
            host["rewards"][:m] = rewards
            host["terminated"][:m] = terms
        host["valid_slots"][:v] = touched
        host["valid_values"][:v] = values
        nbytes = self._frames_offset + n * self._frame_bytes
        self._device_stage[:nbytes].copy_(self._host_sets[self._turn][:nbytes], non_blocking=True)
        if n:
            frames = self._device_stage[self._frames_offset : nbytes].view((n,) + self.frame_shape)
            self.frames.index_copy_(0, self._device_view("frame_slots", n, torch.int64), frames)
        if m:
            slots = self._device_view("meta_slots", m, torch.int64)
            self.actions.index_copy_(0, slots, self._device_view("actions", m, torch.int64))
            self.rewards.index_copy_(0, slots, self._device_view("rewards", m, torch.float32))
            self.terminated.index_copy_(0, slots, self._device_view("terminated", m, torch.uint8).view(torch.bool))
        if v:
            valid = self._device_view("valid_values", v, torch.int64)
            self.valid.index_copy_(0, self._device_view("valid_slots", v, torch.int64), valid)
        if self._device_runs_behind:
            if self._events is None:
                self._events = [torch.cuda.Event() for _ in self._host_sets]
            self._events[self._turn].record()
            self._recorded[self._turn] = True
        self._turn = (self._turn + 1) % len(self._host_sets)
        self._select_host_set()

    # -- sampling -------------------------------------------------------------------------------
    def batch_layout(self, batch_size: int):
        """(shape, dtype) of each tensor that ``sample`` returns."""
        stacked = (batch_size, self.stack) + self.frame_shape
        return [
            (stacked, torch.uint8),
            ((batch_size,), torch.int64),
            ((batch_size,), torch.float32),
            ((batch_size,), torch.bool),
            (stacked, torch.uint8),
        ]

    def indices_for(self, u: torch.Tensor, counts: torch.Tensor | None = None) -> torch.Tensor:
        """Flat slot numbers for integer draws ``u`` in ``[0, fill)``: the ``u``-th valid slot
        (counting from 0, ring after ring). Fixed shapes, no host synchronisation."""
        counts = torch.cumsum(self.valid, 0, out=self._cumsum) if counts is None else counts
        return torch.searchsorted(counts, u, right=True).clamp_max_(self.capacity - 1)

    def fill(self) -> torch.Tensor:
        """The number of sampleable transitions, as a device tensor (0-d)."""
        return self.valid.sum()

    def sample_indices(self, batch_size: int) -> torch.Tensor:
        """``batch_size`` flat slot numbers, uniform over the valid transitions, drawn on the
        device. With none stored, the draw is meaningless: the caller checks ``len()`` first."""
        counts = torch.cumsum(self.valid, 0, out=self._cumsum)
        uniform = torch.rand(batch_size, dtype=torch.float64, device=self.device, generator=self.generator)
        u = (uniform * counts[-1]).floor_().long()  # counts[-1]: the fill level, read on the device
        return self.indices_for(u, counts)

    def gather(self, idx: torch.Tensor, out=None):
        """The transitions starting at flat slots ``idx``: (states, actions, rewards, dones,
        next_states), as ``ReplayBuffer.sample`` returns them. The stacks are views of one
        (B, stack + 1, ...) gather: state = frames 0..stack-1, next state = 1..stack.
        ``out``: the buffers ``_buffers(len(idx))`` to write into (reused by default).

        On CPU the frames are gathered by ``np.take`` (as ``ReplayBuffer`` does) rather than
        ``index_select``: torch splits a 4.5 MB gather across its threads, and on a CPU shared
        with the play process each such split can wait for a descheduled thread, while numpy
        copies on one. Same values; the indices are computed by the same tensor code."""
        batch_size = idx.shape[0]
        frames, actions, rewards, dones = out if out is not None else self._buffers(batch_size)
        per = self.per_stream
        base = torch.div(idx, per, rounding_mode="floor") * per  # the ring's first slot
        rows = base.unsqueeze(1) + (idx - base).unsqueeze(1).add(self._offsets).remainder_(per)
        if self.host_gather:
            np.take(self._frames_np, rows.numpy(), axis=0, out=frames.numpy(), mode="clip")
        else:
            torch.index_select(self.frames, 0, rows.view(-1), out=frames.view((-1,) + self.frame_shape))
        torch.index_select(self.actions, 0, idx, out=actions)
        torch.index_select(self.rewards, 0, idx, out=rewards)
        torch.index_select(self.terminated, 0, idx, out=dones)
        return frames[:, : self.stack], actions, rewards, dones, frames[:, 1:]

    def sample(self, batch_size: int):
        """A uniform batch, drawn and gathered on the device into reused tensors (the next
        call of the same size overwrites them): states, actions, rewards, dones, next_states."""
        return self.gather(self.sample_indices(batch_size))

    def _buffers(self, batch_size: int):
        out = self._out.get(batch_size)
        if out is None:
            out = self._out[batch_size] = self.gather_buffers(batch_size)
        return out

    def static_tensors(self, batch_size: int) -> list[torch.Tensor]:
        """Every tensor a draw of ``batch_size`` reads or writes besides its own temporaries,
        the buffers ``sample`` writes made now if not yet: what a compiled step must hold as
        static (addresses that never change), made before it is compiled."""
        return [
            self.frames,
            self.actions,
            self.rewards,
            self.terminated,
            self.valid,
            self._cumsum,
            self._offsets,
            *self._buffers(batch_size),
        ]

    def gather_buffers(self, batch_size: int):
        """New buffers for ``gather``'s ``out`` (its default ones are reused, a captured step's among them)."""
        dev = self.device
        return (
            torch.empty((batch_size, self.stack + 1) + self.frame_shape, dtype=torch.uint8, device=dev),
            torch.empty(batch_size, dtype=torch.int64, device=dev),
            torch.empty(batch_size, dtype=torch.float32, device=dev),
            torch.empty(batch_size, dtype=torch.bool, device=dev),
        )

    # -- checkpoints ----------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Everything needed to continue: the device tensors (copied to the host) and the
        host bookkeeping. The validity mask is rebuilt from the bookkeeping on load."""
        return {
            "capacity": self.capacity,
            "streams": self.streams,
            "stack": self.stack,
            "frame_shape": list(self.frame_shape),
            "frames": self.frames.cpu(),
            "actions": self.actions.cpu(),
            "rewards": self.rewards.cpu(),
            "terminated": self.terminated.cpu(),
            "pad": torch.from_numpy(self.pad.copy()),
            "cursor": torch.from_numpy(self.cursor.copy()),
            "written": torch.from_numpy(self.written.copy()),
            "transitions": torch.from_numpy(self.transitions.copy()),
            "open": torch.from_numpy(self.open.copy()),
        }

    def load_state_dict(self, state: dict) -> None:
        mine = (self.capacity, self.streams, self.stack, list(self.frame_shape))
        theirs = (state["capacity"], state["streams"], state["stack"], list(state["frame_shape"]))
        if mine != theirs:
            raise ValueError(f"replay state of (capacity, streams, stack, frame) {theirs}, this one is {mine}")
        for name in ("frames", "actions", "rewards", "terminated"):
            getattr(self, name).copy_(state[name])
        for name in ("pad", "cursor", "written", "transitions", "open"):
            getattr(self, name)[...] = np.asarray(state[name])
        every = np.arange(self.capacity, dtype=np.int64)
        self.valid.copy_(torch.from_numpy(self._valid_host(every).astype(np.int64)))

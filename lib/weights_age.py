"""The age of the weights the play process of stages 03-08 acts with: ``WeightsAge``."""

from __future__ import annotations

import collections
import os
import time

import numpy as np
import torch

# Test-only: "1" holds the play process to zero lag (``WeightsAge``), so that 03-06 act with the
# weights 02 would act with. Read by the trainer when it builds its WeightsAge; not a command-line knob.
ZERO_LAG = "DQN_SPEEDUP_ZERO_LAG"


class WeightsAge:
    """How many train steps old the weights are that the play process acts with (stages 03-08).

    Stage 02 acts at frame ``f`` with the weights of every train step of the loop iterations
    before ``f``'s; from 03 on the play process acts with the trainer's live weights while it
    runs ahead by up to the Queue's depth. An action's *age* is (the train steps 02 would have
    completed before acting at its frame) minus (the train steps the trainer had completed when
    the action was picked). Every action from 02's first train step on counts (before it every
    age is 0, and counting the replay's fill would dilute the mean), greedy or random: the age is
    that of the weights it was, or would have been, picked with; the actions of one vector step
    (07-08) share one read and each has its own frame.

    One small shared int64 tensor on the CPU (no device sync, on CUDA too), written by both sides:
    - the trainer's train-step counter, a seqlock: odd while ``optimizer.step`` writes the
      weights in place (optimizer hooks), even after; train steps = counter // 2. (Stage 08's
      captured or compiled step bumps it around the whole call, ``lib.graph_step.Captured.weights_age``.)
    - at the top of each loop iteration (``Run.frames`` calls ``due``), the train steps completed
      so far, in a ring indexed by the iteration: what 02 has completed before acting at that
      iteration's frames;
    - the play process's stats: actions, their summed and largest age, greedy forwards and torn
      reads (a forward during which the counter was odd or changed: weights half written by
      Adam). The trainer reads them at log points and at the end (``stats``).
    An action's age is known once the trainer has reached its frame's iteration; the play
    process resolves it then (``acting``, before each action pick), keeping the few still ahead
    of the trainer; it counts its frames itself, from the run's first, as its items are sent
    (``acted``). ``PlayArgs.parts`` makes both calls around the play loop's act and send.
    A forward is counted by whoever runs it, between ``forward_starts`` and ``forward_ends``:
    the net's own hooks in 03-06 (``watch_forwards``), 07-08's ``Actor`` around each eager
    forward and each replay of its captured graph (a replay never calls the module).

    On CUDA the counter counts train steps the host has launched, which the device may not have
    run yet (the trainer runs ahead of it by up to one Queue item in 08, its ``Pacer``, and by
    what the launch queue holds in 03-07), and the seqlock brackets the launch of Adam's step, not
    its writes: the age counts steps launched, and a torn read cannot be seen, so ``stats``
    reports ``torn_reads`` as None (summary.json's null) there.

    With ``DQN_SPEEDUP_ZERO_LAG=1`` (tests only) the play process waits, before acting at frame
    ``f``, until the trainer has completed the iterations before ``f``'s: it then acts with 02's
    weights, and no train step can run during its forward (the trainer waits for ``f``'s item).
    """

    SEQ, DUE, ACTIONS, AGE_SUM, AGE_MAX, FORWARDS, TORN = range(7)
    HEAD = 8  # counters before the ring
    RING = 4096  # loop iterations remembered: far more than the play process runs ahead
    ZERO_LAG_SECONDS = 120.0  # the longest the play process waits for the trainer at zero lag

    def __init__(self, run, optimizer, train_step=None):
        self.start_frame, self.steps = run.frame_idx, run.args.steps
        self.cuda = torch.device(run.device).type == "cuda"  # torn reads are not measurable there
        self.zero_lag = os.environ.get(ZERO_LAG) == "1"
        self.shared = torch.zeros(self.HEAD + self.RING, dtype=torch.int64).share_memory_()
        self.shared[self.DUE] = -1
        self._setup()
        if train_step is not None and train_step.capture != "none":
            train_step.weights_age = self  # a captured step runs without calling the optimizer's hooks
        else:
            optimizer.register_step_pre_hook(lambda *_: self.writing())
            optimizer.register_step_post_hook(lambda *_: self.written())
        run.weights_age = self

    def _setup(self) -> None:
        self.v = self.shared.numpy()
        self._pending = collections.deque()  # (first frame, count, train steps read), play side
        self._seq = 0
        self._frame = self.start_frame  # play side: the frames acted for so far
        self._read = 0  # play side: the train steps completed when the last pick began

    def __getstate__(self):
        return {k: self.__dict__[k] for k in ("start_frame", "steps", "cuda", "zero_lag", "shared")}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._setup()

    # -- the trainer -------------------------------------------------------------------------
    def writing(self) -> None:
        self.v[self.SEQ] += 1  # odd: the weights are being written

    def written(self) -> None:
        self.v[self.SEQ] += 1

    def due(self, frame_idx: int) -> None:
        """The top of the loop iteration ending at ``frame_idx``: the ones before it are done."""
        j = (frame_idx - self.start_frame) // self.steps
        self.v[self.HEAD + j % self.RING] = self.v[self.SEQ] // 2
        self.v[self.DUE] = j

    def totals(self) -> tuple[int, int, int]:
        """(actions counted whose age is known, their summed age, the largest)."""
        return int(self.v[self.ACTIONS]), int(self.v[self.AGE_SUM]), int(self.v[self.AGE_MAX])

    def stats(self) -> dict:
        """What summary.json reports: the mean and largest age, the greedy forwards, and the torn
        reads (None on CUDA: not measurable there)."""
        actions, total, largest = self.totals()
        return {
            "mean": round(total / actions, 3) if actions else 0.0,
            "max": largest,
            "actions": actions,
            "forwards": int(self.v[self.FORWARDS]),
            "torn_reads": None if self.cuda else int(self.v[self.TORN]),
        }

    # -- the play process --------------------------------------------------------------------
    def forward_starts(self) -> None:
        """Before a greedy forward (a call of the net, or a replay of a graph that holds it)."""
        self._seq = int(self.v[self.SEQ])

    def forward_ends(self) -> None:
        """After it, its actions read: one forward more, and a torn read if a train step wrote
        the weights meanwhile (the counter odd before it, or moved)."""
        self.v[self.FORWARDS] += 1
        if self._seq % 2 or self.v[self.SEQ] != self._seq:
            self.v[self.TORN] += 1

    def watch_forwards(self, net) -> None:
        """03-06: count the play process's forwards by the net's hooks (each is one call of it)."""
        net.register_forward_pre_hook(lambda module, args: self.forward_starts())
        net.register_forward_hook(lambda module, args, output: self.forward_ends())

    def _iteration(self, frames):
        return (frames - self.start_frame + self.steps - 1) // self.steps

    def acting(self) -> None:
        """Before picking the next actions: resolve the ages the trainer's progress makes known,
        wait at zero lag, and note the train steps completed now."""
        v = self.v
        due = int(v[self.DUE])
        while self._pending and self._iteration(self._pending[0][0] + self._pending[0][1] - 1) <= due:
            first, n, read = self._pending.popleft()
            due_steps = v[self.HEAD + self._iteration(np.arange(first, first + n)) % self.RING]
            ages = (due_steps - read)[due_steps > 0]  # before 02's first train step every age is 0
            if ages.size:
                v[self.AGE_SUM] += int(ages.sum())
                v[self.AGE_MAX] = max(int(v[self.AGE_MAX]), int(ages.max()))
                v[self.ACTIONS] += ages.size
        if self.zero_lag:
            frame = self._frame + 1
            deadline = time.monotonic() + self.ZERO_LAG_SECONDS
            while v[self.DUE] < self._iteration(frame):
                if time.monotonic() > deadline:  # a lost item: fail the run rather than wait forever
                    raise RuntimeError(f"zero lag: the trainer did not reach frame {frame}'s iteration")
                time.sleep(0.0002)
        self._read = int(v[self.SEQ]) // 2

    def acted(self, count: int = 1) -> None:
        """The actions picked since ``acting`` were for the next ``count`` frames (0: none of
        them was, every game of a vector step autoresetting, or the item only starts games)."""
        if count:
            self._pending.append((self._frame + 1, count, self._read))
            self._frame += count


ONE_PROCESS_AGE = {"mean": 0.0, "max": 0, "actions": None, "forwards": None, "torn_reads": 0}  # 01-02: one process

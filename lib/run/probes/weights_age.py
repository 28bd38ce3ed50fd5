"""The age of the weights the play process of stages 03-08 acts with: ``WeightsAge``, and
``AgeProbe``, the run's probe that ticks it, counts the train steps, and reports it (TensorBoard
``weights_age/mean`` and ``/max`` every ``schedules.TIME_FRAMES`` agent steps and at the end;
summary.json's ``weights_age``)."""

from __future__ import annotations

import collections
import time

import numpy as np
import torch

from lib import schedules
from lib.run.probes import Probe, around


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
      captured or compiled step bumps it around the whole call: ``count_steps``.)
    - at the top of each loop iteration (``Run.frames`` calls ``due``), the train steps completed
      so far, in a ring indexed by the iteration: what 02 has completed before acting at that
      iteration's frames;
    - the play process's stats: actions, their summed and largest age, greedy forwards and torn
      reads (a forward during which the counter was odd or changed: weights half written by
      Adam). The trainer reads them at log points and at the end (``stats``).
    An action's age is known once the trainer has reached its frame's iteration; the play
    process resolves it then (``acting``, before each action pick), keeping the few still ahead
    of the trainer; it counts its frames itself, from the run's first, as its items are sent
    (``acted``). ``wrap`` makes both calls around the play loop's act and send.
    A forward is counted between ``forward_starts`` and ``forward_ends`` (``watch``): by the net's
    own hooks in 03-06, around 07-08's ``Actor.greedy_actions``, each eager forward and each
    replay of its captured graph (a replay never calls the module).

    On CUDA the counter counts train steps the host has launched, which the device may not have
    run yet (the trainer runs ahead of it by up to one Queue item in 08, its ``Pacer``, and by
    what the launch queue holds in 03-07), and the seqlock brackets the launch of Adam's step, not
    its writes: the age counts steps launched, and a torn read cannot be seen, so ``stats``
    reports ``torn_reads`` as None (summary.json's null) there.

    With ``--lag zero`` (``lib.run.knobs``) the play process waits, before acting at frame ``f``,
    until the trainer has completed the iterations before ``f``'s: it then acts with 02's
    weights, and no train step can run during its forward (the trainer waits for ``f``'s item).
    The one place a probe changes the run: the wait needs the counters this class keeps. It is
    the weights'-age arm of an ablation (what acting with weights 2-3 train steps old costs in
    frames), and the tests' way to make 03-08 act as 02 does.
    """

    SEQ, DUE, ACTIONS, AGE_SUM, AGE_MAX, FORWARDS, TORN = range(7)
    HEAD = 8  # counters before the ring
    RING = 4096  # loop iterations remembered: far more than the play process runs ahead
    # The longest the play process waits for the trainer at zero lag: far more than a checkpoint
    # with its replay ring takes to write (the trainer saves it between two items).
    ZERO_LAG_SECONDS = 600.0

    def __init__(self, run):
        self.start_frame, self.steps = run.frame_idx, run.args.steps
        self.cuda = torch.device(run.device).type == "cuda"  # torn reads are not measurable there
        self.zero_lag = run.args.lag == "zero"
        self.shared = torch.zeros(self.HEAD + self.RING, dtype=torch.int64).share_memory_()
        self.shared[self.DUE] = -1
        self._setup()

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
    def count_steps(self, learn, optimizer):
        """Count the train steps of ``learn`` (the trainer's train step): by ``optimizer``'s hooks
        around its step, or, for a captured or compiled step (``lib.graph_step.Captured``, whose
        replays call no hook), around each whole call. Returns ``learn`` or its stand-in."""
        if getattr(learn, "capture", "none") != "none":
            return around(learn, self.writing, self.written)
        optimizer.register_step_pre_hook(lambda *_: self.writing())
        optimizer.register_step_post_hook(lambda *_: self.written())
        return learn

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

    def watch(self, act, net) -> None:
        """Count the play loop's greedy forwards: around ``act.greedy_actions`` where it has one
        (07-08's ``Actor``: a replay of its graph calls no module, so the net's hooks cannot see
        it; from before the forward to its actions on the host, none when every game explores),
        else by the net's hooks (03-06). Not around the whole ``act``: that would count a call in
        which every game explores as a forward, and a train step during its random draws as a
        torn read (``test_the_actor_counts_its_forwards_eager_and_replayed`` pins the count)."""
        if hasattr(act, "greedy_actions"):
            act.greedy_actions = around(act.greedy_actions, self.forward_starts, self.forward_ends)
        else:
            self.watch_forwards(net)

    def wrap(self, act, send):
        """The play loop's ``act`` and ``send(item)``: the train steps an action is picked with are
        read before ``act`` (where the zero-lag wait is too), the frames they cover once its item
        is sent (``item.frames``)."""

        def acting(*args):
            self.acting()
            return act(*args)

        def sending(item) -> None:
            send(item)
            self.acted(item.frames)

        return acting, sending

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
            self.lag_wait(self._frame + 1)
        self._read = int(v[self.SEQ]) // 2

    def lag_wait(self, frame: int) -> None:
        """At zero lag: wait until the trainer has completed the iterations before ``frame``'s
        (the play process's time clock books it as ``lag_wait``: ``PlaySide.parts``)."""
        v = self.v
        deadline = time.monotonic() + self.ZERO_LAG_SECONDS
        while v[self.DUE] < self._iteration(frame):
            if time.monotonic() > deadline:  # a lost item: fail the run rather than wait forever
                raise RuntimeError(f"zero lag: the trainer did not reach frame {frame}'s iteration")
            time.sleep(0.0002)

    def acted(self, count: int = 1) -> None:
        """The actions picked since ``acting`` were for the next ``count`` frames (0: none of
        them was, every game of a vector step autoresetting, or the item only starts games)."""
        if count:
            self._pending.append((self._frame + 1, count, self._read))
            self._frame += count


ONE_PROCESS_AGE = {"mean": 0.0, "max": 0, "actions": None, "forwards": None, "torn_reads": 0}  # 01-02: one process


class AgeProbe(Probe):
    """A run's weights' age (stages 03-08): its ``WeightsAge``, ticked at the top of each loop
    iteration, its train steps counted around the ``learn`` part, its play side the same object."""

    def __init__(self, run):
        self.run = run
        self.age: WeightsAge | None = None
        self._logged = (0, 0)  # actions and summed age at the last TensorBoard point

    def start(self) -> None:
        self.age = WeightsAge(self.run)  # its shared memory: made with the run, not while it is checked

    def wrap(self, role: str, part):
        return self.age.count_steps(part, self.run.saveables["optimizer"]) if role == "learn" else part

    def play_side(self):
        return self.age

    def tick(self, frame_idx: int) -> None:
        self.age.due(frame_idx)

    def after(self, frame_idx: int, step: int) -> bool:
        if schedules.crossed(frame_idx - step, frame_idx, schedules.TIME_FRAMES):
            self.log(frame_idx)
        return False

    def end(self, frame_idx: int) -> None:
        self.log(frame_idx)

    def log(self, frame_idx: int) -> None:
        """TensorBoard: the mean age of the actions since the last point, and the largest so far."""
        actions, total, largest = self.age.totals()
        if actions > self._logged[0]:
            mean = (total - self._logged[1]) / (actions - self._logged[0])
            self.run.writer.add_scalar("weights_age/mean", mean, frame_idx)
            self.run.writer.add_scalar("weights_age/max", largest, frame_idx)
            self._logged = (actions, total)

    def summary(self) -> dict:
        return self.age.stats()

"""The play process of stages 03+: start-up, a guarded Queue in both directions, shutdown, and
the age of the weights it acts with (``WeightsAge``).

The trainer never waits forever: ``receive`` polls the Queue and checks that the play process
is alive, and a play process that failed sends its error first, so the trainer can name the
cause. The play process never outlives the trainer: a thread of its own watches the trainer
through a pidfd and ends it when the trainer exits, the kernel sends it SIGTERM when its parent
(the trainer's fork server) dies (PR_SET_PDEATHSIG), and ``send`` also checks the trainer's pid.
"""

from __future__ import annotations

import collections
import ctypes
import dataclasses
import multiprocessing
import os
import queue as queue_mod
import select
import signal
import sys
import threading
import time
import traceback
from typing import NamedTuple

import numpy as np
import torch
import torch.multiprocessing as mp

from lib import procs
from lib.cli import RunError
from lib.cores import cpu_budget, split_threads  # noqa: F401  (the stages call them from here)
from lib.params import Hyperparams
from lib.runtime import process_settings, set_seed
from lib.timing import PartClock

ERROR = "__play_error__"
POLL_SECONDS = 0.5
# Test-only: "1" holds the play process to zero lag (``WeightsAge``), so that 03-06 act with the
# weights 02 would act with. Read by the trainer when it builds its WeightsAge; not a command-line knob.
ZERO_LAG = "DQN_SPEEDUP_ZERO_LAG"


class Transition(NamedTuple):
    """One env step of the play process of stages 03-06, as it crosses the Queue."""

    first_state: np.ndarray | None  # the (4, 84, 84) stack that starts an episode, else None
    action: int
    reward: float  # clipped, as the learner sees it
    terminated: bool  # the episode ended in a terminal state (no bootstrap)
    next_frame: np.ndarray  # the newest (84, 84) frame of the next state
    done: bool  # terminated or truncated: the learner's episode ends here
    game_return: float | None  # the real game's score when the game ended at this step

    @property
    def frames(self) -> int:
        """Agent steps this item carries (the weights' age counts one action for each)."""
        return 1


class VectorStep(NamedTuple):
    """One step of stage 07's K games, as it crosses the Queue. Arrays have one row per game;
    only the rows where ``stepped`` is True are transitions (the others were autoresets)."""

    starts: list  # [(game, (4, 84, 84) stack)]: episodes that begin after this step
    stepped: np.ndarray | None  # bool (K,); None for the first message, which only starts episodes
    actions: np.ndarray | None
    rewards: np.ndarray | None  # clipped
    terminated: np.ndarray | None
    dones: np.ndarray | None
    next_frames: np.ndarray | None  # (K, 84, 84): each game's newest frame
    finished: list  # real scores of the games that ended at this step

    @property
    def frames(self) -> int:
        """Agent steps this item carries: its transitions (the autoresets are none)."""
        return 0 if self.stepped is None else int(self.stepped.sum())


# What every play process imports, loaded once by the fork server. None of them touches CUDA on
# import, so the server and the processes it forks start with no CUDA state.
PRELOAD = ["torch", "numpy", "cv2", "gymnasium", "ale_py", "lib.parallel", "lib.wrappers", "lib.agent", "lib.model"]


def context():
    """forkserver: a play process is forked from a server process that imported torch and the
    emulator once, so it starts in a fraction of a second where a fresh interpreter (spawn)
    imports torch for seconds. Like spawn, and unlike a fork of the trainer, it inherits none
    of the trainer's threads or CUDA state. The server is the trainer's child and exits after
    the trainer and every process it forked."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    short_socket_dir()
    start_resource_tracker()
    return ctx


def start_resource_tracker() -> None:
    """Start multiprocessing's resource tracker (the process that unlinks the Queue's semaphores
    should the trainer die) deaf to SIGHUP, as it already is to SIGINT and SIGTERM. A closed
    terminal hangs up the whole process group: a tracker killed by it was relaunched by the
    trainer's next unregister, which knew none of the names and printed a traceback for each.
    SIGHUP is blocked while the tracker starts: the tracker keeps the mask (it unblocks only
    SIGINT and SIGTERM), and one that reaches the trainer meanwhile is acted on afterwards.
    Once started, the tracker is this process's for good; it exits once every process of the
    run has closed its pipe."""
    from multiprocessing import resource_tracker

    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP})
    try:
        resource_tracker.ensure_running()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


SOCKET_PATH_MAX = 107  # bytes of an AF_UNIX socket's path (sun_path, less its closing NUL)
SHORT_TEMP_DIRS = ("/tmp", "/dev/shm", "/var/tmp")


def short_socket_dir() -> None:
    """Where TMPDIR is too long for the fork server's socket (``<TMPDIR>/pymp-XXXXXXXX/listener-
    XXXXXXXX``, an AF_UNIX path), multiprocessing's temporary folder goes in the first writable
    short folder of SHORT_TEMP_DIRS instead (made once per process, removed at its exit); the
    run's other temporary files stay in TMPDIR."""
    import multiprocessing.util as mp_util
    import tempfile

    if len(os.fsencode(tempfile.gettempdir())) + len("/pymp-XXXXXXXX/listener-XXXXXXXX") <= SOCKET_PATH_MAX:
        return
    short = next((d for d in SHORT_TEMP_DIRS if os.path.isdir(d) and os.access(d, os.W_OK | os.X_OK)), None)
    if short is None:
        return
    saved, tempfile.tempdir = tempfile.tempdir, short
    try:
        mp_util.get_temp_dir()  # made here unless made before (multiprocessing keeps the first)
    finally:
        tempfile.tempdir = saved


@dataclasses.dataclass(frozen=True)
class PlayArgs:
    """What a stage's play process starts with: ``play(p)``, ``p`` a PlayArgs (``of`` fills it
    from the run)."""

    params: Hyperparams  # the game's
    net: torch.nn.Module  # the trainer's, its weights in shared memory (CUDA IPC on a GPU)
    queue: object  # the bounded Queue to the trainer
    device: torch.device
    seed: int  # the run's --seed
    start_frame: int  # the agent step the run starts or goes on from
    clock: PartClock  # the play process's time by part, in memory the trainer reads
    weights_age: WeightsAge
    parent_pid: int  # the trainer's: a play process never outlives it
    threads: int = 1  # 07-08: the vector env's threads
    envs: int = 1  # 07-08: games played side by side (--envs)
    capture: str = "none"  # 08: the trainer's train-step capture ("none" holds the play side too)

    def parts(self, act):
        """The play loop's ``act`` (a stand-in for ``act``) and ``send(item)``, timed by part on
        ``clock`` ("act", "put") and counting the weights' age: the train steps an action is
        picked with are read before ``act`` (where the zero-lag wait is too), the frames they
        cover when its item is sent (``item.frames``). Its forwards are counted by ``act`` where
        it has a ``weights_age`` to count with (07-08's ``Actor``: its graph's replays call no
        module), else by the net's hooks (03-06)."""
        age = self.weights_age
        if hasattr(act, "weights_age"):
            act.weights_age = age
        else:
            age.watch_forwards(self.net)
        timed_act, put = self.clock.timed(act, "act"), self.clock.timed(send, "put")

        def acting(*args):
            age.acting()
            return timed_act(*args)

        def sending(item) -> None:
            put(self.queue, item, self.parent_pid)
            age.acted(item.frames)

        return acting, sending

    @classmethod
    def of(cls, run, net, queue, weights_age, **more) -> PlayArgs:
        """The play process's arguments for ``run``: the run's own, and what the stage made."""
        args = (run.params, net, queue, run.device, run.args.seed, run.frame_idx, run.clocks.play, weights_age)
        return cls(*args, os.getpid(), envs=run.args.envs, **more)


def start_player(run, target, args: PlayArgs, name: str = "play"):
    """Start ``target(args)`` in a play process that the run ends on exit."""
    proc = context().Process(target=target, args=(args,), name=name, daemon=True)
    proc.start()
    run.children.append(proc)
    return proc


def child_setup(seed: int, threads: int = 1) -> None:
    """First call of a play process: die with the trainer, leave Ctrl-C to the trainer."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass
    if os.getppid() == 1:  # the parent died before prctl took effect
        sys.exit(0)
    die_with(multiprocessing.parent_process().pid)
    process_settings()
    torch.set_num_threads(threads)
    set_seed(seed)


def die_with(pid: int) -> None:
    """SIGTERM this process as soon as process ``pid`` exits, even while it waits unreaped: its
    pidfd turns readable then. (The fork server, a play process's parent, outlives the trainer
    for as long as a process it forked is alive, so PR_SET_PDEATHSIG alone does not end it.)"""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        os._exit(0)
    except (AttributeError, OSError):  # no pidfd here: PR_SET_PDEATHSIG and send's check remain
        return

    def watch():
        select.select([fd], [], [])
        # Readable means exited; where a sandbox's pidfd says so early, the process table decides.
        while not procs.exited(pid):
            time.sleep(POLL_SECONDS)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="watch-trainer", daemon=True).start()


def send(queue, item, parent_pid: int) -> None:
    """Put ``item``; exit quietly if the trainer (``parent_pid``) is gone."""
    while True:
        try:
            queue.put(item, timeout=POLL_SECONDS)
            return
        except queue_mod.Full:
            if not procs.alive(parent_pid):
                os._exit(0)


def report_error(queue) -> None:
    """Called from a play process's ``except``: hand the trainer the cause, then exit 1."""
    text = traceback.format_exc().strip().splitlines()[-1]
    try:
        queue.put((ERROR, text), timeout=2.0)
        # put() hands the item to a feeder thread; flush it into the pipe before exiting.
        queue.close()
        queue.join_thread()
    except Exception:
        pass
    traceback.print_exc()
    sys.stderr.flush()
    os._exit(1)


def receive(queue, proc):
    """Get the next item; raise RunError if the play process failed or died."""
    while True:
        try:
            item = queue.get(timeout=POLL_SECONDS)
        except queue_mod.Empty:
            if not proc.is_alive():
                code = proc.exitcode
                how = f"killed by signal {signal.Signals(-code).name}" if code and code < 0 else f"exit code {code}"
                raise RunError(f"the play process died ({how})")
            continue
        if isinstance(item, tuple) and len(item) == 2 and item[0] == ERROR:
            raise RunError(f"the play process failed: {item[1]}")
        return item


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
      captured or compiled step bumps it around the whole call, ``TrainStep.weights_age``.)
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


def _send_items(queue, item, count):
    for _ in range(count):
        queue.put(item)
    queue.put(None)


def measure_transfer(count: int = 3000) -> dict:
    """What one transition costs through the stage-03 Queue: pickled bytes, and microseconds
    per item at full throughput (a play-process sender, this process receiving), for the one-frame
    item the stages send and for the four-frame stack they avoid sending."""
    from multiprocessing.reduction import ForkingPickler

    frame = np.random.default_rng(0).integers(0, 256, (84, 84), dtype=np.uint8)
    items = {
        "one frame": Transition(None, 3, 1.0, False, frame, False, None),
        "four frames": Transition(None, 3, 1.0, False, np.stack([frame] * 4), False, None),
    }
    out = {}
    ctx = context()
    for name, item in items.items():
        queue = ctx.Queue(maxsize=8)
        proc = ctx.Process(target=_send_items, args=(queue, item, count), daemon=True)
        proc.start()
        queue.get()  # the sender is up
        t0 = time.perf_counter()
        received = 1
        while queue.get() is not None:
            received += 1
        elapsed = time.perf_counter() - t0
        proc.join()
        out[name] = {
            "bytes": len(ForkingPickler.dumps(item)),
            "us_per_item": elapsed / (received - 1) * 1e6,
        }
    return out


if __name__ == "__main__":
    for name, cost in measure_transfer().items():
        print(f"{name}: {cost['bytes']} bytes pickled, {cost['us_per_item']:.1f} us per transition through the Queue")

"""The play process of stages 03+: start-up, a guarded Queue in both directions, shutdown (what
it measures is the run's, ``lib.run.probes``).

The trainer never waits forever: ``receive`` polls the Queue and checks that the play process
is alive, and a play process that failed sends its error first, so the trainer can name the
cause. A play process that is alive but sends nothing (stopped by SIGSTOP, hung, starved of
CPU) for SILENT_SECONDS of the trainer's waiting (STARTUP_SECONDS before its first item, while
it makes its games) ends the run as a dead one does, in one line that names it and the time.
A silence of STALL_SECONDS or more after its first item, given up on or not, is booked as the play
process's ``stalled`` (``lib.run.timing``), from the start of the trainer's wait to the play
process's next lap: never as the part (env, act, put) that was open when it began. The play process never outlives the trainer: a thread of its own watches the trainer
through a pidfd and ends it when the trainer exits, the kernel sends it SIGTERM when its parent
(the trainer's fork server) dies (PR_SET_PDEATHSIG), and ``send`` also checks the trainer's pid.
"""

from __future__ import annotations

import ctypes
import dataclasses
import multiprocessing
import os
import queue as queue_mod
import signal
import sys
import time
import traceback
from typing import NamedTuple

import numpy as np
import torch

from lib.params import Hyperparams
from lib.run import procs, signals
from lib.run.children import context, die_with  # process hygiene: the run wing's
from lib.run.cli import RunError
from lib.run.cores import cpu_budget, split_threads  # noqa: F401  (the stages call them from here)
from lib.run.probes import PlaySide
from lib.run.runtime import process_settings, set_seed

ERROR = "__play_error__"
POLL_SECONDS = 0.5
SILENT_SECONDS = 120.0  # the trainer's waiting, with nothing sent, after which a play process is given up
STARTUP_SECONDS = 600.0  # the same before its first item (07 with --envs 512 makes its games for minutes)
STALL_SECONDS = 5.0  # the trainer's waiting, with nothing sent, from which the play process's time is ``stalled``


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
        """Agent steps this item carries: one action."""
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
    probes: PlaySide  # what the play process measures with (``Run.play_side``), in memory the trainer reads
    parent_pid: int  # the trainer's: a play process never outlives it
    threads: int = 1  # 07-08: the vector env's threads
    envs: int = 1  # 07-08: games played side by side (--envs)
    capture: str = "none"  # 08: the trainer's train-step capture ("none" holds the play side too)

    @property
    def acting(self) -> str:
        """The Actor's form: eager where the train step is (07, and 08 with --capture none), else
        ``auto``, the faster of eager and a CUDA graph (08's trick reaching the play side)."""
        return "none" if self.capture == "none" else "auto"

    def parts(self, act):
        """The play loop's ``act`` and ``send(item)`` (the Queue put), as the run measures them."""

        def put(item) -> None:
            send(self.queue, item, self.parent_pid)

        return self.probes.parts(act, put, self.net)

    @classmethod
    def of(cls, run, net, queue, **more) -> PlayArgs:
        """The play process's arguments for ``run``: the run's own, and what the stage made."""
        args = (run.params, net, queue, run.device, run.args.seed, run.frame_idx, run.play_side())
        return cls(*args, os.getpid(), envs=run.args.envs, **more)


def start_player(run, target, args: PlayArgs, name: str = "play"):
    """Start ``target(args)`` in a play process that the run ends on exit."""
    proc = context().Process(target=target, args=(args,), name=name, daemon=True)
    proc.start()
    proc.probes = args.probes  # ``receive`` books a silence as the play process's ``stalled``
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
    """Get the next item; raise RunError if the play process failed, died, or sent nothing for
    SILENT_SECONDS of waiting (STARTUP_SECONDS before its first). A poll counts at most twice its
    timeout, so a trainer stopped with it (Ctrl-Z of the whole job) does not give it up. Past
    STALL_SECONDS of silence after its first item, the play process's time is ``stalled``."""
    sent = getattr(proc, "sent", False)
    silent, limit, stalled = 0.0, SILENT_SECONDS if sent else STARTUP_SECONDS, not sent
    while True:
        t0 = time.monotonic()
        try:
            item = queue.get(timeout=POLL_SECONDS)
        except queue_mod.Empty:
            signals.check()
            if not proc.is_alive():
                code = proc.exitcode
                how = f"killed by signal {signal.Signals(-code).name}" if code and code < 0 else f"exit code {code}"
                raise RunError(f"the play process died ({how})")
            silent += min(time.monotonic() - t0, 2 * POLL_SECONDS)
            if not stalled and silent >= min(STALL_SECONDS, limit):
                stalled = True
                _stalled(proc, silent)
            if silent >= limit:
                _give_up(proc, silent)
            continue
        proc.sent = True
        if isinstance(item, tuple) and len(item) == 2 and item[0] == ERROR:
            raise RunError(f"the play process failed: {item[1]}")
        return item


def _stalled(proc, silent: float) -> None:
    """A play process alive but silent for ``silent`` seconds: its time from then is ``stalled``."""
    probes = getattr(proc, "probes", None)
    if probes is not None:
        probes.stalled(silent)


def _give_up(proc, silent: float) -> None:
    """A play process alive but silent for SILENT_SECONDS: the run ends (its time was ``stalled``)."""
    state = " (stopped)" if procs.state(proc.pid) in ("T", "t") else ""
    raise RunError(f"the play process {proc.pid}{state} has sent nothing for {silent:.0f} s")

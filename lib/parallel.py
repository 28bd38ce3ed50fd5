"""The play process of stages 03+: start-up, a guarded Queue in both directions, shutdown.

The trainer never waits forever: ``receive`` polls the Queue and checks that the play process
is alive, and a play process that failed sends its error first, so the trainer can name the
cause. The play process never outlives the trainer: a thread of its own watches the trainer
through a pidfd and ends it when the trainer exits, the kernel sends it SIGTERM when its parent
(the trainer's fork server) dies (PR_SET_PDEATHSIG), and ``send`` also checks the trainer's pid.
"""

from __future__ import annotations

import ctypes
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
from lib.runtime import process_settings, set_seed

ERROR = "__play_error__"
POLL_SECONDS = 0.5


class Transition(NamedTuple):
    """One env step of the play process of stages 03-06, as it crosses the Queue."""

    first_state: np.ndarray | None  # the (4, 84, 84) stack that starts an episode, else None
    action: int
    reward: float  # clipped, as the learner sees it
    terminated: bool  # the episode ended in a terminal state (no bootstrap)
    next_frame: np.ndarray  # the newest (84, 84) frame of the next state
    done: bool  # terminated or truncated: the learner's episode ends here
    game_return: float | None  # the real game's score when the game ended at this step


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
    return ctx


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


def start_player(run, target, args: tuple, name: str = "play"):
    """Start ``target(*args)`` in a play process that the run ends on exit."""
    proc = context().Process(target=target, args=args, name=name, daemon=True)
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

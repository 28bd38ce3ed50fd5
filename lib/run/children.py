"""Process hygiene for a run's child processes: the fork server that starts them, multiprocessing's
resource tracker, the socket path's length, and a child that never outlives the trainer (pidfd).
"""

from __future__ import annotations

import os
import select
import signal
import threading
import time

import torch.multiprocessing as mp

from lib.run import procs

POLL_SECONDS = 0.5  # a child's look at the process table once the trainer's pidfd turned readable

# What every play process imports, loaded once by the fork server. None of them touches CUDA on
# import, so the server and the processes it forks start with no CUDA state.
PRELOAD = [
    "torch",
    "numpy",
    "cv2",
    "gymnasium",
    "ale_py",
    "lib.parallel",
    "lib.wrappers",
    "lib.agent",
    "lib.actor",
    "lib.model",
    "lib.vector_env",
    "lib.vector_play",
]


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
    should the trainer die) deaf to SIGHUP, as it already is to SIGINT and SIGTERM: a closed
    terminal hangs up the whole process group, and a tracker relaunched after it by the trainer's
    next unregister would know none of the names and print a traceback for each.
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

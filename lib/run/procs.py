"""Stage scripts as child processes of a command (the bench, the sweep): each in its own process
group, ended with nothing of it left running; and a run's own play processes, ended with it."""

from __future__ import annotations

import os
import signal
import time


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists (an unreaped zombie counts; another user's process too)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def state(pid: int) -> str | None:
    """Process ``pid``'s state letter (R, S, T stopped, Z zombie, ...); "X" where it is gone,
    None where no /proc tells."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except FileNotFoundError:
        return "X"
    except OSError:
        return None
    return stat[stat.rfind(b")") + 2 :][:1].decode()  # the field after the command name, which may hold spaces


def exited(pid: int) -> bool:
    """Process ``pid`` has ended: it is gone, or a zombie waiting to be reaped (any parent)."""
    letter = state(pid)
    if letter is None:  # no /proc here: only "gone" can be told
        return not alive(pid)
    return letter in ("Z", "X")


def leader_exited(pid: int) -> bool:
    """The process exited (not reaped, so its pid and process group id stay reserved)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass  # all gone already


def end_group(proc, terminate: bool, grace: float = 10.0) -> None:
    """Reap the stage and leave nothing of its process group running. ``terminate``: SIGTERM
    the group first (the stage ends its play process and writes its checkpoint and summary) and
    SIGKILL it after ``grace`` seconds; otherwise wait for the stage to exit on its own. Either
    way, play processes still alive after the stage exited are killed."""
    if terminate and not leader_exited(proc.pid):
        signal_group(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while not leader_exited(proc.pid):
        if terminate and time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    signal_group(proc.pid, signal.SIGKILL)  # stragglers only, once the leader exited
    proc.wait()


def stop_all(children, grace: float = 3.0) -> None:
    """End a run's play processes (multiprocessing's): SIGTERM each, SIGKILL what is still alive
    after ``grace`` seconds; each is joined."""
    for proc in children:
        if proc.is_alive():
            proc.terminate()
            try:
                os.kill(proc.pid, signal.SIGCONT)  # a stopped one acts on SIGTERM once continued
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + grace
    for proc in children:
        proc.join(max(0.0, deadline - time.monotonic()))
        if proc.is_alive():
            proc.kill()
            proc.join(1.0)

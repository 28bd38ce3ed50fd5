"""A run folder belongs to one process at a time: the run that made it, or the one resuming a
checkpoint in it. The owner holds ``flock`` on the folder itself, so that nothing is written
into it for the lock and the lock dies with its holder, however that ends; a second run or
resume into the folder is refused (one line naming the holder's pid, exit 2). A new run's
folder is made with ``mkdir``, never reused: two runs started in the same second get two.
"""

from __future__ import annotations

import fcntl
import os

from lib.run.cli import UsageError, WriteError


class Lock:
    """The held lock of a run folder; ``release`` (or the process's end) lets it go."""

    def __init__(self, fd: int):
        self.fd = fd

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def holder(folder: str) -> int | None:
    """The pid holding ``flock`` on ``folder``, from /proc/locks; None where it cannot be told."""
    try:
        st = os.stat(folder)
        want = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
        with open("/proc/locks") as f:
            for line in f:
                fields = line.split()
                if "->" not in fields and len(fields) > 5 and fields[1] == "FLOCK" and fields[5] == want:
                    return int(fields[4])
    except (OSError, ValueError):
        pass
    return None


def claim(folder: str, label: str, kind: str = "run") -> Lock:
    """Hold the lock on ``folder``; UsageError (starting with ``label``) where another process
    holds it. ``kind``: what writes such folders (a run; a bench its results folder)."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as e:
        raise UsageError(f"{label}: cannot open its folder {folder} ({e.strerror})") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        pid = holder(folder)
        who = f"process {pid}" if pid is not None else "another process"
        raise UsageError(
            f"{label}: the {kind} folder {folder} is in use by {who} (one {kind} writes into it at a time)"
        )
    except OSError:
        pass  # a file system without flock: the run goes on unguarded, as before
    return Lock(fd)


def make_folder(base: str) -> tuple[str, Lock]:
    """A new run folder, ``base`` or, where that exists, ``base-2``, ``base-3``, ...; made
    with ``mkdir`` (which fails where another process made it first) and locked."""
    parent = os.path.dirname(base)
    folder, n = base, 1
    try:
        os.makedirs(parent, exist_ok=True)
        while True:
            try:
                os.mkdir(folder)
                return folder, claim(folder, folder)
            except FileExistsError:
                n += 1
                folder = f"{base}-{n}"
    except OSError as e:
        raise WriteError(f"cannot create {folder}: {e.strerror or e}") from None

"""A file's write and a full disk: the room checked before a large write, and the OS's reason
named after a failed one."""

from __future__ import annotations

import errno
import os
import shutil


def need_room(path: str | None, size: int, then: int = 0) -> None:
    """OSError ENOSPC when the file system of ``path`` has less than ``size`` + ``then`` bytes free
    (``then``: what is written after this file, the checkpoint after its ring)."""
    if path is None:
        return
    try:
        free = shutil.disk_usage(os.path.dirname(os.path.abspath(path))).free
    except OSError:
        return
    need = size + then
    if free < need:
        what = " for the ring and its checkpoint" if then else ""
        raise OSError(
            errno.ENOSPC,
            f"{os.strerror(errno.ENOSPC)} ({need / 2**20:.0f} MiB needed{what}, {free / 2**20:.0f} MiB free)",
        )


def write_reason(error: BaseException, path: str) -> str:
    """The OS's reason a write of ``path`` failed. torch's serializer reports a failed write in
    its own words ("unexpected pos ..."), with the OSError behind it as the exception's context;
    where there is none and the disk is full, that is the reason."""
    seen = error
    while seen is not None:
        if isinstance(seen, OSError) and seen.strerror:
            return seen.strerror
        seen = seen.__cause__ or seen.__context__
    try:
        if shutil.disk_usage(os.path.dirname(os.path.abspath(path))).free == 0:
            return os.strerror(errno.ENOSPC)
    except OSError:
        pass
    return (str(error).strip().splitlines() or ["?"])[-1]

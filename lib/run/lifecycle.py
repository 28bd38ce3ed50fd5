"""The process a run lives in, apart from the run: what ``runner.main`` sets for the run's
length and puts back after it, so that stages can run one after another in one process (the
tests do so): the stop signals (``lib.run.signals``), the thread exception hook that keeps
TensorBoard's writer threads quiet, stdout (a reader gone drops lines, not the run), and
torch's thread count. The run's children are its own (``Run.children``, ended by ``close``).
"""

from __future__ import annotations

import contextlib
import os
import select
import stat
import sys
import threading

import torch

from lib.run import signals
from lib.run.events import EventWriter


@contextlib.contextmanager
def run_process():
    """For a run's length: stop signals raise in the main thread, writer threads' errors stay
    quiet, stdout drops lines rather than block (yielded: it counts the lines dropped); all put
    back on exit, torch's thread count included."""
    threads = torch.get_num_threads()
    old_thread_hook = threading.excepthook
    threading.excepthook = EventWriter.quiet_writer_threads(old_thread_hook)
    restore_handlers = signals.stop_on_signals()
    stdout = sys.stdout
    sys.stdout = dropping = DroppingStdout(stdout)
    try:
        yield dropping
    finally:
        sys.stdout = stdout
        restore_handlers()
        threading.excepthook = old_thread_hook
        torch.set_num_threads(threads)


class DroppingStdout:
    """sys.stdout for a run whose reader may go away (``| head -n 1``), stop reading (``| less``
    left alone, ``| sleep``) or whose disk fills (``> /dev/full``): a line that cannot be written
    now is dropped and counted (``dropped``), and the run goes on to its summary.json and exit
    code. Text goes out a line at a time (and what is left at a flush): where stdout is a pipe,
    a line goes out only when the pipe has room for it, since a write to a full pipe would block
    the run, and the stop signals that could end it, until someone reads. The first failed write
    drops that line and every later one; the file descriptor then points at /dev/null, so that
    what is still buffered, and the interpreter's last flush, go there."""

    def __init__(self, stream):
        self.stream = stream
        self.dropping = False
        self.dropped = 0  # lines (or pieces of one, at a flush) that were not written
        self._pending = ""
        self._room = _pipe_room(stream)

    def write(self, text: str) -> int:
        self._pending += text
        if "\n" in text:
            cut = self._pending.rindex("\n") + 1
            lines, self._pending = self._pending[:cut], self._pending[cut:]
            for line in lines.splitlines(keepends=True):
                self._put(line)
        return len(text)

    def flush(self) -> None:
        if self._pending:
            piece, self._pending = self._pending, ""
            self._put(piece)

    def _put(self, piece: str) -> None:
        if self.dropping or (self._room is not None and not self._room()):
            self.dropped += 1
            return
        try:
            self.stream.write(piece)
            self.stream.flush()
        except (OSError, ValueError):  # BrokenPipeError, ENOSPC, EIO; ValueError: a closed file
            self.dropped += 1
            self.dropping = True
            try:
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, self.stream.fileno())
                os.close(devnull)
            except (OSError, ValueError, AttributeError):  # io.UnsupportedOperation is both
                pass

    def __getattr__(self, name):
        return getattr(self.stream, name)


def _pipe_room(stream):
    """For a stream on a pipe or FIFO: a function that says whether a write of up to a page (4 KiB,
    longer than any line a run prints) would go through now: poll says writable (a free page in
    the pipe), or the reader is gone, which the write then tells. None for anything else (a
    terminal, a file, a StringIO), which is written as it comes."""
    try:
        fd = stream.fileno()
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return None
    except (OSError, ValueError, AttributeError):
        return None
    poll = select.poll()
    poll.register(fd, select.POLLOUT)
    return lambda: bool(poll.poll(0))

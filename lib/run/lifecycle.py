"""The process a run lives in, apart from the run: what ``runner.main`` sets for the run's
length and puts back after it, so that stages can run one after another in one process (the
tests do so): the stop signals (``lib.run.signals``), the thread exception hook that keeps
TensorBoard's writer threads quiet, stdout (a reader gone drops lines, not the run), and
torch's thread count. The run's children are its own (``Run.children``, ended by ``close``).
"""

from __future__ import annotations

import contextlib
import sys
import threading

import torch

from lib.run import cli, signals
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
    sys.stdout = dropping = cli.DroppingStdout(stdout)
    try:
        yield dropping
    finally:
        sys.stdout = stdout
        restore_handlers()
        threading.excepthook = old_thread_hook
        torch.set_num_threads(threads)

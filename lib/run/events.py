"""The run's TensorBoard writer, whose failures (a full disk, a folder gone) stop the run in
one line that names the event file, as every other file a run writes does."""

from __future__ import annotations

import contextlib
import glob
import os

from lib.run.cli import WriteError


class EventWriter:
    """TensorBoard's SummaryWriter whose failures (raised by its writer thread at the next call)
    become WriteError naming the event file. The writer thread's own report of the failure
    (a traceback on stderr) is held back: the run reports it in one line."""

    @staticmethod
    def quiet_writer_threads(previous):
        def hook(args):
            if type(args.thread).__name__ != "_AsyncWriterThread":
                previous(args)

        return hook

    def __init__(self, folder: str, purge_step: int | None = None):
        from torch.utils.tensorboard import SummaryWriter

        self.folder = folder
        self._failed = None  # why the event file could not be made: every later call raises it
        before = set(glob.glob(os.path.join(folder, "events.out.tfevents.*")))
        try:
            self._writer = SummaryWriter(folder, purge_step=purge_step)
        except (OSError, RuntimeError) as e:  # a full disk at the start: the file named, not left behind
            made = sorted(set(glob.glob(os.path.join(folder, "events.out.tfevents.*"))) - before)
            for path in made:
                with contextlib.suppress(OSError):
                    os.remove(path)
            where = made[0] if made else f"TensorBoard events in {folder}"
            self._failed = f"cannot write {where}: {getattr(e, 'strerror', None) or e}"

    def _fail(self, e: Exception):
        path = getattr(self._writer.file_writer.event_writer, "_file_name", self.folder)
        raise WriteError(f"cannot write {path}: {getattr(e, 'strerror', None) or e}") from None

    def _check(self) -> None:
        """WriteError where the event file could not be made."""
        if self._failed is not None:
            raise WriteError(self._failed)

    def add_scalar(self, tag: str, value, step: int) -> None:
        self._check()
        try:
            self._writer.add_scalar(tag, value, step)
        except Exception as e:
            self._fail(e)

    def flush(self) -> None:
        self._check()
        try:
            self._writer.flush()
        except Exception as e:
            self._fail(e)

    def close(self) -> None:
        self._check()
        try:
            self._writer.close()
        except Exception as e:
            self._fail(e)

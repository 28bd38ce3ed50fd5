"""A stand-in for ``lib.run.checkpoint._open`` that signals this process from inside a write: a stop
that lands while torch.save is part way through a file."""

import os
import pathlib


class SignalAt:
    """``checkpoint._open`` whose files send ``sig`` to this process from inside their ``at``-th
    write (counted over all of them); with ``name``, only temporary files named ``name...``
    count and signal."""

    def __init__(self, sig: int, at: int, name: str | None = None):
        self.sig, self.at, self.name, self.writes = sig, at, name, 0

    def open(self, path, mode="r", *args, **kwargs):
        f = open(path, mode, *args, **kwargs)
        base = pathlib.Path(path).name
        if self.name is not None and not (base.startswith(self.name) and base.endswith(".tmp")):
            return f
        write = f.write

        def signalling(data):
            self.writes += 1
            if self.writes == self.at:
                os.kill(os.getpid(), self.sig)
            return write(data)

        f.write = signalling
        return f

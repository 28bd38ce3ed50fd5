"""The replay rings of a sweep's runs (``--save-replay``, on by default): a run's checkpoints
hold its ring (``replay-<frame>.pt`` beside ``checkpoint.pt``), so that the next sitting goes on
with the buffer it had instead of refilling ``replay_initial`` transitions untrained.

A ring is large (100k slots: about 0.7 GB), so it never travels as bytes: on this machine the
stage's ring files are hard-linked into the sweep's run folder as they appear, and a resume links
the one its checkpoint names into the stage's folder. Before a run starts, the disk of the
sweep's folder must have room for one more ring and checkpoint of this run and of each run
already saving one (a new ring is written before the old one goes), with a margin; where it
has not, the run goes without its ring. A run that goes without (no room, the ring missing,
``--no-save-replay``) resumes from its checkpoint stripped of the ring it names. Runs on a Ray
cluster go without: their files travel through Ray's object store.

This module reads checkpoints with torch, in the driver only.
"""

from __future__ import annotations

import dataclasses
import glob
import io
import os
import re
import shutil

from lib.params import GAMES
from lib.run.memory import SLOT_BYTES  # a replay slot, in memory as on disk

CHECKPOINT_BYTES = 32 * 2**20  # a checkpoint before the run has one to measure (nets and Adam: 27 MB for Pong)
MARGIN = 2**30  # free space a sweep leaves on its disk beyond what its runs' rings need
_NAME = re.compile(r"^replay-(\d+)\.pt$")


@dataclasses.dataclass(frozen=True)
class Linked:
    """A file that travels to the stage's folder as a hard link (a copy where the file system
    has none), not as bytes: a ring."""

    path: str


def place(src, dst: str) -> None:
    """Put a file of a run in ``dst``: bytes written, or a ``Linked`` file linked."""
    if not isinstance(src, Linked):
        with open(dst, "wb") as f:
            f.write(src)
        return
    try:
        os.link(src.path, dst)
    except OSError:
        shutil.copyfile(src.path, dst)


def frame_of(name: str) -> int | None:
    m = _NAME.match(os.path.basename(name))
    return int(m.group(1)) if m else None


def ring_files(folder: str) -> list[str]:
    """The ring files in ``folder``, oldest frame first."""
    found = [p for p in glob.glob(os.path.join(folder, "replay-*.pt")) if frame_of(p) is not None]
    return sorted(found, key=frame_of)


def ring_bytes(spec) -> int:
    """The size on disk of a run's ring: its replay size (``--replay-size`` among its flags, else
    its game's) times a slot's bytes."""
    size = GAMES[spec.game].replay_size
    flags = list(spec.flags)
    for i, flag in enumerate(flags):
        if flag == "--replay-size" and i + 1 < len(flags):
            size = int(flags[i + 1])
        elif flag.startswith("--replay-size="):
            size = int(flag.split("=", 1)[1])
    return size * SLOT_BYTES


def size(nbytes: int) -> str:
    """'34 MiB', '0.7 GiB'."""
    return f"{nbytes / 2**30:.1f} GiB" if nbytes >= 2**30 / 10 else f"{nbytes / 2**20:.0f} MiB"


def free_bytes(folder: str) -> int:
    """Free space on the file system of ``folder``."""
    return shutil.disk_usage(folder).free


def room(out: str, need: int) -> tuple[bool, int]:
    """Whether the disk of the sweep's folder ``out`` has ``need`` bytes and the margin free; its free bytes."""
    free = free_bytes(out)
    return free >= need + MARGIN, free


def need_for(spec, folder: str) -> int:
    """What one more ring and checkpoint of the run ``spec`` (its folder ``folder``) take."""
    ckpt = os.path.join(folder, "checkpoint.pt")
    return ring_bytes(spec) + (os.path.getsize(ckpt) if os.path.isfile(ckpt) else CHECKPOINT_BYTES)


def _load(source):
    import torch  # here only: a Ray worker that launches runs never reads checkpoints

    try:
        ckpt = torch.load(source, map_location="cpu", weights_only=True, mmap=isinstance(source, str))
    except Exception:
        return None
    return ckpt if isinstance(ckpt, dict) else None


def named_ring(folder: str) -> tuple[int | None, str | None]:
    """The frame of the run's checkpoint and the ring file it names (None where it has none)."""
    ckpt = (
        _load(os.path.join(folder, "checkpoint.pt")) if os.path.isfile(os.path.join(folder, "checkpoint.pt")) else None
    )
    if ckpt is None:
        return None, None
    replay = ckpt.get("replay")
    frame = ckpt.get("frame_idx")
    return (frame if isinstance(frame, int) else None), (str(replay.get("file")) if isinstance(replay, dict) else None)


def without_ring(data: bytes) -> bytes:
    """A checkpoint's bytes less the ring and the game in progress it names: the stage resumes
    it as a checkpoint taken without ``--save-replay`` (the buffer refilled, a new game)."""
    import torch

    ckpt = _load(io.BytesIO(data))
    if ckpt is None:
        return data  # not readable here: the stage says so
    ckpt.pop("replay", None)
    ckpt.pop("env", None)
    out = io.BytesIO()
    torch.save(ckpt, out)
    return out.getvalue()


def prune(folder: str, everything: bool = False) -> None:
    """Remove the run's rings that its checkpoint has gone past (all of them with ``everything``):
    those of earlier frames, and one of its frame that it does not name. A ring of a later frame
    stays: its checkpoint is on its way."""
    found = ring_files(folder)
    frame, named = (None, None) if everything or not found else named_ring(folder)
    for path in found:
        ring = frame_of(path)
        if everything or (frame is not None and (ring < frame or (ring == frame and os.path.basename(path) != named))):
            try:
                os.remove(path)
            except OSError:
                pass


def keep_rings(src: str, dst: str) -> None:
    """Hard-link each ring file of the stage's folder ``src`` into the sweep's run folder ``dst``
    (a copy where the file system has no links); those already there are left."""
    for path in ring_files(src):
        target = os.path.join(dst, os.path.basename(path))
        if os.path.exists(target):
            continue
        try:
            place(Linked(path), target + ".tmp")
            os.replace(target + ".tmp", target)
        except OSError:
            pass  # removed under us: the stage has written a newer one

"""What every process of a stage shares: the settings it makes first (the subnormal flush and
glibc's malloc thresholds), the global random number generators (seeding, and their state,
which checkpoints carry).

The trainer (``Run.start``), its play process (``parallel.child_setup``) and the bench's part
timings call ``process_settings`` before anything else.
"""

from __future__ import annotations

import ctypes
import os
import random

import numpy as np
import torch


def flush_denormals() -> None:
    """Treat subnormal floats as zero on this CPU (x86 FTZ/DAZ; threads started later inherit it).

    Late in a run, dead ReLU units leave Adam moments and gradients that decay into the
    subnormal range, and each such value sends an x86 CPU down a slow microcode path (see the
    ledger, docs/ledger.md). Values below 1.2e-38 carry nothing for learning. No effect on GPU kernels.
    """
    torch.set_flush_denormal(True)


# glibc's malloc, as every stage process sets it (``keep_freed_memory``): blocks up to 32 MiB
# (glibc's largest mmap threshold on 64-bit) come from the heap, and up to 1 GiB of free heap
# stays mapped instead of going back to the kernel.
MMAP_THRESHOLD = 32 * 2**20
TRIM_THRESHOLD = 2**30
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt's parameter numbers (malloc.h)
MALLOC_DEFAULTS_ENV = "DQN_MALLOC_DEFAULTS"  # set to 1: leave glibc's malloc as it is


def is_glibc() -> bool:
    """Whether this process runs on GNU libc (whose malloc ``mallopt`` tunes)."""
    try:
        return (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc")
    except (AttributeError, ValueError, OSError):
        return False


def malloc_left_alone() -> str | None:
    """Why ``keep_freed_memory`` leaves glibc's malloc as it is here (one line), or None."""
    if os.environ.get(MALLOC_DEFAULTS_ENV, "") not in ("", "0"):
        return f"glibc defaults ({MALLOC_DEFAULTS_ENV}=1)"
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    for name in ("trim_threshold", "mmap_threshold"):
        if f"MALLOC_{name.upper()}_" in os.environ or f"glibc.malloc.{name}=" in tunables:
            return f"as the environment sets it ({name})"
    if not is_glibc():
        return "the C library's defaults (not glibc)"
    return None


def malloc_setting() -> str:
    """What the stage processes started from here do with malloc, for reports."""
    return malloc_left_alone() or (
        f"glibc malloc keeps freed memory (mmap threshold {MMAP_THRESHOLD >> 20} MiB, "
        f"trim threshold {TRIM_THRESHOLD >> 20} MiB)"
    )


def keep_freed_memory() -> bool:
    """Make glibc's malloc keep the memory a train step frees, for the next step to reuse.

    A train step allocates and frees the same few tens of MB every time (the batch in each
    dtype and layout, activations, gradients). By default glibc serves blocks above a moving
    threshold (128 KiB at first) with fresh ``mmap`` and hands freed heap above another back
    to the kernel, so every step maps new pages and the kernel zeroes each 4 KiB page on its
    first touch. On a 2-core CPU that was about 1,500 page faults per train step in stage 07
    and 4,400 in stage 08 (the same step, but another sequence of allocations: 08 reuses its
    batch buffers, and where glibc's thresholds settle depends on that sequence), and 08 ran
    at about 0.92x of 07. With both thresholds fixed high, a step's memory stays mapped and is
    reused (under 60 faults a step in either) and 08 runs as fast as 07 (1.00 over 16 runs
    each; ``results/investigations/cpu-amd-epyc-2c-malloc``). Nothing changes in what is computed.

    Returns whether the settings took effect; ``malloc_left_alone`` says why not: not glibc,
    ``DQN_MALLOC_DEFAULTS=1`` (glibc's defaults, e.g. to measure the difference), or either
    threshold already set by the user (``MALLOC_TRIM_THRESHOLD_``, ``MALLOC_MMAP_THRESHOLD_``
    or ``GLIBC_TUNABLES``): theirs stand.
    """
    if malloc_left_alone() is not None:
        return False
    try:
        libc = ctypes.CDLL(None)
        ok = libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
        return libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1 and ok
    except (OSError, AttributeError):
        return False


def process_settings() -> None:
    """What every process of a stage (trainer, play process) and the bench's part timings
    set first: the subnormal flush and the malloc thresholds."""
    flush_denormals()
    keep_freed_memory()


def set_seed(seed: int) -> None:
    """Seed python, numpy and torch (CUDA included). Envs take ``seed`` at their first reset."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def rng_state() -> dict:
    """The global RNG states of python, numpy and torch (and CUDA once used), as saved data."""
    np_state = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": [np_state[0], np_state[1].tolist(), np_state[2], np_state[3], np_state[4]],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    n = state["numpy"]
    np.random.set_state((n[0], np.array(n[1], dtype=np.uint32), n[2], n[3], n[4]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])

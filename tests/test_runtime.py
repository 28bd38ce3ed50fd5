"""lib.run.runtime: what every process of a stage sets first (the subnormal flush, glibc's malloc
thresholds) and the global RNGs a checkpoint carries."""

import os
import random
import subprocess
import sys

import numpy as np
import pytest
import torch

from lib.run.runtime import flush_denormals, is_glibc, rng_state, set_rng_state, set_seed
from tests.conftest import ROOT


def test_flush_denormals_makes_subnormals_zero():
    # Late in a run, Adam moments decay into the subnormal range, which x86 CPUs handle slowly.
    tiny = torch.tensor([1e-39], dtype=torch.float32)
    flush_denormals()
    assert (tiny * 1.0).item() == 0.0


# A train step's memory pattern in plain C: an 8 MiB block through mmap (glibc then raises its
# moving thresholds to 8 MiB, and 16 MiB for trimming, as a step's first batch makes it do),
# then steps that each allocate, touch and free 3 x 7 MiB of heap. Prints the page faults of
# 20 such steps after a first one.
_MALLOC_PROBE = """
import ctypes, resource, sys
sys.path.insert(0, sys.argv[1])
from lib.run.runtime import keep_freed_memory, malloc_left_alone
print(keep_freed_memory(), malloc_left_alone())
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
def touch_and_free(*sizes):
    blocks = [libc.malloc(n) for n in sizes]
    for b, n in zip(blocks, sizes):
        ctypes.memset(b, 1, n)
    for b in blocks:
        libc.free(b)
touch_and_free(8 << 20)
touch_and_free(*[7 << 20] * 3)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    touch_and_free(*[7 << 20] * 3)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(not is_glibc(), reason="glibc only")
def test_stage_processes_keep_a_steps_freed_memory_mapped():
    """Under glibc's defaults each step's memory goes back to the kernel and comes back as
    fresh zeroed pages (about 5,400 faults for 21 MiB); with ``keep_freed_memory`` the
    freed heap is reused. ``DQN_MALLOC_DEFAULTS=1`` and a user's own threshold opt out."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "DQN_MALLOC_DEFAULTS"}
    env.pop("GLIBC_TUNABLES", None)

    def probe(**extra):
        out = subprocess.run(
            [sys.executable, "-c", _MALLOC_PROBE, str(ROOT)], env={**env, **extra}, capture_output=True,
            text=True, timeout=120, check=True,
        ).stdout.splitlines()  # fmt: skip
        return out[0], int(out[1])

    kept, kept_faults = probe()
    defaults, default_faults = probe(DQN_MALLOC_DEFAULTS="1")
    users, _ = probe(MALLOC_TRIM_THRESHOLD_="131072")
    assert kept == "True None"
    assert defaults == "False glibc defaults (DQN_MALLOC_DEFAULTS=1)"
    assert users == "False as the environment sets it (trim_threshold)"
    # 20 steps: at least one fault a step under the defaults (a huge page each, where
    # transparent huge pages back the heap), almost none when freed memory is kept.
    assert default_faults >= 20, default_faults
    assert kept_faults <= 10 and kept_faults * 10 <= default_faults, (kept_faults, default_faults)


def test_rng_state_round_trip_repeats_every_draw():
    """The RNG states a checkpoint saves, put back, give the same next draws of python, numpy
    and torch."""
    set_seed(5)
    random.random(), np.random.random(), torch.rand(1)
    saved = rng_state()
    first = (random.random(), np.random.random(), torch.rand(3))
    set_seed(6)
    set_rng_state(saved)
    again = (random.random(), np.random.random(), torch.rand(3))
    assert first[:2] == again[:2] and torch.equal(first[2], again[2])

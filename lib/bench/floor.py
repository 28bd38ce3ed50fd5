"""The arithmetic floor of a train step: its FLOPs (``lib.model.train_step_flops``) over the rate
at which this device multiplies two large square matrices in the step's precision.

A convolution is no better shaped for a CPU's or a GPU's matrix units than a 2048x2048 matmul,
so a train step cannot beat this floor by much; what it spends above it is overhead (casts,
layout changes, element-wise passes, Python) and kernels shaped worse than the matmul. The
rate is measured in the process that times the step, just before, since machines of one
description differ by 2-3x and one machine drifts from one minute to the next.

The matmul is timed in the arithmetic the step's convolutions use (``floor_math``): on CUDA,
cuDNN runs fp32 convolutions as TF32 by default (``torch.backends.cudnn.allow_tf32``) while
cuBLAS runs an fp32 matmul in IEEE fp32 unless told otherwise, so an fp32 floor timed as IEEE
would be several times too low a rate, and the fp32 ratio would understate the overhead.
"""

from __future__ import annotations

import contextlib
import time

import torch

from lib.model import DQN, train_step_flops

MATMUL = 2048  # the square matmul whose rate sets the floor
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def floor_math(device, precision: str) -> str:
    """The arithmetic of the step's convolutions, which the floor is timed in: ``bf16``; for
    fp32, ``tf32`` on CUDA where cuDNN runs fp32 convolutions as TF32, else ``ieee`` (a CPU's fp32)."""
    if precision != "fp32":
        return precision
    if torch.device(device).type == "cuda" and torch.backends.cudnn.allow_tf32:
        return "tf32"
    return "ieee"


@contextlib.contextmanager
def _matmul_math(math: str):
    """cuBLAS's fp32 matmul as TF32 while the floor is timed, where ``math`` is tf32; restored after."""
    if math != "tf32":
        yield
        return
    was = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = was


def matmul_rate(device, precision: str, seconds: float = 1.0) -> float:
    """FLOP/s of a ``MATMUL``-square matmul in ``precision`` on ``device``, in ``floor_math``'s
    arithmetic: the best of several timed batches within about ``seconds``, so that a moment of
    other work does not lower it."""
    with _matmul_math(floor_math(device, precision)):
        return _matmul_rate(torch.device(device), precision, seconds)


def _matmul_rate(device, precision: str, seconds: float) -> float:
    a, b = (torch.randn(MATMUL, MATMUL, device=device).to(DTYPES[precision]) for _ in range(2))
    out = torch.empty_like(a)
    cuda = device.type == "cuda"
    best, reps, spent = 0.0, 4, 0.0
    for _ in range(2):  # warm-up: kernels picked, pages touched
        torch.matmul(a, b, out=out)
    while spent < seconds:
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(reps):
            torch.matmul(a, b, out=out)
        if cuda:
            torch.cuda.synchronize()
        took = time.perf_counter() - t0
        spent += took
        best = max(best, reps * 2 * MATMUL**3 / took)
    return best


def floor_ms(shape: tuple[int, int, int], batch_size: int, rate: float, n_actions: int = 6) -> float:
    """The DQN train step's arithmetic on ``shape`` inputs at ``batch_size``, over ``rate``
    FLOP/s, in ms."""
    return 1000 * train_step_flops(DQN(shape, n_actions), shape, batch_size) / rate

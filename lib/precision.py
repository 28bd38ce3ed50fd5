"""The learner's arithmetic in stages 06-08 (``--precision``): bf16 autocast or plain fp32.

bf16 is what stage 06 adds, and it pays only where the hardware computes it: CUDA GPUs from
Ampere on, CPUs whose oneDNN has bf16 kernels (AVX-512 bf16 or AMX). Elsewhere torch emulates
it, and the train step gets several times slower (measured: 7.7-8.5x on a 2-core AMD EPYC with AVX2
only, ``results/investigations/cpu-amd-epyc-zen1-2c-precision``). ``auto``, the default, is bf16 where the
device has it and fp32 where it does not; ``bf16`` and ``fp32`` are taken as given.

Torch is imported only when ``auto`` is resolved, so the sweep can check a stage's flags
without it.
"""

from __future__ import annotations

CHOICES = ("auto", "bf16", "fp32")


def native_bf16(device_type: str) -> bool:
    """Whether ``device_type`` computes bf16 itself rather than emulating it: on CUDA,
    ``torch.cuda.is_bf16_supported()`` without emulation (compute capability 8.0 and up); on
    CPU, whether oneDNN reports bf16 support (the CPU has AVX-512 bf16 or AMX)."""
    import torch

    if device_type == "cuda":
        try:
            return torch.cuda.is_bf16_supported(including_emulation=False)
        except TypeError:  # a torch before the keyword (2.4): bf16 is native from compute capability 8.0
            return torch.cuda.get_device_capability()[0] >= 8
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a torch build without oneDNN: no bf16 kernels
        return False


def resolve_precision(value: str, device_type: str) -> str:
    """``--precision`` as a run on ``device_type`` keeps it (and its checkpoints save it):
    ``auto`` becomes ``bf16`` where the device computes bf16 natively, else ``fp32``.
    ValueError for a value not among ``CHOICES``."""
    if value not in CHOICES:
        raise ValueError(f"unknown precision {value!r} (known: {', '.join(CHOICES)})")
    if value == "auto":
        return "bf16" if native_bf16(device_type) else "fp32"
    return value

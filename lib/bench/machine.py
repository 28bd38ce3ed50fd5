"""Facts about the machine and the code a bench ran on: they go with every figure it writes."""

from __future__ import annotations

import os
import platform
import re
import shlex
import sys

import ale_py
import cv2
import gymnasium
import numpy
import torch


def slugify(text: str) -> str:
    """'Intel(R) Xeon(R) Gold 6338 CPU @ 2.00GHz' -> 'intel-xeon-gold-6338'."""
    text = text.lower().split("@")[0]
    text = re.sub(r"\((r|tm|c)\)|[®™©]", " ", text)
    words = [w for w in re.split(r"[^a-z0-9]+", text) if w and w not in ("cpu", "processor")]
    return "-".join(words) or "unknown"


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


# The widest units the learner's CPU kernels can use, widest first: (flag in /proc/cpuinfo, tag word).
# CPUs of one model name differ here (a VM's "AMD EPYC" may be AVX2-only or have AVX-512 bf16; a
# Xeon may or may not offer AMX), and so does the learner's speed, bf16's above all.
ISA_LEVELS = (("amx_bf16", "amx"), ("avx512_bf16", "avx512bf16"), ("avx512f", "avx512"), ("avx2", "avx2"))


def cpu_flags() -> set[str]:
    """The CPU's feature flags (Linux's /proc/cpuinfo); empty where they cannot be read."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_isa(flags: set[str]) -> str | None:
    """The widest of ``ISA_LEVELS`` the CPU has: 'amx', 'avx512bf16', 'avx512', 'avx2', or None."""
    return next((word for flag, word in ISA_LEVELS if flag in flags), None)


def default_tag(device: str, cpu_name: str, cores: int, gpu_name: str | None = None, isa: str | None = None) -> str:
    """The results folder's name: the GPU model on CUDA, else the CPU model, its widest units
    (``cpu_isa``, where known) and core count."""
    if device == "cuda":
        return f"gpu-{slugify(gpu_name or 'cuda')}"
    return f"cpu-{slugify(cpu_name)}-" + (f"{isa}-" if isa else "") + f"{cores}c"


def memory_gib() -> float | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 2**20, 1)
    except (OSError, ValueError, IndexError):
        pass
    return None


def gpu_name(device: str) -> str | None:
    return torch.cuda.get_device_name() if device == "cuda" else None


def hardware(device: str) -> dict:
    return {
        "cpu": cpu_model(),
        "isa": cpu_isa(cpu_flags()),
        "cores": os.cpu_count() or 1,
        "memory_gib": memory_gib(),
        "gpu": gpu_name(device),
    }


def versions() -> dict:
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "gymnasium": gymnasium.__version__,
        "ale-py": ale_py.__version__,
        "numpy": numpy.__version__,
        "opencv": cv2.__version__,
    }


def load_average() -> float | None:
    """1-minute load average: other work on the machine skews every figure, so it is recorded."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def command_line(argv: list[str], script: str = "dqn-bench", module: str = "lib.bench") -> str:
    """The command as the user typed it, for the report: the installed ``script`` if that is
    what ran, else ``python -m module``."""
    prog = script if os.path.basename(sys.argv[0]) == script else f"python -m {module}"
    return " ".join([prog] + ([shlex.join(argv)] if argv else []))

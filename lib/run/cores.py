"""How a run's cores are shared: the trainer's threads, the play process's threads, and how
many games the native vector env of stages 07-08 plays when ``--envs auto``.

No torch here beyond reading the device type, so the runner can resolve ``--envs`` while it
validates, before anything is built.
"""

from __future__ import annotations

import os

CPU_ENVS = 4  # --envs auto on CPU: the learner is the bound there, and four games feed it
GAMES_PER_PLAY_THREAD = 2  # --envs auto on CUDA: games per vector-env thread


def cpu_budget() -> int:
    """The cores this run may use: ``OMP_NUM_THREADS`` when set (a sweep sets it to the CPUs it
    gave the run, as torch itself reads it), else the cores this process may run on."""
    try:
        given = int(os.environ.get("OMP_NUM_THREADS", ""))
    except ValueError:
        given = 0
    if given > 0:
        return given
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _device_type(device) -> str:
    return device.type if hasattr(device, "type") else str(device).split(":")[0]


def split_threads(device, total: int | None = None) -> tuple[int, int]:
    """(trainer threads, player threads) out of ``total`` (default: ``cpu_budget()``). On CPU
    the learner dominates and the player mostly waits on a full Queue, so the trainer keeps
    every core and the player runs one thread (giving the trainer one thread of two costs far
    more than sharing a core with the player). On CUDA the trainer's CPU thread only launches
    kernels and gathers batches, so the other cores go to the player (stage 07's vector env
    uses them; 03-06 play on one)."""
    total = total or cpu_budget()
    if _device_type(device) == "cpu":
        return total, 1
    return 1, max(1, total - 1)


def auto_envs(device, total: int | None = None) -> int:
    """K for ``--envs auto``. On CPU, 4: the train step bounds the speed and more games only
    stretch the replay rings thinner. On CUDA, two games for each thread the play process gets
    (``split_threads``): the vector env steps the K games on those threads, and with two a
    thread none of them idles while one slow game finishes, while the one batched forward over
    K states costs the GPU about what it costs for one. On the H200 host (16 cores) that is 30."""
    if _device_type(device) == "cpu":
        return CPU_ENVS
    return GAMES_PER_PLAY_THREAD * split_threads(device, total)[1]

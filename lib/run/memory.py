"""What a run needs of the machine's memory, checked before anything starts: the replay ring,
the games it plays side by side (``--envs``) and, from stage 03 on, its play process. A run
that would not fit is refused in one line (exit 2) instead of being killed by the kernel, or
swapping, once it has started.

The figures are rounded up from what was measured on a 2-core CPU (December 2026, torch 2.13,
ale-py's vector env over Pong): a game of the vector env takes 0.9 MiB once made and 1.8 MiB
after its reset and a few steps; a play process and the fork server it comes from take about
400 MiB together (torch and the emulator imported in each; their pages shared with the trainer
are not counted twice).
"""

from __future__ import annotations

import numpy as np

from lib.params import FRAME_SHAPE
from lib.run import cli
from lib.run.cli import UsageError

FRAME_BYTES = int(np.prod(FRAME_SHAPE))  # a replay slot's frame
SLOT_BYTES = FRAME_BYTES + 8 + 4 + 1 + 1  # and its action (int64), reward (float32), terminated and pad (bool)
# A game: the emulator, its screens and stack (1.8 MiB measured), its frames in flight (the
# actor's float32 batch row of 4x84x84, a few Queue items of 84x84) and the trainer's open
# episode, rounded up. 01-02 play one game in the trainer, 03-06 one in the play process.
GAME_BYTES = 4 * 2**20
PLAY_BYTES = 512 * 2**20  # a play process and the fork server (03-08)


def need(replay_size: int, envs: int, play: bool) -> int:
    """Bytes a run of ``replay_size`` slots and ``envs`` games needs beyond its trainer's own."""
    return replay_size * SLOT_BYTES + envs * GAME_BYTES + (PLAY_BYTES if play else 0)


def check(replay_size: int, envs: int, play: bool) -> None:
    """UsageError where the run needs more than the memory this machine has available."""
    bytes_needed = need(replay_size, envs, play)
    free = cli.available_memory()
    if free is not None and bytes_needed > free:
        side = " and its play process" if play else ""
        raise UsageError(
            f"the replay ring of {replay_size} slots, {envs} game(s){side} need about "
            f"{bytes_needed / 2**30:.1f} GiB; this machine has {free / 2**30:.1f} GiB available"
        )

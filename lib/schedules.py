"""When things happen, by the agent-step counter (``frame_idx``): the algorithm's schedules
(epsilon, the target net's sync) and the run's cadences (loss and time points, the units
check, best.pt), each in one place.

Every periodic event uses one rule, ``crossed``: it happens on the iteration whose counter
crosses a multiple of its period. A stage that advances the counter by N a train step (02 on)
then keeps the per-frame schedule of stage 01, whatever N.
"""

from __future__ import annotations

LOSS_FRAMES = 1000  # agent steps between loss points in TensorBoard
TIME_FRAMES = 5000  # agent steps between TensorBoard points of time/ and weights_age/
UNITS_FRAMES = 10_000  # agent steps of training between checks of the net's units (lib.run.probes.dead_units)
BEST_SECONDS = 60.0  # at most one best.pt a minute: writing it reads the net back from the device


def epsilon_at(frame_idx: int, params) -> float:
    """Linear from epsilon_start to epsilon_final over epsilon_frames agent steps, then flat."""
    fraction = min(1.0, frame_idx / params.epsilon_frames)
    return params.epsilon_start + fraction * (params.epsilon_final - params.epsilon_start)


def crossed(prev_frame: int, frame_idx: int, period: int) -> bool:
    """True when the counter crossed a multiple of ``period`` going from prev to frame_idx
    (the target sync every ``target_net_sync`` frames, checkpoints, loss and time points)."""
    return frame_idx // period > prev_frame // period

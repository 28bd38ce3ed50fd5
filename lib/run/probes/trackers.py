"""The run's trackers: the steady-state speed, and the reward and loss tracker.

The tracker prints the article's line per finished game and logs TensorBoard scalars, all
with the agent-step counter (``frame_idx``) as the step: reward, reward_100, speed, epsilon,
and loss (the mean of the train steps since the last log point). Its writer is the run's
``lib.run.events.EventWriter``.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from lib import schedules
from lib.run.cli import DeviceError


class SpeedMeter:
    """Steady-state training speed: agent steps per second since ``start``; ``on_start(frame_idx)``
    is called once, there (the run's time by part is measured from the same frame)."""

    def __init__(self, on_start=None):
        self.start_frame = None
        self.start_time = None
        self.on_start = on_start

    def start(self, frame_idx: int) -> None:
        if self.start_frame is None:
            if self.on_start is not None:
                self.on_start(frame_idx)
            self.start_frame = frame_idx
            self.start_time = time.perf_counter()

    @property
    def started(self) -> bool:
        return self.start_frame is not None

    def fps(self, frame_idx: int) -> float:
        if self.start_frame is None:
            return 0.0
        elapsed = time.perf_counter() - self.start_time
        return self.frames(frame_idx) / elapsed if elapsed > 0 else 0.0

    def frames(self, frame_idx: int) -> int:
        """Agent steps since ``start``; 0 for a run stopped in its first train step, whose count
        has not yet reached the frame the loop handed to ``start``."""
        return 0 if self.start_frame is None else max(0, frame_idx - self.start_frame)


class RewardTracker:
    """Per finished game: print the article's line, log scalars, say when solved."""

    def __init__(self, writer, stop_reward: float, rewards=None, log=print):
        self.writer = writer
        self.stop_reward = stop_reward
        self.rewards: list[float] = list(rewards or [])
        self.log = log
        self._last_frame = None
        self._last_time = time.perf_counter()
        self._last_speed = 0.0
        self._losses: list = []
        self._loss_frame = 0
        self._pending_loss = None  # (frame, (host tensor, event)): a loss point still being copied
        self.best_mean = None

    @property
    def mean_reward(self) -> float:
        return float(np.mean(self.rewards[-100:])) if self.rewards else float("nan")

    @property
    def solved(self) -> bool:
        """The stop rule: the mean of the last 100 games is above stop_reward."""
        return self.mean_reward > self.stop_reward

    def reward(self, reward: float, frame_idx: int, epsilon: float) -> bool:
        now = time.perf_counter()
        if self._last_frame is None:
            speed = 0.0
            self._last_time = now
        elif frame_idx == self._last_frame:
            # Games of a vector env that end on the same step share the interval of the first:
            # its speed, not 0 frames over the microseconds between the two calls.
            speed = self._last_speed
        else:
            speed = (frame_idx - self._last_frame) / max(now - self._last_time, 1e-9)
            self._last_time = now
        self._last_frame, self._last_speed = frame_idx, speed
        self.rewards.append(float(reward))
        mean = self.mean_reward
        self.log(
            f"{frame_idx}: done {len(self.rewards)} games, mean reward {mean:.3f}, "
            f"speed {speed:.2f} f/s, eps {epsilon:.2f}"
        )
        w = self.writer
        if w is not None:
            w.add_scalar("epsilon", epsilon, frame_idx)
            w.add_scalar("speed", speed, frame_idx)
            w.add_scalar("reward_100", mean, frame_idx)
            w.add_scalar("reward", reward, frame_idx)
        return self.solved

    def new_best(self) -> bool:
        """True once per new best mean of the last 100 games (at least 10 games in)."""
        if len(self.rewards) < 10:
            return False
        mean = self.mean_reward
        if self.best_mean is None or mean > self.best_mean:
            self.best_mean = mean
            return True
        return False

    def state_dict(self) -> dict:
        """The losses collected since the last log point (read now: a checkpoint may wait)."""
        return {"losses": [float(v) for v in self._losses], "loss_frame": self._loss_frame}

    def load_state_dict(self, state: dict) -> None:
        self._losses = list(state["losses"])
        self._loss_frame = state["loss_frame"]

    def loss(self, loss_value, frame_idx: int) -> None:
        """Collect train-step losses (tensors or floats); log their mean every
        ``lib.schedules.LOSS_FRAMES`` agent steps.

        The hot loop never waits for the device: tensors are averaged where they are, and a mean
        on a GPU is copied to pinned host memory without blocking and written at the next log
        point (or by ``flush_loss``), long after the copy has landed."""
        every = schedules.LOSS_FRAMES
        self._losses.append(loss_value.detach() if hasattr(loss_value, "detach") else loss_value)
        if frame_idx // every > self._loss_frame // every:
            self.flush_loss()
            if self.writer is not None:
                mean = _mean_in_flight(self._losses)
                if isinstance(mean, float):
                    self.writer.add_scalar("loss", mean, frame_idx)
                else:
                    self._pending_loss = (frame_idx, mean)
            self._losses.clear()
            self._loss_frame = frame_idx

    def flush_loss(self) -> None:
        """Write the loss point still on its way from the device (a checkpoint and the run's end
        call this). A device that failed loses that point: ``DeviceError`` names the failure."""
        if self._pending_loss is not None:
            frame_idx, (host, done) = self._pending_loss
            self._pending_loss = None
            try:
                done.synchronize()
            except RuntimeError as e:
                raise DeviceError.of(e) from None
            self.writer.add_scalar("loss", float(host), frame_idx)


def _mean_in_flight(values: list):
    """The mean of floats or tensors: a float where it can be had without waiting for a GPU,
    else (pinned host tensor, CUDA event) of a copy under way."""
    tensors = [v for v in values if isinstance(v, torch.Tensor)]
    if not tensors or tensors[0].device.type != "cuda":
        return float(np.mean([float(v) for v in values]))
    stacked = torch.stack(
        [torch.as_tensor(v, dtype=torch.float32, device=tensors[0].device).reshape(()) for v in values]
    )
    host = torch.empty((), dtype=torch.float32, pin_memory=True)
    host.copy_(stacked.mean(), non_blocking=True)  # into pinned memory: the copy does not block
    done = torch.cuda.Event()
    done.record()
    return host, done

"""Stage 05's trick: the new OpenCV wrapper set.

raw env -> NoopReset -> MaxAndSkip (fixed two-frame uint8 buffer) -> EpisodicLife ->
FireReset -> WarpFrame (cv2 grey, 84x84 INTER_AREA) -> ClipReward -> FrameStack.
Its frames are 2-D (84, 84), so the stack is channels first as built; the learner sees the same
uint8 (4, 84, 84) observations as from the old set (``lib.wrappers``), which also builds this set
(``make_env(env_name, new_wrappers=True)``).
"""

from __future__ import annotations

import cv2
import gymnasium as gym
import numpy as np

from lib.params import FRAME_SHAPE, STACK
from lib.wrappers import ClipReward, EpisodicLife, FireReset, NoopReset


class MaxAndSkip(gym.Wrapper):
    """New version: repeat the action ``skip`` times, sum rewards, max over the last two
    raw frames held in a fixed (2, H, W, C) uint8 buffer.

    Unlike the 2018 original, a game that ends before the step's last frame maxes only the
    frames of this step (the original maxed with a frame left over from an earlier step).
    """

    def __init__(self, env, skip: int = 4):
        super().__init__(env)
        self._obs_buffer = np.zeros((2,) + env.observation_space.shape, dtype=np.uint8)
        self._skip = skip

    def step(self, action):
        total_reward = 0.0
        terminated = truncated = False
        info = {}
        seen = 0
        for i in range(self._skip):
            obs, reward, terminated, truncated, info = self.env.step(action)
            self._obs_buffer[i % 2] = obs
            seen += 1
            total_reward += reward
            if terminated or truncated:
                break
        if seen == 1:
            return obs, total_reward, terminated, truncated, info
        max_frame = np.maximum(self._obs_buffer[0], self._obs_buffer[1])
        return max_frame, total_reward, terminated, truncated, info


def warp_frame(frame: np.ndarray) -> np.ndarray:
    """New frame processor: cv2 grey and 84x84 INTER_AREA resize on uint8; returns (84, 84)."""
    grey = cv2.cvtColor(frame, cv2.COLOR_RGB2GRAY)
    return cv2.resize(grey, (84, 84), interpolation=cv2.INTER_AREA)


class WarpFrame(gym.ObservationWrapper):
    def __init__(self, env):
        super().__init__(env)
        self.observation_space = gym.spaces.Box(0, 255, FRAME_SHAPE, dtype=np.uint8)

    def observation(self, observation):
        return warp_frame(observation)


class FrameStack(gym.Wrapper):
    """New version: the last ``k`` (84, 84) frames in a preallocated (k, 84, 84) array;
    each observation is a fresh copy. Reset repeats the first frame ``k`` times."""

    def __init__(self, env, k: int = STACK):
        super().__init__(env)
        self.k = k
        self._stack = np.zeros((k,) + env.observation_space.shape, dtype=np.uint8)
        self.observation_space = gym.spaces.Box(0, 255, self._stack.shape, dtype=np.uint8)

    def current(self):
        """The observation the last step or reset returned."""
        return self._stack.copy()

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        self._stack[:] = obs
        return self._stack.copy(), info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._stack[:-1] = self._stack[1:]
        self._stack[-1] = obs
        return self._stack.copy(), reward, terminated, truncated, info


def wrap(env: gym.Env, has_fire: bool) -> gym.Env:
    """The new set around ``env`` (the raw env with GameStats on top), in its order."""
    env = NoopReset(env, noop_max=30)
    env = MaxAndSkip(env, skip=4)
    env = EpisodicLife(env)
    if has_fire:
        env = FireReset(env)
    env = WarpFrame(env)
    env = ClipReward(env)
    return FrameStack(env, STACK)

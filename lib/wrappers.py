"""Atari wrappers on the gymnasium 1.x API, in the two sets the stages use.

``make_env(env_name)`` builds the **old set** (stages 01-04), in the 2017 order:
raw env -> EpisodicLife -> NoopReset -> MaxAndSkip (deque of frames, stacked, max) ->
FireReset -> ProcessFrame84 (float32 luminance, resize to 84x110, crop rows 18..102) ->
channels first -> FrameStack (lazy) -> ClipReward.

``make_env(env_name, new_wrappers=True)`` builds the **new OpenCV set** (stage 05+), whose
own wrappers are in ``lib.wrappers_new``; stages 07-08 play ale-py's native vector env
(``lib.vector_env``).

Both sets put ``GameStats`` on the raw env, below the life and clip wrappers: it reports the
real, unclipped score of a finished *game* in ``info["game_return"]``, which is what the
reward tracker and the stop rule use (a lost life ends only the learner's episode).
The learner sees uint8 observations of shape (4, 84, 84) from both.
"""

from __future__ import annotations

import collections

import ale_py
import cv2
import gymnasium as gym
import numpy as np

from lib.params import STACK

gym.register_envs(ale_py)
# No start-up banner on stderr: error output stays one line, and the logs stay readable.
ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)

# cv2 may start its own thread pool per process; the stages size their threads themselves.
cv2.setNumThreads(1)


class GameStats(gym.Wrapper):
    """Adds ``info["game_return"]`` and ``info["game_steps"]`` when the real game ends."""

    def __init__(self, env):
        super().__init__(env)
        self._return = 0.0
        self._steps = 0

    def reset(self, **kwargs):
        self._return = 0.0
        self._steps = 0
        return self.env.reset(**kwargs)

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._return += float(reward)
        self._steps += 1
        if terminated or truncated:
            info = dict(info, game_return=self._return, game_steps=self._steps)
        return obs, reward, terminated, truncated, info


class EpisodicLife(gym.Wrapper):
    """A lost life ends the learner's episode; the emulator resets only at game over."""

    def __init__(self, env):
        super().__init__(env)
        self.lives = 0
        self.was_real_done = True

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.was_real_done = terminated or truncated
        lives = self.env.unwrapped.ale.lives()
        if 0 < lives < self.lives:
            terminated = True
        self.lives = lives
        return obs, reward, terminated, truncated, info

    def reset(self, **kwargs):
        if self.was_real_done:
            obs, info = self.env.reset(**kwargs)
        else:
            # No-op step to leave the life-lost state; the game goes on.
            obs, _, terminated, truncated, info = self.env.step(0)
            if terminated or truncated:
                obs, info = self.env.reset(**kwargs)
        self.lives = self.env.unwrapped.ale.lives()
        return obs, info


class NoopReset(gym.Wrapper):
    """After reset, a random number (1..noop_max) of no-op actions."""

    def __init__(self, env, noop_max: int = 30):
        super().__init__(env)
        self.noop_max = noop_max
        assert env.unwrapped.get_action_meanings()[0] == "NOOP"

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        noops = int(self.unwrapped.np_random.integers(1, self.noop_max + 1))
        for _ in range(noops):
            obs, _, terminated, truncated, info = self.env.step(0)
            if terminated or truncated:
                obs, info = self.env.reset()
        return obs, info


class MaxAndSkipDeque(gym.Wrapper):
    """Old version: repeat the action ``skip`` times, sum rewards, max over the last two
    frames kept in a deque that is stacked at every step."""

    def __init__(self, env, skip: int = 4):
        super().__init__(env)
        self._obs_buffer = collections.deque(maxlen=2)
        self._skip = skip

    def step(self, action):
        total_reward = 0.0
        terminated = truncated = False
        info = {}
        for _ in range(self._skip):
            obs, reward, terminated, truncated, info = self.env.step(action)
            self._obs_buffer.append(obs)
            total_reward += reward
            if terminated or truncated:
                break
        max_frame = np.max(np.stack(self._obs_buffer), axis=0)
        return max_frame, total_reward, terminated, truncated, info

    def reset(self, **kwargs):
        self._obs_buffer.clear()
        obs, info = self.env.reset(**kwargs)
        self._obs_buffer.append(obs)
        return obs, info


class FireReset(gym.Wrapper):
    """Press FIRE (and then action 2) after reset, for games that wait for it."""

    def __init__(self, env):
        super().__init__(env)
        meanings = env.unwrapped.get_action_meanings()
        assert meanings[1] == "FIRE" and len(meanings) >= 3

    def reset(self, **kwargs):
        self.env.reset(**kwargs)
        obs, _, terminated, truncated, info = self.env.step(1)
        if terminated or truncated:
            self.env.reset(**kwargs)
        obs, _, terminated, truncated, info = self.env.step(2)
        if terminated or truncated:
            obs, info = self.env.reset(**kwargs)
        return obs, info


def process_frame84(frame: np.ndarray) -> np.ndarray:
    """Old frame processor: float32 luminance, resize to 84 wide x 110 high, crop rows
    18..102; returns (84, 84, 1) uint8."""
    img = frame.astype(np.float32)
    img = img[:, :, 0] * 0.299 + img[:, :, 1] * 0.587 + img[:, :, 2] * 0.114
    resized = cv2.resize(img, (84, 110), interpolation=cv2.INTER_AREA)
    x_t = resized[18:102, :]
    return np.reshape(x_t, [84, 84, 1]).astype(np.uint8)


class ProcessFrame84(gym.ObservationWrapper):
    def __init__(self, env):
        super().__init__(env)
        self.observation_space = gym.spaces.Box(0, 255, (84, 84, 1), dtype=np.uint8)

    def observation(self, observation):
        return process_frame84(observation)


class ImageToPyTorch(gym.ObservationWrapper):
    """HWC -> CHW."""

    def __init__(self, env):
        super().__init__(env)
        h, w, c = env.observation_space.shape
        self.observation_space = gym.spaces.Box(0, 255, (c, h, w), dtype=np.uint8)

    def observation(self, observation):
        return np.moveaxis(observation, 2, 0)


class LazyFrames:
    """The old FrameStack's observation: references to the last frames, concatenated along
    the channel axis only when converted with ``np.asarray``."""

    __slots__ = ("_frames",)

    def __init__(self, frames):
        self._frames = frames

    def __array__(self, dtype=None, copy=None):
        out = np.concatenate(self._frames, axis=0)
        return out if dtype is None else out.astype(dtype)

    def __len__(self):
        return len(self._frames)

    def __getitem__(self, i):
        return self._frames[i][0]


class FrameStackLazy(gym.Wrapper):
    """Old version: a deque of the last ``k`` (1, 84, 84) frames, returned as LazyFrames."""

    def current(self):
        """The observation the last step or reset returned."""
        return LazyFrames(list(self.frames))

    def __init__(self, env, k: int = STACK):
        super().__init__(env)
        self.k = k
        self.frames = collections.deque(maxlen=k)
        c, h, w = env.observation_space.shape
        self.observation_space = gym.spaces.Box(0, 255, (c * k, h, w), dtype=np.uint8)

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        for _ in range(self.k):
            self.frames.append(obs)
        return LazyFrames(list(self.frames)), info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.frames.append(obs)
        return LazyFrames(list(self.frames)), reward, terminated, truncated, info


class ClipReward(gym.RewardWrapper):
    """The sign of the reward: -1, 0 or +1."""

    def reward(self, reward):
        return float(np.sign(reward))


def make_raw_env(env_name: str, render_mode: str | None = None) -> gym.Env:
    """The emulator env with GameStats on top (raises gymnasium's error for unknown ids)."""
    return GameStats(gym.make(env_name, render_mode=render_mode))


def make_env(env_name: str, new_wrappers: bool = False, render_mode: str | None = None) -> gym.Env:
    """Build the old (default) or the new OpenCV wrapper set around ``env_name``."""
    env = make_raw_env(env_name, render_mode)
    has_fire = env.unwrapped.get_action_meanings()[1:2] == ["FIRE"]
    if not new_wrappers:
        env = EpisodicLife(env)
        env = NoopReset(env, noop_max=30)
        env = MaxAndSkipDeque(env, skip=4)
        if has_fire:
            env = FireReset(env)
        env = ProcessFrame84(env)
        env = ImageToPyTorch(env)
        env = FrameStackLazy(env, STACK)
        return ClipReward(env)
    from lib import wrappers_new  # stage 05's set, in a module of its own

    return wrappers_new.wrap(env, has_fire)

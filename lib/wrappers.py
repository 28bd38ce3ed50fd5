"""Atari wrappers on the gymnasium 1.x API, in the two sets the stages use.

``make_env(env_name)`` builds the **old set** (stages 01-04), in the 2017 order:
raw env -> EpisodicLife -> NoopReset -> MaxAndSkip (deque of frames, stacked, max) ->
FireReset -> ProcessFrame84 (float32 luminance, resize to 84x110, crop rows 18..102) ->
channels first -> FrameStack (lazy) -> ClipReward.

``make_vector_env(env_name, num_envs)`` builds ale-py's native vector env, which does like
steps in C++ but not all in the same order (stages 07-08; their docstrings and docs/ledger.md,
the ledger, list how its preprocessing differs).

``make_env(env_name, new_wrappers=True)`` builds the **new OpenCV set** (stage 05+):
raw env -> NoopReset -> MaxAndSkip (fixed two-frame uint8 buffer) -> EpisodicLife ->
FireReset -> WarpFrame (cv2 grey, 84x84 INTER_AREA) -> ClipReward -> FrameStack.
Its frames are 2-D (84, 84), so the stack is channels first as built.

Both sets put ``GameStats`` on the raw env, below the life and clip wrappers: it reports the
real, unclipped score of a finished *game* in ``info["game_return"]``, which is what the
reward tracker and the stop rule use (a lost life ends only the learner's episode).
The learner sees uint8 observations of shape (4, 84, 84) from both.
"""

from __future__ import annotations

import collections
import re

import ale_py
import cv2
import gymnasium as gym
import numpy as np

from lib.params import FRAME_SHAPE, STACK

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


def warp_frame(frame: np.ndarray) -> np.ndarray:
    """New frame processor: cv2 grey and 84x84 INTER_AREA resize on uint8; returns (84, 84)."""
    grey = cv2.cvtColor(frame, cv2.COLOR_RGB2GRAY)
    return cv2.resize(grey, (84, 84), interpolation=cv2.INTER_AREA)


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


class WarpFrame(gym.ObservationWrapper):
    def __init__(self, env):
        super().__init__(env)
        self.observation_space = gym.spaces.Box(0, 255, FRAME_SHAPE, dtype=np.uint8)

    def observation(self, observation):
        return warp_frame(observation)


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
    env = NoopReset(env, noop_max=30)
    env = MaxAndSkip(env, skip=4)
    env = EpisodicLife(env)
    if has_fire:
        env = FireReset(env)
    env = WarpFrame(env)
    env = ClipReward(env)
    return FrameStack(env, STACK)


def rom_name(env_name: str) -> str:
    """ALE ROM name of a gymnasium Atari id: "PongNoFrameskip-v4" -> "pong",
    "ALE/SpaceInvaders-v5" -> "space_invaders"."""
    name = env_name.split("/")[-1]
    name = re.sub(r"-v\d+$", "", name)
    name = re.sub(r"(NoFrameskip|Deterministic)$", "", name)
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def make_vector_env(env_name: str, num_envs: int, threads: int = 0, life_loss_info: bool = True):
    """ale-py's AtariVectorEnv over ``num_envs`` games, preprocessed in C++. Reset: FIRE for one
    frame, then 0..28 no-ops (``noop_max=30`` draws d in 0..29 and plays d - 1); the first
    observation is that frame alone, not maxed, above three zero frames. Step: the action for 4
    frames, the max of the last two frames' grey screens, resized to 84x84 (INTER_AREA), pushed
    onto a stack of 4; a step that ends the game or reaches the cap of 108,000 frames (counted
    from the end of the reset) stops before it reads that frame. Autoreset on the step after a
    game ends (NextStep). Rewards stay unclipped so the real score can be reported.
    ``life_loss_info``: a lost life sets ``terminated`` while the game goes on (the vector env's
    own episodic-life mode would reset the whole game at every lost life)."""
    from ale_py.vector_env import AtariVectorEnv

    return AtariVectorEnv(
        rom_name(env_name),
        num_envs=num_envs,
        num_threads=threads,
        frameskip=4,
        maxpool=True,
        stack_num=4,
        noop_max=30,
        use_fire_reset=True,
        episodic_life=False,
        life_loss_info=life_loss_info,
        reward_clipping=False,
        autoreset_mode="NextStep",
    )


# -- the game in progress, for checkpoints that resume exactly ---------------------------------


def _layers(env):
    """The wrappers of ``env`` from the outermost in, the raw env excluded."""
    while env is not env.unwrapped:
        yield env
        env = env.env


def env_state(env) -> dict:
    """Everything that decides what ``env`` does next, as tensors and numbers (no pickled
    objects): ALE's emulator state with its RNG, the raw env's and the action space's RNGs,
    and each wrapper's counters, flags and frame buffers."""
    import torch

    layers = []
    for layer in _layers(env):
        state = {}
        for name, value in vars(layer).items():
            if isinstance(value, (bool, int, float)):
                state[name] = value
            elif isinstance(value, np.ndarray):
                state[name] = torch.from_numpy(value.copy())
            elif isinstance(value, collections.deque):
                state[name] = {"deque": [torch.from_numpy(np.array(x)) for x in value]}
        layers.append(state)
    raw = env.unwrapped
    ale = raw.ale.cloneState(include_rng=True).serialize()
    return {
        "layers": layers,
        "ale": torch.frombuffer(bytearray(ale), dtype=torch.uint8),
        "np_random": raw.np_random.bit_generator.state,
        "action_space": env.action_space.np_random.bit_generator.state,
    }


def restore_env(env, state: dict):
    """Put ``env`` (built as the saved one was) back into ``state``; returns the observation
    that its last step or reset returned."""
    layers = list(_layers(env))
    if len(layers) != len(state["layers"]):
        raise ValueError("the saved game was played with another wrapper set")
    for layer, saved in zip(layers, state["layers"]):
        for name, value in saved.items():
            if isinstance(value, dict) and "deque" in value:
                current = getattr(layer, name)
                current.clear()
                current.extend(v.numpy() for v in value["deque"])
            elif hasattr(value, "numpy"):
                getattr(layer, name)[...] = value.numpy()
            else:
                setattr(layer, name, value)
    raw = env.unwrapped
    raw.ale.restoreState(ale_py.ALEState(bytes(state["ale"].numpy().tobytes())))
    raw.np_random.bit_generator.state = state["np_random"]
    env.action_space.np_random.bit_generator.state = state["action_space"]
    stack = next(layer for layer in layers if isinstance(layer, (FrameStack, FrameStackLazy)))
    return stack.current()

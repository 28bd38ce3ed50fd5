"""A real Pong whose emulator raises after a fixed number of raw frames: the scripted crash
that the play-process tests need. Use as ``--env tests.support.crashenv:CrashingPong-v0``."""

import gymnasium as gym
from ale_py.env import AtariEnv

CRASH_AFTER_RAW_FRAMES = 2_000


class CrashingPong(AtariEnv):
    def __init__(self, **kwargs):
        super().__init__(game="pong", frameskip=1, repeat_action_probability=0.0, **kwargs)
        self._raw_frames = 0

    def step(self, action, *args, **kwargs):
        self._raw_frames += 1
        if self._raw_frames > CRASH_AFTER_RAW_FRAMES:
            raise RuntimeError("scripted emulator crash")
        return super().step(action, *args, **kwargs)


gym.register("CrashingPong-v0", entry_point=CrashingPong)

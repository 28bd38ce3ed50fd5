"""A synthetic image task that quacks like an ALE game, for the learning tests.

Each game shows a white block on the left or the right of a 210x160 RGB frame; every raw
frame pays +1 for the matching direction, -1 for the other, 0 for NOOP/FIRE. A game lasts
120 raw frames, of which up to 32 go to the no-op and fire resets, so a random policy scores
about 0 a game and the best one 88 to 117. It has action meanings with FIRE and ``ale.lives()``
so that the real wrapper sets run on it unchanged. Registered as ``SideTarget-v0`` on import.
"""

import gymnasium as gym
import numpy as np

from lib.params import Hyperparams

RAW_FRAMES_PER_GAME = 120


class _Ale:
    def lives(self):
        return 0


class SideTargetEnv(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self, render_mode=None):
        self.observation_space = gym.spaces.Box(0, 255, (210, 160, 3), dtype=np.uint8)
        self.action_space = gym.spaces.Discrete(4)
        self.ale = _Ale()
        self._frames = []
        for side in (0, 1):
            frame = np.zeros((210, 160, 3), dtype=np.uint8)
            frame[80:130, 10 + side * 100 : 50 + side * 100] = 255
            self._frames.append(frame)
        self.side = 0
        self.t = 0

    def get_action_meanings(self):
        return ["NOOP", "FIRE", "RIGHT", "LEFT"]

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.side = int(self.np_random.integers(2))
        self.t = 0
        return self._frames[self.side].copy(), {}

    def step(self, action):
        self.t += 1
        wanted = 2 if self.side == 1 else 3  # RIGHT for a block on the right
        reward = 1.0 if action == wanted else (-1.0 if action in (2, 3) else 0.0)
        terminated = self.t >= RAW_FRAMES_PER_GAME
        return self._frames[self.side].copy(), reward, terminated, False, {}


# The article's learning rate, gamma and batch; a small buffer and a short epsilon ramp so
# that the task fits in well under a minute on a 2-core CPU.
PARAMS = Hyperparams(
    env_name="tests.support.sidetarget:SideTarget-v0",  # gym.make imports this module, in any process
    stop_reward=1e9,
    replay_size=5_000,
    replay_initial=300,
    target_net_sync=200,
    epsilon_frames=600,
)

if "SideTarget-v0" not in gym.registry:
    gym.register("SideTarget-v0", entry_point=SideTargetEnv)

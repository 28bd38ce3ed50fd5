"""The stage-01 training loop learns: a small synthetic image task, solved within a minute.

The env quacks like an ALE game (210x160 RGB frames, action meanings with FIRE, lives), so it
goes through the real old wrapper set (no-op reset, skip-and-max, fire reset, ProcessFrame84,
stack, clip) and through ``01_dqn_basic.py``'s own ``main``. Each game shows a white block on
the left or the right; every raw frame pays +1 for the matching direction, -1 for the other,
0 for NOOP/FIRE. A game lasts 120 raw frames, of which up to 32 go to the no-op and fire
resets, so a random policy scores about 0 a game and the best one 88 to 117.
"""

import importlib.util
import json
import pathlib
import sys

import gymnasium as gym
import numpy as np
import pytest

import lib.wrappers  # noqa: F401  (ALE registration)
from lib.params import GAMES, Hyperparams

ROOT = pathlib.Path(__file__).resolve().parent.parent
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


def _load_stage(name):
    spec = importlib.util.spec_from_file_location(name.replace(".py", "").replace("0", "s0", 1), ROOT / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _rewards(run_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (folder,) = [p for p in pathlib.Path(run_dir).iterdir() if p.is_dir()]
    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    acc.Reload()
    return [e.value for e in acc.Scalars("reward")], json.loads((folder / "summary.json").read_text())


def test_stage01_learns_synthetic_task(tmp_path, monkeypatch):
    gym.register("SideTarget-v0", entry_point=SideTargetEnv)
    # The article's learning rate, gamma and batch; a small buffer and a short epsilon ramp so
    # that the task fits in a minute on a 2-core CPU.
    params = Hyperparams(
        env_name="SideTarget-v0",
        stop_reward=1e9,
        replay_size=5_000,
        replay_initial=300,
        target_net_sync=200,
        epsilon_frames=600,
    )
    monkeypatch.setitem(GAMES, "synthetic", params)
    stage = _load_stage("01_dqn_basic.py")
    argv = ["01_dqn_basic.py", "--game", "synthetic", "--max-frames", "1300", "--run-dir", str(tmp_path), "--quiet"]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as exit_info:
        stage.main()
    assert exit_info.value.code == 0
    rewards, summary = _rewards(tmp_path)
    assert summary["frames"] == 1300
    # Early games (epsilon near 1) score about 0; the last ten must be close to the best
    # (a run of this test scored a mean of 90 over its last ten games).
    assert abs(np.mean(rewards[:5])) < 30
    assert np.mean(rewards[-10:]) >= 70, rewards

"""Tests for lib.wrappers: the old (2017) and new (OpenCV) Atari wrapper sets.

What could silently break learning: wrapper order, frame skip and max-pool, life loss, reward
clipping, FIRE and no-ops at reset, the frame processors and the frame stack. The real emulator
is used wherever it can show the behaviour; a scripted env only where a test needs exact control.
"""

from __future__ import annotations

import hashlib

import gymnasium as gym
import numpy as np
import pytest

import lib.wrappers as W  # also registers the ALE envs
import lib.wrappers_new as WN

PONG = "PongNoFrameskip-v4"
BREAKOUT = "BreakoutNoFrameskip-v4"
SETS = [pytest.param(False, id="old"), pytest.param(True, id="new")]


# --- helpers -------------------------------------------------------------------------------


class Recorder(gym.Wrapper):
    """Passes everything through and records, since the last reset it saw, each step's action
    and reward, and its observation if ``keep_frames``."""

    def __init__(self, env, keep_frames: bool = False):
        super().__init__(env)
        self.keep_frames = keep_frames
        self.resets = 0
        self.actions, self.frames, self.rewards = [], [], []

    def reset(self, **kwargs):
        self.resets += 1
        self.actions, self.frames, self.rewards = [], [], []
        return self.env.reset(**kwargs)

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.actions.append(int(action))
        if self.keep_frames:
            self.frames.append(np.array(obs, copy=True))
        self.rewards.append(float(reward))
        return obs, reward, terminated, truncated, info


def chain(env) -> list:
    """The wrappers of ``env``, outermost first."""
    out = []
    while isinstance(env, gym.Wrapper):
        out.append(env)
        env = env.env
    return out


def find(env, cls):
    return next(w for w in chain(env) if type(w) is cls)


def insert_below(env, cls) -> Recorder:
    """Put a Recorder between the wrapper of type ``cls`` in ``env`` and what it wraps."""
    wrapper = find(env, cls)
    wrapper.env = Recorder(wrapper.env)
    return wrapper.env


def insert_above(env, cls) -> Recorder:
    """Put a Recorder right on top of the wrapper of type ``cls`` in ``env``."""
    parent = next(w for w in chain(env) if type(w.env) is cls)
    parent.env = Recorder(parent.env)
    return parent.env


def scripted_frame(t: int, shape) -> np.ndarray:
    """Frame ``t`` of the scripted env. RGB: channel 0 rises (10 t), channel 1 falls (200 - 10 t),
    channel 2 is t, so that the max of two frames equals neither. Grey: every pixel is t."""
    frame = np.empty(shape, dtype=np.uint8)
    if len(shape) == 3 and shape[-1] == 3:
        frame[..., 0] = (10 * t) % 256
        frame[..., 1] = (200 - 10 * t) % 256
        frame[..., 2] = t % 256
    else:
        frame[...] = t % 256
    return frame


class FakeALE:
    def __init__(self, env):
        self._env = env

    def lives(self) -> int:
        return self._env.lives

    def getEpisodeFrameNumber(self) -> int:
        return self._env.t


class ScriptedEnv(gym.Env):
    """A stand-in for the emulator with a scripted course: the reward of step t is
    ``rewards[t - 1]`` (0 after), a life is lost at each step in ``lose_life_at``, the game ends
    at step ``end_at`` or when the lives run out, and is truncated at ``truncate_at``."""

    metadata = {"render_modes": []}

    def __init__(
        self,
        rewards=(),
        end_at=None,
        lose_life_at=(),
        lives=3,
        truncate_at=None,
        meanings=("NOOP", "FIRE", "RIGHT", "LEFT"),
        shape=(210, 160, 3),
    ):
        self.observation_space = gym.spaces.Box(0, 255, shape, dtype=np.uint8)
        self.action_space = gym.spaces.Discrete(len(meanings))
        self.meanings = list(meanings)
        self.script_rewards = list(rewards)
        self.end_at = end_at
        self.lose_life_at = set(lose_life_at)
        self.start_lives = lives
        self.truncate_at = truncate_at
        self.ale = FakeALE(self)
        self.resets = 0
        self.t = 0
        self.lives = lives

    def get_action_meanings(self):
        return self.meanings

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.resets += 1
        self.t = 0
        self.lives = self.start_lives
        return scripted_frame(0, self.observation_space.shape), {}

    def step(self, action):
        self.t += 1
        if self.t in self.lose_life_at:
            self.lives -= 1
        reward = self.script_rewards[self.t - 1] if self.t <= len(self.script_rewards) else 0.0
        terminated = self.lives == 0 or (self.end_at is not None and self.t >= self.end_at)
        truncated = self.truncate_at is not None and self.t >= self.truncate_at
        return scripted_frame(self.t, self.observation_space.shape), reward, terminated, truncated, {}


# --- wrapper order -------------------------------------------------------------------------


def test_old_set_order_is_the_2017_order():
    env = W.make_env(PONG, new_wrappers=False)
    names = [type(w).__name__ for w in chain(env)]
    assert names[: names.index("GameStats") + 1] == [
        "ClipReward",
        "FrameStackLazy",
        "ImageToPyTorch",
        "ProcessFrame84",
        "FireReset",
        "MaxAndSkipDeque",
        "NoopReset",
        "EpisodicLife",
        "GameStats",
    ]
    assert find(env, W.NoopReset).noop_max == 30
    assert find(env, W.MaxAndSkipDeque)._skip == 4
    assert find(env, W.FrameStackLazy).k == 4


def test_new_set_order():
    env = W.make_env(PONG, new_wrappers=True)
    names = [type(w).__name__ for w in chain(env)]
    assert names[: names.index("GameStats") + 1] == [
        "FrameStack",
        "ClipReward",
        "WarpFrame",
        "FireReset",
        "EpisodicLife",
        "MaxAndSkip",
        "NoopReset",
        "GameStats",
    ]
    assert find(env, W.NoopReset).noop_max == 30
    assert find(env, WN.MaxAndSkip)._skip == 4
    assert find(env, WN.FrameStack).k == 4


# --- shapes and dtypes ---------------------------------------------------------------------


@pytest.mark.parametrize("new_wrappers", SETS)
@pytest.mark.parametrize("env_name", [PONG, BREAKOUT])
def test_observations_are_uint8_4x84x84(env_name, new_wrappers):
    env = W.make_env(env_name, new_wrappers=new_wrappers)
    assert env.observation_space.shape == (4, 84, 84)
    assert env.observation_space.dtype == np.uint8
    obs, _ = env.reset(seed=0)
    for _ in range(3):
        arr = np.asarray(obs)  # LazyFrames in the old set
        assert arr.shape == (4, 84, 84)
        assert arr.dtype == np.uint8
        obs, *_ = env.step(0)


# --- frame skip: the emulator's own counter ------------------------------------------------


@pytest.mark.parametrize("new_wrappers", SETS)
def test_each_agent_step_advances_the_emulator_4_frames(new_wrappers):
    env = W.make_env(PONG, new_wrappers=new_wrappers)
    env.action_space.seed(0)
    env.reset(seed=0)
    ale = env.unwrapped.ale
    for _ in range(50):
        before_episode, before_total = ale.getEpisodeFrameNumber(), ale.getFrameNumber()
        _, _, terminated, truncated, _ = env.step(env.action_space.sample())
        assert not (terminated or truncated)  # Pong does not end in 50 agent steps
        assert ale.getEpisodeFrameNumber() - before_episode == 4
        assert ale.getFrameNumber() - before_total == 4


# --- max over the last two raw frames, rewards summed --------------------------------------


@pytest.mark.parametrize("skip_cls", [W.MaxAndSkipDeque, WN.MaxAndSkip])
def test_max_and_skip_on_the_emulator(skip_cls):
    raw = Recorder(gym.make(PONG), keep_frames=True)
    env = skip_cls(raw, skip=4)
    env.action_space.seed(0)
    env.reset(seed=0)
    max_differs_from_last = 0
    nonzero_rewards = 0
    for _ in range(400):
        seen = len(raw.frames)
        obs, reward, terminated, truncated, _ = env.step(env.action_space.sample())
        assert not (terminated or truncated)
        assert len(raw.frames) == seen + 4
        np.testing.assert_array_equal(obs, np.maximum(raw.frames[-2], raw.frames[-1]))
        assert reward == sum(raw.rewards[-4:])
        max_differs_from_last += not np.array_equal(obs, raw.frames[-1])
        nonzero_rewards += reward != 0
        if nonzero_rewards >= 2 and max_differs_from_last >= 10:
            break
    # The checks above meant something: the two frames differed, and points were scored.
    assert max_differs_from_last >= 10
    assert nonzero_rewards >= 2


@pytest.mark.parametrize("skip_cls", [W.MaxAndSkipDeque, WN.MaxAndSkip])
def test_max_and_skip_exact_on_a_scripted_env(skip_cls):
    env = skip_cls(ScriptedEnv(rewards=[1, 2, 4, 8, 16, 32, 64, 128]), skip=4)
    env.reset()
    obs, reward, terminated, truncated, _ = env.step(0)
    # Frames 1..4 of the step; the last two are
    #   frame 3: channels (30, 170, 3)    frame 4: channels (40, 160, 4)
    # so their max is (40, 170, 4), which is neither frame.
    assert (obs[..., 0] == 40).all() and (obs[..., 1] == 170).all() and (obs[..., 2] == 4).all()
    assert reward == 1 + 2 + 4 + 8
    obs, reward, *_ = env.step(0)  # frames 5..8: max (80, 130, 8)
    assert (obs[..., 0] == 80).all() and (obs[..., 1] == 130).all() and (obs[..., 2] == 8).all()
    assert reward == 16 + 32 + 64 + 128


def test_max_and_skip_game_end_mid_step_uses_this_steps_frames():
    # The game ends on the 3rd frame of the 2nd step (step 7 overall): max of frames 6 and 7,
    # rewards of frames 5..7 only.
    env = WN.MaxAndSkip(ScriptedEnv(rewards=[1, 2, 4, 8, 16, 32, 64, 128], end_at=7), skip=4)
    env.reset()
    env.step(0)
    obs, reward, terminated, _, _ = env.step(0)
    assert terminated
    # frame 6: (60, 140, 6), frame 7: (70, 130, 7) -> max (70, 140, 7)
    assert (obs[..., 0] == 70).all() and (obs[..., 1] == 140).all() and (obs[..., 2] == 7).all()
    assert reward == 16 + 32 + 64
    # The game ends on the 1st frame of a step: that frame alone, not a stale one.
    env = WN.MaxAndSkip(ScriptedEnv(end_at=5), skip=4)
    env.reset()
    env.step(0)
    obs, _, terminated, _, _ = env.step(0)
    assert terminated
    np.testing.assert_array_equal(obs, scripted_frame(5, obs.shape))


# --- reward clipping -----------------------------------------------------------------------


def test_clip_reward_returns_the_sign():
    env = W.ClipReward(ScriptedEnv(rewards=[5, -3, 0, 0.25, -0.5]))
    env.reset()
    rewards = [env.step(0)[1] for _ in range(5)]
    assert rewards == [1.0, -1.0, 0.0, 1.0, -1.0]
    assert all(type(r) is float for r in rewards)


# --- life loss -----------------------------------------------------------------------------


@pytest.mark.parametrize("new_wrappers", SETS)
def test_life_loss_ends_the_learners_episode_not_the_game(new_wrappers):
    env = W.make_env(BREAKOUT, new_wrappers=new_wrappers)
    fire = insert_below(env, W.FireReset)
    game = insert_above(env, W.GameStats)  # sees the unclipped rewards the game counts
    ale = env.unwrapped.ale
    env.action_space.seed(0)
    env.reset(seed=0)
    assert ale.lives() == 5
    lives_lost = games_over = 0
    for _ in range(3000):
        _, _, terminated, truncated, info = env.step(env.action_space.sample())
        assert not truncated
        if not terminated:
            assert "game_return" not in info
            continue
        if ale.lives() > 0:
            # A life lost: the learner's episode ends, the game goes on.
            lives_lost += 1
            assert "game_return" not in info
            lives, episode_frame, total_frame = ale.lives(), ale.getEpisodeFrameNumber(), ale.getFrameNumber()
            resets_before = game.resets
            env.reset()
            assert game.resets == resets_before  # no real reset below EpisodicLife
            assert ale.lives() == lives
            assert ale.getEpisodeFrameNumber() > episode_frame  # not back to 0
            assert ale.getFrameNumber() > total_frame
            assert fire.actions == [1, 2]  # FIRE again, to serve the next ball
            continue
        # Game over: the real score of the whole game, then a real reset.
        games_over += 1
        assert info["game_return"] == sum(game.rewards)
        assert info["game_steps"] == len(game.rewards)
        env.reset()
        assert ale.lives() == 5
        assert ale.getEpisodeFrameNumber() <= 30 + 2 * 4  # only no-ops and FIRE since the reset
        break
    assert lives_lost == 4
    assert games_over == 1


def test_episodic_life_edge_cases():
    # Life lost at step 2: terminated for the learner; reset takes one no-op step, no real reset.
    raw = ScriptedEnv(lose_life_at=[2], lives=3)
    env = W.EpisodicLife(raw)
    env.reset()
    assert env.step(0)[2] is False
    assert env.step(0)[2] is True
    env.reset()
    assert raw.resets == 1 and raw.t == 3 and env.lives == 2

    # The last life lost is the real game over: reset resets the game.
    raw = ScriptedEnv(lose_life_at=[1, 3], lives=2)
    env = W.EpisodicLife(raw)
    env.reset()
    assert env.step(0)[2] is True
    env.reset()
    assert raw.resets == 1
    assert env.step(0)[2] is True and raw.lives == 0
    env.reset()
    assert raw.resets == 2 and raw.lives == 2

    # Truncation (time limit) is a real end too.
    raw = ScriptedEnv(truncate_at=2)
    env = W.EpisodicLife(raw)
    env.reset()
    env.step(0)
    assert env.step(0)[3] is True
    env.reset()
    assert raw.resets == 2

    # If the no-op step taken at reset after a life loss ends the game, the game is reset.
    raw = ScriptedEnv(lose_life_at=[1], end_at=2, lives=3)
    env = W.EpisodicLife(raw)
    env.reset()
    assert env.step(0)[2] is True
    env.reset()
    assert raw.resets == 2 and raw.t == 0


def test_game_stats_reports_only_at_game_end():
    env = W.GameStats(ScriptedEnv(rewards=[1, 0, 5, -2], end_at=4))
    env.reset()
    infos = [env.step(0)[4] for _ in range(4)]
    assert all("game_return" not in info for info in infos[:3])
    assert infos[3]["game_return"] == 4.0 and infos[3]["game_steps"] == 4
    env.reset()
    info = [env.step(0)[4] for _ in range(4)][-1]
    assert info["game_return"] == 4.0  # counted afresh after the reset


# --- FIRE at reset -------------------------------------------------------------------------


@pytest.mark.parametrize("new_wrappers", SETS)
@pytest.mark.parametrize("env_name", [PONG, BREAKOUT])
def test_fire_pressed_at_reset(env_name, new_wrappers):
    env = W.make_env(env_name, new_wrappers=new_wrappers)
    below = insert_below(env, W.FireReset)
    env.reset(seed=0)
    assert below.resets == 1
    assert below.actions == [1, 2]


def test_fire_reset_on_a_scripted_env():
    below = Recorder(ScriptedEnv())
    env = W.FireReset(below)
    env.reset()
    assert below.resets == 1 and below.actions == [1, 2]


def test_fire_reset_refuses_a_game_without_fire():
    with pytest.raises(AssertionError):
        W.FireReset(ScriptedEnv(meanings=("NOOP", "UP", "DOWN")))


def test_make_env_adds_fire_reset_only_for_games_with_fire(monkeypatch):
    for meanings, has_fire in [(("NOOP", "FIRE", "UP", "DOWN"), True), (("NOOP", "UP", "DOWN"), False)]:
        fake = lambda name, render_mode=None, meanings=meanings: W.GameStats(ScriptedEnv(meanings=meanings))
        monkeypatch.setattr(W, "make_raw_env", fake)
        for new_wrappers in (False, True):
            env = W.make_env("Scripted", new_wrappers=new_wrappers)
            assert any(type(w) is W.FireReset for w in chain(env)) == has_fire
            obs, _ = env.reset(seed=0)
            assert np.asarray(obs).shape == (4, 84, 84)


# --- no-ops at reset -----------------------------------------------------------------------


def test_noop_reset_takes_1_to_30_noops_and_varies():
    below = Recorder(gym.make(PONG))
    env = W.NoopReset(below, noop_max=30)
    counts = []
    for i in range(60):
        env.reset(seed=0 if i == 0 else None)
        assert set(below.actions) == {0}
        counts.append(len(below.actions))
    assert min(counts) >= 1 and max(counts) <= 30
    assert len(set(counts)) >= 10


# --- frame processors: golden outputs ------------------------------------------------------
# These hashes pin the exact pixels each processor gives. Changing the resize, the crop or the
# luminance weights changes what the network sees and so what it learns, and results would no
# longer compare with earlier runs: such a change must be deliberate, and the hashes updated
# on purpose with it. They hold for opencv-python-headless 4.10.0 and 5.0.0 and for ale-py
# 0.11.2 and 0.12.1 (each pair tried; numpy 2.4): the pyproject's ranges start at those
# versions (older opencv wheels do not load with numpy 2; ale-py 0.10's vector env lacks what
# stage 07 uses). A later release that moves a pixel fails here, as it should.


def sha256(array: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()


def fixed_rgb_frame() -> np.ndarray:
    frame = np.random.default_rng(0).integers(0, 256, size=(210, 160, 3), dtype=np.uint8)
    assert sha256(frame) == "8680516f859980c493487d3d0dd6cd877fa5855ae571a0b47c977ff6dcbf7cd6"  # the input itself
    return frame


def pong_reset_frame() -> np.ndarray:
    frame, _ = gym.make(PONG).reset(seed=0)
    assert sha256(frame) == "1fbd8cd8ae5c116044ef7bd1624f4cfa1ee28c3deec9714472ab00d7af936993"  # the emulator's frame
    return frame


def test_process_frame84_golden():
    out = W.process_frame84(fixed_rgb_frame())
    assert out.shape == (84, 84, 1) and out.dtype == np.uint8
    assert sha256(out) == "d8741dcc25235e8c15a709f2cecb4d55f9df1f0e84b72057528519bca7261861"
    out = W.process_frame84(pong_reset_frame())
    assert sha256(out) == "cfc3a372c2a5f870cb08fc531701dc95ae0b03a10e668db3fe00f7814b863397"


def test_warp_frame_golden():
    out = WN.warp_frame(fixed_rgb_frame())
    assert out.shape == (84, 84) and out.dtype == np.uint8
    assert sha256(out) == "b68698c70655a029ef3b110242e2a2ac64b3950bac6f8c469678a5c7299a4601"
    out = WN.warp_frame(pong_reset_frame())
    assert sha256(out) == "59eca6b40f57bf07024555dd18bb37610ce57e13f0e1ce876f6c0ac48cfbfa39"


# --- frame stack ---------------------------------------------------------------------------


@pytest.mark.parametrize("new_wrappers", SETS)
def test_frame_stack_on_the_emulator(new_wrappers):
    env = W.make_env(PONG, new_wrappers=new_wrappers)
    env.action_space.seed(0)
    obs0 = np.asarray(env.reset(seed=0)[0])
    kept = obs0.copy()
    for i in range(1, 4):
        assert np.array_equal(obs0[i], obs0[0])  # after reset all four frames are the same
    obs1 = np.asarray(env.step(env.action_space.sample())[0])
    obs2 = np.asarray(env.step(env.action_space.sample())[0])
    np.testing.assert_array_equal(obs1[:-1], obs0[1:])  # older frames move down by one
    np.testing.assert_array_equal(obs2[:-1], obs1[1:])
    assert not np.array_equal(obs2[-1], obs1[-1])  # ...and a new one comes in
    np.testing.assert_array_equal(obs0, kept)  # an observation is not changed by later steps


@pytest.mark.parametrize(
    "stack_cls, frame_shape", [(WN.FrameStack, (84, 84)), (W.FrameStackLazy, (1, 84, 84))], ids=["new", "old"]
)
def test_frame_stack_exact(stack_cls, frame_shape):
    env = stack_cls(ScriptedEnv(shape=frame_shape), 4)
    # Scripted frame t is all t: the stacks are, oldest first,
    #   reset: 0 0 0 0    step 1: 0 0 0 1    step 2: 0 0 1 2    ...    step 5: 2 3 4 5
    expected = [[0, 0, 0, 0], [0, 0, 0, 1], [0, 0, 1, 2], [0, 1, 2, 3], [1, 2, 3, 4], [2, 3, 4, 5]]
    observations = [np.asarray(env.reset()[0])] + [np.asarray(env.step(0)[0]) for _ in range(5)]
    for obs, values in zip(observations, expected):
        assert obs.shape == (4, 84, 84) and obs.dtype == np.uint8
        np.testing.assert_array_equal(obs, np.broadcast_to(np.array(values, np.uint8)[:, None, None], (4, 84, 84)))

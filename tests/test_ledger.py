"""The ledger of where this code differs from the 2017-2018 code (docs/ledger.md, "Deviations
from the 2017 setup"): each test pins our side of one entry, with its expectations worked out by
hand.

A change that makes one of these fail changes what the network sees or how it learns, so it
must be deliberate, and the ledger changed with it. The real emulator is used wherever
it can show the behaviour; a scripted game only where a test needs exact control of when a
game ends.
"""

from __future__ import annotations

import copy
import functools
import hashlib

import ale_py
import cv2
import gymnasium as gym
import numpy as np
import pytest
import torch
from ale_py import roms

import lib.wrappers as W  # also registers the ALE envs
import lib.wrappers_new as WN
from lib import vector_env
from lib.loss import calc_loss
from lib.model import DQN
from lib.optimizer import adam_options
from lib.params import GAMES
from lib.run.scripts import load_script
from lib.schedules import crossed, epsilon_at
from tests.conftest import run_inprocess

PONG = "PongNoFrameskip-v4"
SETS = [pytest.param(False, id="old"), pytest.param(True, id="new")]


def find(env, cls):
    """The wrapper of type ``cls`` in ``env``'s chain."""
    while type(env) is not cls:
        env = env.env
    return env


@pytest.fixture
def global_numpy_rng():
    """Tests here reseed numpy's global RNG on purpose; put it back for the tests after them."""
    state = np.random.get_state()
    yield
    np.random.set_state(state)


# --- orientation: the net sees (C, H, W) -------------------------------------------------------
# Pong's raw frame is 210 high x 160 wide: score digits in raw rows 1-20 (columns 36-47 and
# 116-127), white walls in rows 24-33 and 194-209 across the whole width, paddles 4 pixels wide
# in columns 16-19 (left) and 140-143 (right), on a brown background whose grey is
# 0.299 * 144 + 0.587 * 72 + 0.114 * 17 = 87.
# New set and vector env: the whole frame scaled to 84 x 84 (rows x 0.4, columns x 0.525):
#   score rows 0-8, in columns 19-24 and 61-66; walls fill rows 10-12 and 78-83;
#   paddles in columns 8-10 and 73-75, within the playfield rows 14-76.
# Old set: scaled to 110 rows, rows 18-101 kept (raw rows 34-194): score and top wall are cut
# away, row 83 is the top edge of the bottom wall; paddles in the same columns 8-10 and 73-75.
LEFT_PADDLE, RIGHT_PADDLE = {8, 9, 10}, {73, 74, 75}


def longest_run(mask: np.ndarray) -> int:
    best = run = 0
    for value in mask:
        run = run + 1 if value else 0
        best = max(best, run)
    return best


def pong_layout_problems(frame: np.ndarray, cropped: bool) -> list[str]:
    """What in an 84 x 84 grey Pong frame is not where (H, W) puts it; [] when all is."""
    problems = []
    background = np.bincount(frame.ravel()).argmax()
    thing = np.abs(frame.astype(int) - int(background)) > 20  # not background
    playfield = range(83) if cropped else range(14, 77)
    paddle_columns = {c for c in range(84) if longest_run(thing[playfield, c]) >= 5}
    if not (paddle_columns & LEFT_PADDLE and paddle_columns & RIGHT_PADDLE):
        problems.append(f"no paddle in columns 8-10 and 73-75: tall things in columns {sorted(paddle_columns)}")
    if paddle_columns - LEFT_PADDLE - RIGHT_PADDLE:
        problems.append(f"tall things outside the paddle columns: {sorted(paddle_columns)}")
    wide_rows = [r for r in playfield if longest_run(thing[r]) >= 5]  # the ball is at most 2 wide
    if wide_rows:
        problems.append(f"wide things in playfield rows {wide_rows}")
    if cropped:
        if not thing[83].all():
            problems.append("row 83 is not the bottom wall's edge")
    else:
        if not (frame[10:13] >= 200).all() or not (frame[78:84] >= 200).all():
            problems.append("the walls do not fill rows 10-12 and 78-83")
        score = thing[0:9]
        if score[:, 19:25].sum() < 10 or score[:, 61:67].sum() < 10 or score[:, 25:61].any():
            problems.append("the score digits are not in rows 0-8, columns 19-24 and 61-66")
    return problems


def pong_frame_after_noops(kind: str) -> np.ndarray:
    """The newest frame of the stack the net gets after reset(seed=0) and 20 NOOP agent steps."""
    if kind == "vector":
        env = vector_env.make_vector_env(PONG, 1)
        obs, _ = env.reset(seed=0)
        for _ in range(20):
            obs, *_ = env.step(np.zeros(1, dtype=np.int64))
        env.close()
        assert obs.shape == (1, 4, 84, 84)
        return obs[0, -1]
    env = W.make_env(PONG, new_wrappers=kind == "new")
    obs, _ = env.reset(seed=0)
    for _ in range(20):
        obs, *_ = env.step(0)
    obs = np.asarray(obs)
    assert obs.shape == env.observation_space.shape == (4, 84, 84)
    return obs[-1]


@pytest.mark.parametrize("kind", ["old", "new", "vector"])
def test_pong_frame_is_channels_height_width(kind):
    frame = pong_frame_after_noops(kind)
    cropped = kind == "old"
    assert np.bincount(frame.ravel()).argmax() == 87  # the background, as worked out above
    assert pong_layout_problems(frame, cropped) == []
    # The 2017-2018 image-to-PyTorch step swapped axes 2 and 0 of (H, W, 1): the net got the
    # transpose, (C, W, H), with paddles lying across and the walls standing. The check sees it.
    as_in_2017 = np.swapaxes(frame[:, :, None], 2, 0)[0]
    assert np.array_equal(as_in_2017, frame.T)
    assert pong_layout_problems(as_in_2017, cropped) != []


# --- the old set's no-op count: the env's seeded RNG, 1..30 ----------------------------------


class NoopProbe(gym.Wrapper):
    """Sits right below NoopReset: keeps a copy of the env's RNG as NoopReset finds it after the
    reset below, and records every action that passes (the no-ops, then the FIRE steps)."""

    def reset(self, **kwargs):
        out = self.env.reset(**kwargs)
        self.rng_at_draw = copy.deepcopy(self.unwrapped.np_random)
        self.actions = []
        return out

    def step(self, action):
        self.actions.append(int(action))
        return self.env.step(action)


@pytest.mark.parametrize("new_wrappers", SETS)
def test_noop_count_comes_from_the_envs_seeded_rng(new_wrappers, global_numpy_rng):
    # The count is the env RNG's next integers(1, 31), 1..30, drawn after the env's reset; the
    # 2017 old set drew np.random.randint(1, 31) from numpy's global RNG instead (the 2018 new
    # set already used the env's). So numpy's global RNG, set differently before every reset
    # here, neither decides the count nor is drawn from.
    env = W.make_env(PONG, new_wrappers=new_wrappers)
    noop = find(env, W.NoopReset)
    probe = noop.env = NoopProbe(noop.env)
    life = find(env, W.EpisodicLife)

    def reset(seed):
        life.was_real_done = True  # as after a game over: without it, reset only serves the next life
        env.reset(seed=seed)

    counts = {}
    for seed in range(20):
        np.random.seed(1000 + seed)
        before = np.random.get_state()[1].copy()
        reset(seed)
        n = probe.actions.index(1)  # no-ops until the first FIRE
        assert set(probe.actions[:n]) == {0}
        assert n == probe.rng_at_draw.integers(1, 31)
        assert 1 <= n <= 30
        np.testing.assert_array_equal(np.random.get_state()[1], before)
        counts[seed] = n
    assert len(set(counts.values())) >= 10  # it does vary with the seed
    for seed in (0, 7, 19):  # same seed, same count, whatever numpy's global RNG holds
        np.random.seed(seed)
        reset(seed)
        assert probe.actions.index(1) == counts[seed]


# --- a game that ends during the reset's no-ops or FIRE is reset again --------------------------


class FixedDraw:
    """Stands in for the env's RNG: every ``integers(low, high)`` returns ``value``, and is recorded."""

    def __init__(self, value: int):
        self.value = value
        self.calls = []

    def integers(self, low, high):
        self.calls.append((low, high))
        return self.value


class ScriptedGame(gym.Env):
    """A stand-in for the emulator with a fixed course. Game g (0 at the first reset) ends at its
    step ``ends[g]`` (never past the list); lives drop at the steps in ``lose_life_at`` (a game
    with lives also ends when they run out); step t pays ``rewards.get(t, 0)``. Frame pixels say
    where the game is: channel 0 holds the step t, channel 1 the game g."""

    def __init__(self, ends=(), lives=0, lose_life_at=(), rewards=None):
        self.observation_space = gym.spaces.Box(0, 255, (210, 160, 3), dtype=np.uint8)
        self.action_space = gym.spaces.Discrete(4)
        self.ends = list(ends)
        self.start_lives = lives
        self.lose_life_at = set(lose_life_at)
        self.rewards = dict(rewards or {})
        self.ale = self  # EpisodicLife reads ale.lives()
        self.game = -1
        self.t = 0
        self.remaining = lives
        self.actions = []

    def get_action_meanings(self):
        return ["NOOP", "FIRE", "RIGHT", "LEFT"]

    def lives(self) -> int:
        return self.remaining

    def frame(self) -> np.ndarray:
        out = np.zeros((210, 160, 3), dtype=np.uint8)
        out[..., 0], out[..., 1] = self.t, self.game
        return out

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.game += 1
        self.t = 0
        self.remaining = self.start_lives
        return self.frame(), {}

    def step(self, action):
        self.actions.append(int(action))
        self.t += 1
        if self.t in self.lose_life_at:
            self.remaining -= 1
        end = self.ends[self.game] if self.game < len(self.ends) else None
        terminated = (end is not None and self.t >= end) or (self.start_lives > 0 and self.remaining == 0)
        return self.frame(), float(self.rewards.get(self.t, 0.0)), terminated, False, {}


def where(obs) -> tuple[int, int]:
    """(step, game) of a scripted frame."""
    return int(obs[0, 0, 0]), int(obs[0, 0, 1])


def test_noop_reset_restarts_a_game_that_ends_during_its_noops():
    # 5 no-ops; game 0 ends on its 3rd step:
    #   reset (game 0), no-op t=1, t=2, t=3 game over -> reset (game 1), no-op t=1, t=2
    # 5 no-ops in all, and the learner starts from game 1 at t=2 (the 2017 code did the same).
    game = ScriptedGame(ends=[3])
    game.np_random = FixedDraw(5)
    obs, _ = W.NoopReset(game, noop_max=30).reset()
    assert game.np_random.calls == [(1, 31)]  # a count in 1..30
    assert game.actions == [0] * 5
    assert game.game == 1 and where(obs) == (2, 1)


def test_fire_reset_restarts_a_game_that_ends_on_fire():
    # Game 0 ends on FIRE (its step 1), game 1 on the second press (action 2, its step 1):
    #   reset (game 0), FIRE: game over -> reset (game 1), action 2: game over -> reset (game 2)
    # We return game 2's first frame; the 2017-2018 code reset too but returned the last frame
    # of game 1, which had ended.
    game = ScriptedGame(ends=[1, 1])
    obs, _ = W.FireReset(game).reset()
    assert game.actions == [1, 2]
    assert game.game == 2 and where(obs) == (0, 2)
    # Game 0 ends on the second press only: reset once more, and that game's first frame.
    game = ScriptedGame(ends=[2])
    obs, _ = W.FireReset(game).reset()
    assert game.actions == [1, 2]
    assert game.game == 1 and where(obs) == (0, 1)


def test_life_loss_reset_restarts_a_game_that_ends_on_its_noop():
    # 3 lives; a life is lost at step 1, and the game ends at step 2:
    #   reset (game 0), step t=1: life lost, the learner's episode ends, the game goes on
    #   reset: one no-op, t=2: game over -> reset (game 1)
    # The 2017-2018 EpisodicLife took that no-op and returned its frame whatever it said, so the
    # learner's next episode began in a game that had ended.
    game = ScriptedGame(ends=[2], lives=3, lose_life_at=[1])
    env = W.EpisodicLife(game)
    env.reset()
    assert env.step(3)[2] is True and game.lives() == 2 and game.game == 0
    obs, _ = env.reset()
    assert game.actions == [3, 0]
    assert game.game == 1 and where(obs) == (0, 1) and env.lives == 3


# --- reward types: the learner's clipped rewards, the tracker's real score per game -------------


@pytest.mark.parametrize("new_wrappers", SETS)
def test_tracker_gets_one_unclipped_score_per_game(new_wrappers, monkeypatch):
    # Two lives, lost at raw steps 100 and 200 (game over); raw rewards +5 at step 50, -3 at
    # 150, +2 at 160. The learner trains on clipped rewards and a lost life ends its episode:
    # episode 1 sees +1, episode 2 sees -1 and +1. The stages hand the tracker, and so the stop
    # rule, info["game_return"]: one number per game, the real score 5 - 3 + 2 = 4, over its
    # 200 raw steps. The 2017 tracker got each learner episode's sum of clipped rewards, 1 and
    # 0, as two entries. For Pong (no lives, every point +-1) the two agree.
    game = ScriptedGame(lives=2, lose_life_at=[100, 200], rewards={50: 5, 150: -3, 160: 2})
    game.np_random = FixedDraw(3)
    monkeypatch.setattr(W, "make_raw_env", lambda name, render_mode=None: W.GameStats(game))
    env = W.make_env("Scripted", new_wrappers=new_wrappers)
    env.reset()
    episodes, reports = [[]], []
    for _ in range(200):
        _, reward, terminated, truncated, info = env.step(0)
        episodes[-1].append(reward)
        if "game_return" in info:
            reports.append((info["game_return"], info["game_steps"]))
        if terminated or truncated:
            if game.lives() == 0:
                break
            env.reset()
            episodes.append([])
    assert [[r for r in episode if r] for episode in episodes] == [[1.0], [-1.0, 1.0]]
    assert reports == [(4.0, 200)]


# --- the emulator: no sticky actions, ALE's own episode cap, ended as truncated ------------------


def test_emulator_settings_and_episode_cap():
    spec = gym.spec(PONG)
    assert spec.kwargs["frameskip"] == 1 and spec.kwargs["repeat_action_probability"] == 0.0
    assert spec.max_episode_steps is None  # no TimeLimit wrapper: gym 0.9 had one of 400k frames
    env = W.make_env(PONG)
    assert env.unwrapped.ale.getInt("max_num_frames_per_episode") == 108_000  # 27,000 agent steps
    # The cap ends a game as truncated, not terminated, so the TD target bootstraps there; gym
    # 0.9's TimeLimit gave a plain done, which the 2017 loss treated as a terminal state.
    raw = W.GameStats(gym.make(PONG, max_num_frames_per_episode=40))
    raw.reset(seed=0)
    for t in range(1, 41):
        _, _, terminated, truncated, info = raw.step(0)
        assert not terminated and truncated == (t == 40)
    assert info["game_steps"] == 40


def test_every_reset_starts_pong_in_the_same_state_before_the_wrappers_act():
    # ale-py's reset: 60 no-op frames, then RESET held (4 frames more than 2017's ALE: a second
    # soft reset after setting the mode, whose byte, RAM 0x96, is already 0 for Pong, so no
    # SELECT). Its one random draw comes from an emulator generator of fixed seed: RAM and
    # screen are the same for every seed and after any play; only the wrappers' FIRE and 1-30
    # no-ops vary a game's start, as in 2017.
    env = gym.make(PONG)
    ale = env.unwrapped.ale
    first, _ = env.reset(seed=0)
    ram = ale.getRAM().copy()
    assert ram[0x96 - 0x80] == 0 and ale.getEpisodeFrameNumber() == 0
    for seed in (1, 2):
        obs, _ = env.reset(seed=seed)
        assert np.array_equal(obs, first) and np.array_equal(ale.getRAM(), ram)
    for _ in range(300):
        env.step(env.action_space.sample())
    obs, _ = env.reset()
    assert np.array_equal(obs, first) and np.array_equal(ale.getRAM(), ram)


def test_pong_rom_is_the_cartridge_ale_has_always_played():
    # ALE's Pong settings have named one dump of Atari's Video Olympics (1978), 2048 bytes, since
    # the ALE versions that 2017's atari-py bundled; a ROM of another md5 (the other Video Olympics
    # dump, c00b65d1...) would be a different game build.
    with open(ale_py.roms.get_rom_path("pong"), "rb") as f:
        rom = f.read()
    assert len(rom) == 2048 and hashlib.md5(rom).hexdigest() == "60e0ea3cbe0913d39803477945e9e5ec"
    env = W.make_env(PONG)
    # The minimal action set of 2017's PongNoFrameskip-v4: NOOP, FIRE, RIGHT, LEFT, RIGHTFIRE, LEFTFIRE.
    assert env.unwrapped.get_action_meanings() == ["NOOP", "FIRE", "RIGHT", "LEFT", "RIGHTFIRE", "LEFTFIRE"]


# --- the network's initial weights and the optimizer ---------------------------------------------


def test_model_init_is_uniform_within_one_over_sqrt_fan_in():
    # PyTorch 0.3 (2017) drew every conv and linear weight and bias from U(-b, b), b = 1/sqrt(fan_in).
    # Since 2018 (pytorch/pytorch#9038) the weights come from kaiming_uniform_(a=sqrt(5)), whose
    # bound works out to the same b, and the biases from U(-b, b): same distribution, other
    # draws, so the 2017 weights for a seed cannot be rebuilt. fan_in and b by hand:
    #   conv1 4*8*8 = 256: 1/16    conv2 32*4*4 = 512: 0.0442    conv3 64*3*3 = 576: 1/24
    #   fc1 64*7*7 = 3136: 1/56    fc2 512: 0.0442
    torch.manual_seed(0)
    net = DQN((4, 84, 84), 6)
    layers = [net.conv[0], net.conv[2], net.conv[4], net.fc[0], net.fc[2]]
    for layer, bound in zip(layers, [1 / 16, 512**-0.5, 1 / 24, 1 / 56, 512**-0.5]):
        weight, bias = layer.weight.detach(), layer.bias.detach()
        assert weight[0].numel() ** -0.5 == pytest.approx(bound)
        assert 0.98 * bound < weight.abs().max() <= bound  # fills U(-b, b): 3,072+ draws each
        assert weight.std().item() == pytest.approx(bound / 3**0.5, rel=0.03)  # a uniform's std
        assert bias.abs().max() <= bound and (bias != 0).all()  # not zero-initialised
    torch.manual_seed(0)
    for p, q in zip(net.parameters(), DQN((4, 84, 84), 6).parameters()):
        assert torch.equal(p, q)  # same seed, same weights


@pytest.mark.parametrize("fast", [False, True], ids=["01-05", "06-07"])
def test_adam_defaults_and_eps_after_bias_correction(fast):
    # Stages 01-05 build Adam(lr) and 06-07 add the fused (or foreach) kernel: the defaults are
    # 2017's (betas 0.9, 0.999; eps 1e-8; no weight decay, no AMSGrad), but since 2019
    # (pytorch/pytorch#22628) eps is added after the bias correction. One step on gradients 0.5
    # and 1e-8, where m_hat = g and v_hat = g^2, so the step is lr * g / (|g| + eps):
    #   0.5:  1e-4 * 0.5 / (0.5 + 1e-8)   = 1e-4
    #   1e-8: 1e-4 * 1e-8 / (1e-8 + 1e-8) = 5e-5
    # PyTorch 0.3 added eps to sqrt(v) before the correction, an effective eps of
    # 1e-8 / sqrt(1 - 0.999) = 3.16e-7 on step 1: 1e-4 * 1e-8 / (1e-8 + 3.16e-7) = 3.07e-6.
    p = torch.nn.Parameter(torch.zeros(2))
    optimizer = torch.optim.Adam([p], lr=1e-4, **(adam_options("cpu") if fast else {}))
    d = optimizer.defaults
    assert d["betas"] == (0.9, 0.999) and d["eps"] == 1e-8 and d["weight_decay"] == 0 and not d["amsgrad"]
    p.grad = torch.tensor([0.5, 1e-8])
    optimizer.step()
    assert p[0].item() == pytest.approx(-1e-4, rel=1e-6)
    assert p[1].item() == pytest.approx(-5e-5, rel=1e-5)


# --- epsilon: linear to its floor at epsilon_frames, for every agent step ------------------------


def test_epsilon_reaches_its_floor_at_epsilon_frames():
    # Ours: 1 - (1 - final) * k / epsilon_frames for agent step k, then final. The 2017 code's
    # max(final, 1 - k / epsilon_frames) fell faster and reached the floor early.
    pong, breakout = GAMES["pong"], GAMES["breakout"]
    assert epsilon_at(1, pong) == pytest.approx(1 - 0.98e-5)  # 2017's first step: 1.0
    assert epsilon_at(50_000, pong) == pytest.approx(0.51)  # 2017: 0.5
    assert epsilon_at(98_000, pong) == pytest.approx(0.0396)  # 2017: 0.02 from here on
    assert epsilon_at(100_000, pong) == pytest.approx(0.02)
    assert epsilon_at(900_000, breakout) == pytest.approx(0.19)  # 2017: 0.1 from here on
    assert epsilon_at(1_000_000, breakout) == pytest.approx(0.1)


def schedule_events(stage: str, frames: int, *extra, run_dir, monkeypatch) -> list[str]:
    """The events of an in-process run of ``stage`` for ``frames`` agent steps, training from 8
    transitions: each step epsilon is asked for, each target-sync check and each train step."""
    mod = load_script(stage)
    events = []

    def logged_epsilon(frame_idx, params):
        events.append(f"epsilon {frame_idx}")
        return epsilon_at(frame_idx, params)

    def logged_sync(prev_frame, frame_idx, period):
        events.append(f"sync {prev_frame} {frame_idx}")
        return crossed(prev_frame, frame_idx, period)

    def logged_loss(*args, **kwargs):
        events.append("train")
        return calc_loss(*args, **kwargs)

    monkeypatch.setattr(mod, "epsilon_at", logged_epsilon)
    monkeypatch.setattr(mod, "crossed", logged_sync)
    monkeypatch.setattr(mod, "calc_loss", logged_loss)
    res = run_inprocess(stage, "--max-frames", frames, *extra, "--replay-initial", 8, "--replay-size", 256,
                        "--run-dir", run_dir, "--quiet")  # fmt: skip
    assert res.code == 0, res.stderr
    return events


def test_schedules_count_agent_steps_and_sync_before_the_train_step(tmp_path, monkeypatch):
    # Stage 01, 10 agent steps, training once the buffer holds 8 transitions (from step 8 on).
    # Step k acts with epsilon_at(k); from step 8, the target-sync check comes before the train
    # step. The 2017 loop set epsilon after a step for the next one (step k used frame k-1's)
    # and synced after the train step: the same schedules, one step later.
    expected = [f"epsilon {k}" for k in range(1, 8)]
    for k in (8, 9, 10):
        expected += [f"epsilon {k}", f"sync {k - 1} {k}", "train"]
    assert schedule_events("01", 10, run_dir=tmp_path / "01", monkeypatch=monkeypatch) == expected
    # Stage 02 with N = 4, 12 agent steps: every step still has its own epsilon, and a train
    # step (with its sync check over the N steps just played) follows steps 8 and 12. The 2017
    # 02 set epsilon once per N steps: steps 1-4 used frame 0's, 5-8 frame 4's, 9-12 frame 8's.
    expected = [f"epsilon {k}" for k in range(1, 9)] + ["sync 4 8", "train"]
    expected += [f"epsilon {k}" for k in range(9, 13)] + ["sync 8 12", "train"]
    assert schedule_events("02", 12, "--steps", 4, run_dir=tmp_path / "02", monkeypatch=monkeypatch) == expected


# --- stages 07-08: ale-py's vector env beside the new set (05-06) -------------------------------
# Read from ale-py 0.12.1's src/ale/vector/preprocessed_env.cpp: reset() resets the game, presses
# FIRE for one frame and then d - 1 no-ops, with d uniform in 0..noop_max-1 from a std::mt19937
# seeded with the env's seed; step() acts frame by frame, stops at a game's end or the episode
# cap *before* it reads that frame's screen, reads the grey screens of the 3rd and 4th frames,
# maxes them in place, resizes (INTER_AREA) and pushes the result onto the stack. A plain
# emulator driven the same way (``Emulator``) gives the frames each test works from; Pong does
# not draw from ALE's RNG, so the same emulator also stands for the new set's game.


class Emulator:
    """A plain ALE emulator on Pong, set up as the vector env sets up each game (the seed as ALE's
    random seed, no sticky actions), played one frame at a time. It keeps the RGB and grey
    screen of every frame from ``keep_from`` on, by episode frame number."""

    def __init__(self, seed: int, keep_from: int = 0):
        self.ale = ale_py.ALEInterface()
        self.ale.setInt("random_seed", seed)
        self.ale.setFloat("repeat_action_probability", 0.0)
        self.ale.loadROM(roms.get_rom_path("pong"))
        self.ale.reset_game()
        self.action_set = self.ale.getMinimalActionSet()  # the vector env's action indices
        self.keep_from = keep_from
        self.rgb, self.grey = {}, {}

    def play(self, actions):
        for action in actions:
            self.ale.act(self.action_set[action])
            frame = self.ale.getEpisodeFrameNumber()
            if frame >= self.keep_from:
                self.rgb[frame], self.grey[frame] = self.ale.getScreenRGB(), self.ale.getScreenGrayscale()


def area84(grey: np.ndarray) -> np.ndarray:
    """A raw grey screen as the vector env resizes it."""
    return cv2.resize(grey, (84, 84), interpolation=cv2.INTER_AREA)


def paddle_rows(frame: np.ndarray) -> tuple[int, int]:
    """First and last raw row of the agent's green paddle (grey 147) in column 141 of a grey screen."""
    rows = np.flatnonzero(frame[:, 141] == 147)
    return int(rows[0]), int(rows[-1])


def vector_draw(seed: int) -> int:
    """The vector env's no-op draw d for ``seed``: std::mt19937's first output x (numpy's legacy
    RandomState is the same generator, seeded the same way), then libstdc++'s
    uniform_int_distribution(0, 29): (x * 30) >> 32."""
    x = int(np.random.RandomState(seed).randint(2**32, dtype=np.uint64))
    return (x * 30) >> 32


NOOP, FIRE, RIGHT = 0, 1, 2  # Pong's minimal action set; RIGHT moves the agent's paddle up


def test_vector_reset_fires_first_then_takes_one_frame():
    # 07-08: FIRE (one frame), then d - 1 no-ops, d the mt19937 draw for the seed:
    #   seed 0: x = 2357136044, d = 2357136044 * 30 >> 32 = 16: FIRE + 15 no-ops, first frame 16
    #   seed 7: x = 327741615,  d = 2: FIRE + 1 no-op, first frame 2
    # (a d of 0 or 1 gives FIRE alone: 0..28 no-ops in all). The first observation is that frame
    # alone, resized, above three zero slots.
    assert [vector_draw(seed) for seed in (0, 7)] == [16, 2]
    env = vector_env.make_vector_env(PONG, 1)
    for seed in range(8):
        obs, info = env.reset(seed=seed)
        assert info["episode_frame_number"][0] == max(vector_draw(seed), 1)
        assert not obs[0, :3].any()
    obs, info = env.reset(seed=0)
    emulator = Emulator(seed=0)
    emulator.play([FIRE] + [NOOP] * 15)
    np.testing.assert_array_equal(obs[0, -1], area84(emulator.grey[16]))
    # No max over the reset's last two frames: with seed 7 the frame is 2, and frame 1 still has
    # the start-up colours (greys 74, 107, 121, 179, brighter than frame 2's in places), so a max
    # would change it.
    obs7, _ = env.reset(seed=7)
    emulator7 = Emulator(seed=7)
    emulator7.play([FIRE, NOOP])
    np.testing.assert_array_equal(obs7[0, -1], area84(emulator7.grey[2]))
    assert not np.array_equal(obs7[0, -1], area84(np.maximum(emulator7.grey[1], emulator7.grey[2])))
    env.close()

    # 05-06 (the 2018 set), seed 0: the env's RNG draws 22 no-ops (frames 1-22), then FIRE and
    # RIGHT, one agent step of 4 frames each (23-26, 27-30): the first observation is frame 30,
    # grey of the RGB max of frames 29 and 30, four times. RIGHT has moved the agent's paddle up:
    # in raw column 141 it stands in rows 96-111 at 07's frame 16 and in rows 86-101 at frame 30.
    new = W.make_env(PONG, new_wrappers=True)
    noop = find(new, W.NoopReset)
    probe = noop.env = NoopProbe(noop.env)
    first, _ = new.reset(seed=0)
    assert probe.actions == [NOOP] * 22 + [FIRE] * 4 + [RIGHT] * 4
    assert new.unwrapped.ale.getEpisodeFrameNumber() == 30
    played = Emulator(seed=0)
    played.play([NOOP] * 22 + [FIRE] * 4 + [RIGHT] * 4)
    expected = WN.warp_frame(np.maximum(played.rgb[29], played.rgb[30]))
    assert all(np.array_equal(first[i], expected) for i in range(4))
    assert paddle_rows(emulator.grey[16]) == (96, 111) and paddle_rows(played.grey[30]) == (86, 101)
    # Raw pixel (86, 140): brown background (144, 72, 17) in 07's frame 16 and in frame 29, paddle
    # green (92, 186, 92) in frame 30. 05 sees grey(144, 186, 92) = 0.299*144 + 0.587*186 + 0.114*92
    # = 162.7 -> 163, 07 the background's 87: 76 levels, the most on this frame (84 x 84 pixel (35, 74)).
    assert tuple(emulator.rgb[16][86, 140]) == tuple(played.rgb[29][86, 140]) == (144, 72, 17)
    assert tuple(played.rgb[30][86, 140]) == (92, 186, 92)
    diff = first[-1].astype(int) - obs[0, -1]
    assert diff.max() == diff[35, 74] == 163 - 87


def test_vector_max_pools_the_grey_frames():
    # Seed 0 (first frame 16), one step of RIGHT: frames 17-20, the agent's paddle moving up (in
    # raw column 141: rows 92-107 at frame 19, 86-101 at frame 20). 07-08 max the grey screens of
    # frames 19 and 20; 05-06 max their RGB screens, then grey. At raw pixel (86, 140), brown
    # (144, 72, 17) in frame 19 and paddle green (92, 186, 92) in frame 20:
    #   grey, then max (07):  max(87, 147)                                          = 147
    #   max, then grey (05):  grey(144, 186, 92) = 0.299*144 + 0.587*186 + 0.114*92 = 162.7 -> 163
    # 16 levels, at raw and at 84 x 84 (pixel (35, 74)); the RGB max is never darker.
    env = vector_env.make_vector_env(PONG, 1)
    env.reset(seed=0)
    obs, *_ = env.step(np.array([RIGHT]))
    env.close()
    emulator = Emulator(seed=0)
    emulator.play([FIRE] + [NOOP] * 15 + [RIGHT] * 4)
    rgb, grey = emulator.rgb, emulator.grey
    assert paddle_rows(grey[19]) == (92, 107) and paddle_rows(grey[20]) == (86, 101)
    assert tuple(rgb[19][86, 140]) == (144, 72, 17) and tuple(rgb[20][86, 140]) == (92, 186, 92)
    # The grey itself is the same: ALE's palette grey equals cv2's on these frames (and on all
    # 128 NTSC colours of ALE's palette), so the order is the whole difference.
    for frame in (19, 20):
        np.testing.assert_array_equal(cv2.cvtColor(rgb[frame], cv2.COLOR_RGB2GRAY), grey[frame])
    grey_then_max = np.maximum(grey[19], grey[20])
    max_then_grey = cv2.cvtColor(np.maximum(rgb[19], rgb[20]), cv2.COLOR_RGB2GRAY)
    assert grey_then_max[86, 140] == 147 and max_then_grey[86, 140] == 163
    np.testing.assert_array_equal(obs[0, -1], area84(grey_then_max))
    diff = WN.warp_frame(np.maximum(rgb[19], rgb[20])).astype(int) - obs[0, -1]
    assert diff.min() == 0 and diff.max() == diff[35, 74] == 16


@pytest.mark.parametrize(
    "seed, last_step, newest", [(5, 763, "previous"), (0, 760, "frames 3051, 3052, 3055")], ids=["2nd", "4th"]
)
def test_vector_game_end_leaves_out_the_games_last_frame(seed, last_step, newest):
    # Pong played with NOOP throughout is lost 0-21 at episode frame 3056, however it began.
    #   seed 5: d = 6, first frame 6; step k covers frames 4k+3..4k+6, so step 763 covers
    #     3055-3058 and the game ends on its 2nd frame, before the 3rd and 4th are read: nothing
    #     of this step is read, and the newest frame is the previous step's, max(3053, 3054).
    #   seed 0: d = 16, first frame 16; step 760 covers 3053-3056 and the game ends on its 4th
    #     frame: frame 3055 is read and maxed with the buffer still holding the previous step's
    #     max(3051, 3052).
    # Frame 3056, where the opponent's 21st point shows, is in neither. 05-06 take max(3055, 3056).
    env = vector_env.make_vector_env(PONG, 1)
    obs, info = env.reset(seed=seed)
    start = int(info["episode_frame_number"][0])
    steps = 0
    while True:
        previous = obs
        obs, _, terminated, truncated, info = env.step(np.array([NOOP]))
        steps += 1
        if terminated[0] or truncated[0]:
            break
    env.close()
    assert terminated[0] and info["lives"][0] == 0 and info["episode_frame_number"][0] == 3056
    assert steps == last_step and start + 4 * (steps - 1) < 3056 <= start + 4 * steps
    emulator = Emulator(seed=seed, keep_from=3051)
    emulator.play([FIRE] + [NOOP] * (start - 1))
    while not emulator.ale.game_over():
        emulator.play([NOOP])
    assert emulator.ale.getEpisodeFrameNumber() == 3056
    grey = emulator.grey
    assert not np.array_equal(grey[3055], grey[3056])  # the score changes on the last frame
    np.testing.assert_array_equal(obs[0, :-1], previous[0, 1:])
    if newest == "previous":
        np.testing.assert_array_equal(obs[0, -1], previous[0, -1])
    else:
        np.testing.assert_array_equal(obs[0, -1], area84(np.maximum.reduce([grey[3051], grey[3052], grey[3055]])))
    assert not np.array_equal(obs[0, -1], WN.warp_frame(np.maximum(emulator.rgb[3055], emulator.rgb[3056])))


def test_vector_truncated_observation_lacks_the_steps_last_frame(monkeypatch):
    # 07-08's env with its cap cut to 40 frames (nothing else changed). The vector env counts the
    # cap from the end of the reset: seed 0's reset takes frames 1-16, so step 10 covers frames
    # 53-56 and is cut on its 4th frame, 56 = 16 + 40 (05-06 count from frame 0: ALE's own
    # max_num_frames_per_episode, pinned in test_emulator_settings_and_episode_cap). The cut
    # comes before frame 56 is read: the truncated observation, which the TD target bootstraps
    # from, holds max(51, 52) of step 9 maxed with frame 55. Eight NOOP steps, then two of RIGHT,
    # move the paddle through those frames; in raw column 141 it stands in rows
    #   frame 51: 92-107   52: 86-101   55: 76-91   56: 64-79
    # so rows 64-75 (frame 56 alone) are missing from the observation. 05-06 would take
    # max(55, 56): rows 64-91.
    from ale_py import vector_env as ale_vector_env

    monkeypatch.setattr(
        ale_vector_env,
        "AtariVectorEnv",
        functools.partial(ale_vector_env.AtariVectorEnv, max_num_frames_per_episode=40),
    )
    env = vector_env.make_vector_env(PONG, 1)
    _, info = env.reset(seed=0)
    assert info["episode_frame_number"][0] == 16
    actions = [NOOP] * 8 + [RIGHT] * 2
    for step, action in enumerate(actions, 1):
        obs, _, terminated, truncated, info = env.step(np.array([action]))
        assert not terminated[0] and truncated[0] == (step == 10)
    assert info["episode_frame_number"][0] == 56
    env.close()
    emulator = Emulator(seed=0)
    emulator.play([FIRE] + [NOOP] * 15 + [a for a in actions for _ in range(4)])
    grey = emulator.grey
    assert [paddle_rows(grey[f]) for f in (51, 52, 55, 56)] == [(92, 107), (86, 101), (76, 91), (64, 79)]
    np.testing.assert_array_equal(obs[0, -1], area84(np.maximum.reduce([grey[51], grey[52], grey[55]])))
    assert not np.array_equal(obs[0, -1], area84(np.maximum(grey[55], grey[56])))


def test_vector_life_loss_goes_on_with_the_agents_actions():
    # Breakout, 5 lives. 07-08 (life_loss_info): a lost life sets terminated and the game goes on;
    # the next step is the agent's own, 4 frames on, its frame pushed onto the same stack. 05-06
    # (EpisodicLife + FireReset) take NOOP, FIRE and action 2 (12 frames the agent does not
    # choose) and start the next episode from one frame four times
    # (test_wrappers.py::test_life_loss_ends_the_learners_episode_not_the_game).
    env = vector_env.make_vector_env("BreakoutNoFrameskip-v4", 1)
    rng = np.random.default_rng(0)
    obs, info = env.reset(seed=0)
    for _ in range(2000):
        obs, _, terminated, _, info = env.step(rng.integers(0, 4, size=1))
        if terminated[0]:
            break
    assert terminated[0] and info["lives"][0] == 4
    frame = int(info["episode_frame_number"][0])
    after, _, terminated, truncated, info = env.step(np.array([NOOP]))
    env.close()
    assert not (terminated[0] or truncated[0]) and info["lives"][0] == 4
    assert info["episode_frame_number"][0] == frame + 4
    np.testing.assert_array_equal(after[0, :-1], obs[0, 1:])

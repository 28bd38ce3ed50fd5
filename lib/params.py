"""Hyperparameters: one dataclass, one named set per game.

Every count is in agent steps (one action, repeated by the wrappers for 4 emulator frames),
which is also what the speed figures call a "frame".
"""

from __future__ import annotations

import dataclasses

# What a stage's net sees: STACK greyscale frames of FRAME_SHAPE pixels, oldest first.
FRAME_SHAPE = (84, 84)
STACK = 4  # frames per observation (the Nature DQN's "agent history length")


@dataclasses.dataclass(frozen=True)
class Hyperparams:
    env_name: str  # gymnasium id of the raw emulator env (NoFrameskip: the wrappers skip)
    stop_reward: float  # solved when the mean game score of the last 100 games exceeds this
    replay_size: int  # replay buffer capacity, in transitions (agent steps)
    replay_initial: int  # transitions collected before the first train step
    target_net_sync: int  # agent steps between copies of the net into the target net
    epsilon_frames: int  # agent steps over which epsilon falls linearly to epsilon_final
    epsilon_start: float = 1.0  # probability of a random action at step 0
    epsilon_final: float = 0.02  # probability of a random action after epsilon_frames
    learning_rate: float = 1e-4  # Adam step size
    gamma: float = 0.99  # discount per agent step
    batch_size: int = 32  # transitions per train step (stages 02+ use batch_size * steps)

    def replace(self, **changes) -> Hyperparams:
        return dataclasses.replace(self, **changes)


# Pong: the article's values. Breakout and SpaceInvaders: the values published with the
# 2017 scripts' companion code (Lapan, "Deep RL Hands-On", chapter 6 `HYPERPARAMS`).
# Seaquest and RiverRaid: Nature DQN (Mnih et al. 2015, Extended Data Table 1: 1M replay,
# 50k initial, epsilon 1 -> 0.1 over 1M steps, lr 2.5e-4); the target period of 10k parameter
# updates at one update per 4 steps is 40k agent steps. Stop rewards for those two are the
# Nature paper's human scores.
GAMES: dict[str, Hyperparams] = {
    "pong": Hyperparams(
        env_name="PongNoFrameskip-v4",
        stop_reward=18.0,
        replay_size=100_000,
        replay_initial=10_000,
        target_net_sync=1_000,
        epsilon_frames=100_000,
    ),
    "breakout": Hyperparams(
        env_name="BreakoutNoFrameskip-v4",
        stop_reward=500.0,
        replay_size=1_000_000,
        replay_initial=50_000,
        target_net_sync=10_000,
        epsilon_frames=1_000_000,
        epsilon_final=0.1,
        learning_rate=2.5e-4,
    ),
    "spaceinvaders": Hyperparams(
        env_name="SpaceInvadersNoFrameskip-v4",
        stop_reward=500.0,
        replay_size=1_000_000,
        replay_initial=50_000,
        target_net_sync=10_000,
        epsilon_frames=1_000_000,
        epsilon_final=0.1,
        learning_rate=2.5e-4,
    ),
    "seaquest": Hyperparams(
        env_name="SeaquestNoFrameskip-v4",
        stop_reward=20_182.0,
        replay_size=1_000_000,
        replay_initial=50_000,
        target_net_sync=40_000,
        epsilon_frames=1_000_000,
        epsilon_final=0.1,
        learning_rate=2.5e-4,
    ),
    "riverraid": Hyperparams(
        env_name="RiverraidNoFrameskip-v4",
        stop_reward=13_513.0,
        replay_size=1_000_000,
        replay_initial=50_000,
        target_net_sync=40_000,
        epsilon_frames=1_000_000,
        epsilon_final=0.1,
        learning_rate=2.5e-4,
    ),
}

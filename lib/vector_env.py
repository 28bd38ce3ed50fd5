"""Stages 07-08's trick: ale-py's native vector env, which does like steps in C++ but not all in the
same order (their docstrings and docs/ledger.md, the ledger, list how its preprocessing differs).
"""

from __future__ import annotations

import re

import ale_py

# No start-up banner on stderr (as lib.wrappers): error output stays one line.
ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)


def rom_name(env_name: str) -> str:
    """ALE ROM name of a gymnasium Atari id: "PongNoFrameskip-v4" -> "pong",
    "ALE/SpaceInvaders-v5" -> "space_invaders"."""
    name = env_name.split("/")[-1]
    name = re.sub(r"-v\d+$", "", name)
    name = re.sub(r"(NoFrameskip|Deterministic)$", "", name)
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def make_vector_env(env_name: str, num_envs: int, threads: int = 0, life_loss_info: bool = True, screen: bool = False):
    """ale-py's AtariVectorEnv over ``num_envs`` games, preprocessed in C++. Reset: FIRE for one
    frame, then 0..28 no-ops (``noop_max=30`` draws d in 0..29 and plays d - 1); the first
    observation is that frame alone, not maxed, above three zero frames. Step: the action for 4
    frames, the max of the last two frames' grey screens, resized to 84x84 (INTER_AREA), pushed
    onto a stack of 4; a step that ends the game or reaches the cap of 108,000 frames (counted
    from the end of the reset) stops before it reads that frame. Autoreset on the step after a
    game ends (NextStep). Rewards stay unclipped so the real score can be reported.
    ``life_loss_info``: a lost life sets ``terminated`` while the game goes on (the vector env's
    own episodic-life mode would reset the whole game at every lost life). ``screen``: the same
    games, the same steps, as 210x160 RGB screens (max of the step's last two frames) instead of
    the stack of grey 84x84 frames: a twin seeded and stepped as the agent's env plays the same
    game (``lib.analysis.watch --video``)."""
    from ale_py.vector_env import AtariVectorEnv

    return AtariVectorEnv(
        rom_name(env_name),
        num_envs=num_envs,
        num_threads=threads,
        frameskip=4,
        maxpool=True,
        stack_num=1 if screen else 4,
        grayscale=not screen,
        img_height=210 if screen else 84,
        img_width=160 if screen else 84,
        noop_max=30,
        use_fire_reset=True,
        episodic_life=False,
        life_loss_info=life_loss_info,
        reward_clipping=False,
        autoreset_mode="NextStep",
    )

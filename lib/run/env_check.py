"""Which env ids a stage can play: an ALE ROM for ale-py's vector env (07, 08); RGB frames,
discrete actions with ALE's action meanings and lives for the wrapper sets (01-06). Checked
before a run starts (lib.run.settings), so that a wrong id is one line, not a traceback.
"""

from __future__ import annotations

import importlib

from lib import vector_env
from lib.run.cli import UsageError
from lib.run.stages import STAGES


def check_env(env_id: str, stage: str) -> None:
    """UsageError unless ``env_id`` (an id gymnasium knows) is an Atari game ``stage`` can play:
    an ALE ROM for ale-py's vector env (07, 08); RGB frames, discrete actions with ALE's action
    meanings and lives for the wrapper sets (01-06). An ALE id is judged by its registration;
    any other env is made once and looked at."""
    import gymnasium as gym

    module, _, name = env_id.rpartition(":")
    if STAGES[stage].wrappers == "vector":
        import ale_py.roms

        rom = vector_env.rom_name(env_id)
        if rom not in ale_py.roms.get_all_rom_ids():
            raise UsageError(
                f"env id {env_id!r} is not an Atari game: stage {stage} plays ROMs in ale-py's vector env, and "
                f"{rom!r} is none of them (an id such as PongNoFrameskip-v4 is)"
            )
        return
    try:
        if module:
            importlib.import_module(module)  # it registers the env, as gym.make would import it
        spec = gym.spec(name)
    except Exception:
        raise UsageError(f"env id {env_id!r} does not exist") from None
    if spec.entry_point == "ale_py.env:AtariEnv":
        obs_type = spec.kwargs.get("obs_type", "rgb")
        if obs_type != "rgb":
            raise UsageError(f"env id {env_id!r} gives {obs_type} observations; stage {stage} needs RGB frames")
        return
    why = _not_atari(env_id)
    if why:
        raise UsageError(f"env id {env_id!r} is not an Atari game: stage {stage} needs {why}")


def _not_atari(env_id: str) -> str | None:
    """What the env ``env_id`` lacks that the wrapper sets need, or None."""
    import gymnasium as gym
    import numpy as np

    try:
        env = gym.make(env_id)
    except Exception as e:
        return f"an env that can be made ({type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]})"
    try:
        obs, act, raw = env.observation_space, env.action_space, env.unwrapped
        frames = isinstance(obs, gym.spaces.Box) and obs.dtype == np.uint8 and len(obs.shape) == 3
        if not frames or obs.shape[2] != 3:
            return f"RGB frames (uint8, height x width x 3), and it gives {_space(obs)}"
        if not isinstance(act, gym.spaces.Discrete):
            return f"discrete actions, and it takes {_space(act)}"
        if not callable(getattr(raw, "get_action_meanings", None)) or not hasattr(getattr(raw, "ale", None), "lives"):
            return "ALE's action meanings and lives, and it has none"
        return None
    finally:
        env.close()


def _space(space) -> str:
    """A gymnasium space in a few words: ``Box (4,) float32``."""
    return " ".join(
        str(x) for x in (type(space).__name__, getattr(space, "shape", ""), getattr(space, "dtype", "")) if x
    )

"""The game in progress, for checkpoints that resume exactly: what decides what an env of either
wrapper set does next, saved as tensors and numbers, and put back.
"""

from __future__ import annotations

import collections

import ale_py
import numpy as np

from lib.wrappers import FrameStackLazy
from lib.wrappers_new import FrameStack


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

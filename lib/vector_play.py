"""The play process of stages 07 and 08, one function for both: ale-py's native vector env
(C++ threads doing frame skip, max-pool, grey, resize and stacking) over --envs K games, their
actions picked in one batched forward pass (``lib.actor.Actor``), one ``VectorStep`` per Queue
item. Stage 07 acts eagerly; stage 08 on CUDA also tries its forward as a CUDA graph
(``PlayArgs.acting``). A step that autoresets a finished game is not a transition.
"""

from __future__ import annotations

import numpy as np

from lib import parallel, vector_env
from lib.actor import Actor
from lib.schedules import epsilon_at


def play(p: parallel.PlayArgs):
    """The play process of stages 07-08: one VectorStep per Queue item, carrying each env's new frame."""
    parallel.child_setup(p.seed)
    try:
        envs = vector_env.make_vector_env(p.params.env_name, p.envs, threads=min(p.threads, p.envs))
        rng = np.random.default_rng(p.seed + p.start_frame)
        obs, _ = envs.reset(seed=p.seed + p.start_frame)
        n_actions = envs.single_action_space.n
        log = lambda line: print(line, flush=True)
        actor = Actor(p.net, p.envs, obs.shape[1:], n_actions, p.device, rng, capture=p.acting, log=log)
        game_returns = np.zeros(p.envs)
        resetting = np.zeros(p.envs, dtype=bool)  # this step is the autoreset of a finished game
        act, send = p.parts(actor)  # as the run measures them
        first = parallel.VectorStep([(i, obs[i]) for i in range(p.envs)], None, None, None, None, None, None, [])
        send(first)
        frame_idx = p.start_frame
        while True:
            epsilon = epsilon_at(frame_idx, p.params)
            actions = act(obs, epsilon)  # one host round trip on CUDA
            obs, rewards, terminated, truncated, info = envs.step(actions)
            stepped = ~resetting
            frame_idx += int(stepped.sum())
            game_returns[stepped] += rewards[stepped]
            dones = (terminated | truncated) & stepped
            game_over = dones & ((info["lives"] == 0) | truncated)
            finished = [(float(game_returns[i])) for i in np.flatnonzero(game_over)]
            game_returns[game_over] = 0.0
            # A reset step starts an episode from its obs; so does a lost life (the game goes on).
            starts = [(i, obs[i]) for i in np.flatnonzero(resetting | (dones & ~game_over))]
            item = parallel.VectorStep(
                starts, stepped, actions, np.sign(rewards), terminated, dones, obs[:, -1].copy(), finished
            )
            send(item)
            resetting = game_over
    except Exception:
        parallel.report_error(p.queue)

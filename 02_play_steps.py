"""Stage 02 (play steps): adds over 01 playing N env steps per train step (--steps N, default
4) with a batch of 32*N, so each transition is still sampled as often (epsilon and target sync
keep their per-frame schedules). Fewer, larger train steps amortise the per-step overhead,
which moves f/s.

Usage: python 02_play_steps.py [--steps 4] [--device auto|cpu|cuda] [--max-frames N] ...
"""

import torch
import torch.optim as optim

from lib import wrappers
from lib.agent import choose_action
from lib.buffer import ReplayBuffer
from lib.loss import calc_loss
from lib.model import DQN
from lib.run import runner
from lib.schedules import crossed, epsilon_at

STAGE = "02"


def build(shape, n_actions, params, device):
    """The learner: net, target net (a copy of it) and optimizer."""
    net = DQN(shape, n_actions).to(device)
    tgt_net = DQN(shape, n_actions).to(device)
    tgt_net.load_state_dict(net.state_dict())
    optimizer = optim.Adam(net.parameters(), lr=params.learning_rate)
    return net, tgt_net, optimizer


def train_step(batch, net, tgt_net, optimizer, params, device):
    """One gradient step on a sampled batch; the loss comes back as a tensor, unread."""
    optimizer.zero_grad()
    loss_v = calc_loss(batch, net, tgt_net, params.gamma, device)
    loss_v.backward()
    optimizer.step()
    return loss_v


def train(run):
    params, device, args = run.params, run.device, run.args
    env = wrappers.make_env(params.env_name)
    net, tgt_net, optimizer = build(env.observation_space.shape, env.action_space.n, params, device)
    buffer = ReplayBuffer(params.replay_size, seed=args.seed)
    run.attach(net=net, tgt_net=tgt_net, optimizer=optimizer, buffer=buffer)
    state = run.start_env(env)  # the first game, or the game in progress of a --save-replay checkpoint
    print(f"stage {STAGE}: {params.env_name} on {device}, {torch.get_num_threads()} threads", flush=True)

    # the loop's parts, as the run measures them (lib.run.probes)
    env, buffer, act, learn = run.parts(env=env, buffer=buffer, act=choose_action, learn=train_step)
    for frame_idx in run.frames(args.steps):
        for play_idx in range(frame_idx - args.steps + 1, frame_idx + 1):
            epsilon = epsilon_at(play_idx, params)
            action = act(net, state, epsilon, env.action_space, device)
            next_state, reward, terminated, truncated, info = env.step(action)
            buffer.add(state, action, reward, terminated, next_state, terminated or truncated)
            state = next_state
            if terminated or truncated:
                state, _ = env.reset()
            run.game_over(info.get("game_return"), play_idx, epsilon)  # a solve ends the run
        if len(buffer) < params.replay_initial:
            continue
        run.speed.start(frame_idx)
        if crossed(frame_idx - args.steps, frame_idx, params.target_net_sync):
            tgt_net.load_state_dict(net.state_dict())

        batch = buffer.sample(params.batch_size * args.steps)
        loss_v = learn(batch, net, tgt_net, optimizer, params, device)
        run.tracker.loss(loss_v, frame_idx)


def main(argv=None):
    return runner.main(STAGE, __doc__, train, argv)


if __name__ == "__main__":
    runner.exit_with(main())

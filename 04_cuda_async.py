"""Stage 04 (cuda async): adds over 03 asynchronous batch copies to the GPU: each batch is sampled
into reused pinned host buffers and copied with non_blocking=True, so the CPU goes on during the
copy, which moves f/s on a GPU. On CPU there is nothing to copy: it behaves exactly as 03.

Usage: python 04_cuda_async.py [--steps 4] [--device auto|cpu|cuda] [--max-frames N] ...
"""

import torch
import torch.optim as optim

from lib import parallel, wrappers
from lib.agent import choose_action
from lib.buffer import ReplayBuffer
from lib.loss import calc_loss
from lib.model import DQN
from lib.run import runner
from lib.schedules import crossed, epsilon_at
from lib.staging import PinnedStager

STAGE = "04"


def play(p: parallel.PlayArgs):
    """The play process: env steps with the shared net, one Transition per Queue item."""
    parallel.child_setup(p.seed)
    try:
        env = wrappers.make_env(p.params.env_name)
        env.action_space.seed(p.seed + p.start_frame)
        state, _ = env.reset(seed=p.seed + p.start_frame)
        first_state = state
        frame_idx = p.start_frame
        act, send = p.parts(choose_action)  # as the run measures them
        while True:
            frame_idx += 1
            epsilon = epsilon_at(frame_idx, p.params)
            action = act(p.net, state, epsilon, env.action_space, p.device)
            next_state, reward, terminated, truncated, info = env.step(action)
            done = terminated or truncated
            item = parallel.Transition(
                first_state, action, reward, terminated, next_state[-1], done, info.get("game_return")
            )
            send(item)
            first_state = None
            state = next_state
            if done:
                state, _ = env.reset()
                first_state = state
    except Exception:
        parallel.report_error(p.queue)


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
    loss_v = calc_loss(batch, net, tgt_net, params.gamma, device, non_blocking=True)
    loss_v.backward()
    optimizer.step()
    return loss_v


def train(run):
    params, device, args = run.params, run.device, run.args
    env = wrappers.make_env(params.env_name)
    net, tgt_net, optimizer = build(env.observation_space.shape, env.action_space.n, params, device)
    buffer = ReplayBuffer(params.replay_size, seed=args.seed)
    run.attach(net=net, tgt_net=tgt_net, optimizer=optimizer, buffer=buffer)
    stager = PinnedStager(device)
    if not stager.enabled:
        print(f"stage {STAGE}: on {device} there are no host-to-GPU copies to overlap", flush=True)
    env.close()
    trainer_threads, player_threads = parallel.split_threads(device)
    torch.set_num_threads(trainer_threads)
    net.share_memory()
    queue = parallel.context().Queue(maxsize=2 * args.steps)
    player = parallel.start_player(run, play, parallel.PlayArgs.of(run, net, queue))
    print(f"stage {STAGE}: {params.env_name} on {device}, {torch.get_num_threads()} threads", flush=True)

    # the loop's parts, as the run measures them (lib.run.probes)
    buffer, stager, receive, learn = run.parts(buffer=buffer, stager=stager, receive=parallel.receive, learn=train_step)
    for frame_idx in run.frames(args.steps):
        for play_idx in range(frame_idx - args.steps + 1, frame_idx + 1):
            item = receive(queue, player)
            if item.first_state is not None:
                buffer.start_episode(item.first_state)
            buffer.add_step(item.action, item.reward, item.terminated, item.next_frame, item.done)
            epsilon = epsilon_at(play_idx, params)
            run.game_over(item.game_return, play_idx, epsilon)  # a solve ends the run
        if len(buffer) < params.replay_initial:
            continue
        run.speed.start(frame_idx)
        if crossed(frame_idx - args.steps, frame_idx, params.target_net_sync):
            tgt_net.load_state_dict(net.state_dict())

        batch = stager.sample(buffer, params.batch_size * args.steps)
        loss_v = learn(batch, net, tgt_net, optimizer, params, device)
        run.tracker.loss(loss_v, frame_idx)


def main(argv=None):
    return runner.main(STAGE, __doc__, train, argv)


if __name__ == "__main__":
    runner.exit_with(main())

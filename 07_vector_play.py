"""Stage 07 (vector play): adds over 06 vectorised play: the play process (lib/vector_play.py) drives
ale-py's native vector env (C++ threads doing frame skip, max-pool, grey, resize and stacking) over
--envs K games at once and picks their actions in one eager batched forward pass; one train step
of batch 32*N still follows every N frames. Not in the article: on a GPU the Python env is the bound,
and this lifts it; target 5,000 f/s on one modern GPU (measured: 690 on an H200, one short pass),
and no slower than 06 on a 2-core CPU (measured: 0.92-1.05x of 06; docs/measurements.md).
Its preprocessing differs from 05-06's in five ways, each kept, with its reason and test, in
docs/ledger.md ("Stages 07-08"). Each game has a ring of its own; an autoreset is no transition.

Usage: python 07_vector_play.py [--envs 4] [--steps 4] [--device auto|cpu|cuda] ...
"""

import torch
import torch.optim as optim

from lib import parallel, vector_env
from lib.buffer_games import StreamReplayBuffer
from lib.loss import calc_loss
from lib.model import DQN
from lib.optimizer import adam_options
from lib.run import runner
from lib.schedules import crossed, epsilon_at
from lib.staging import PinnedStager
from lib.vector_play import play

STAGE = "07"


def build(shape, n_actions, params, device):
    """The learner: net, target net (a copy of it) and optimizer."""
    net = DQN(shape, n_actions).to(device, memory_format=torch.channels_last)
    tgt_net = DQN(shape, n_actions).to(device, memory_format=torch.channels_last)
    tgt_net.load_state_dict(net.state_dict())
    optimizer = optim.Adam(net.parameters(), lr=params.learning_rate, **adam_options(device))
    return net, tgt_net, optimizer


def train_step(batch, net, tgt_net, optimizer, params, device, precision="bf16"):
    """One gradient step on a sampled batch; the loss comes back as a tensor, unread.
    ``--precision fp32`` leaves autocast off: plain fp32, as stages 01-05."""
    optimizer.zero_grad()
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
        loss_v = calc_loss(
            batch, net, tgt_net, params.gamma, device, non_blocking=True, channels_last=True, inference_target=True
        )
    loss_v.backward()
    optimizer.step()
    return loss_v


def train(run):
    params, device, args = run.params, run.device, run.args
    probe = vector_env.make_vector_env(params.env_name, 1)
    shape, n_actions = probe.single_observation_space.shape, probe.single_action_space.n
    probe.close()
    net, tgt_net, optimizer = build(shape, n_actions, params, device)
    buffer = StreamReplayBuffer(params.replay_size, args.envs, seed=args.seed)
    run.attach(net=net, tgt_net=tgt_net, optimizer=optimizer, buffer=buffer)
    stager = PinnedStager(device)
    if not stager.enabled:
        print(f"stage {STAGE}: on {device} there are no host-to-GPU copies to overlap", flush=True)
    trainer_threads, player_threads = parallel.split_threads(device)
    torch.set_num_threads(trainer_threads)
    net.share_memory()
    queue = parallel.context().Queue(maxsize=max(2, 2 * args.steps // args.envs))
    player = parallel.start_player(run, play, parallel.PlayArgs.of(run, net, queue, threads=player_threads))
    print(
        f"stage {STAGE}: {params.env_name} x{args.envs} on {device}, {torch.get_num_threads()} threads, "
        f"learner {args.precision}",
        flush=True,
    )

    # the loop's parts, as the run measures them (lib.run.probes)
    buffer, stager, receive, learn = run.parts(buffer=buffer, stager=stager, receive=parallel.receive, learn=train_step)
    received = run.frame_idx
    for frame_idx in run.frames(args.steps):
        while received < frame_idx:
            item = receive(queue, player)
            buffer.add_vector_step(
                item.stepped, item.actions, item.rewards, item.terminated, item.dones, item.next_frames, item.starts
            )
            if item.stepped is not None:
                received += int(item.stepped.sum())
            epsilon = epsilon_at(received, params)
            for game_return in item.finished:
                run.game_over(game_return, received, epsilon)  # a solve ends the run
        if len(buffer) < params.replay_initial:
            continue
        run.speed.start(frame_idx)
        if crossed(frame_idx - args.steps, frame_idx, params.target_net_sync):
            tgt_net.load_state_dict(net.state_dict())

        batch = stager.sample(buffer, params.batch_size * args.steps)
        loss_v = learn(batch, net, tgt_net, optimizer, params, device, args.precision)
        run.tracker.loss(loss_v, frame_idx)


def main(argv=None):
    return runner.main(STAGE, __doc__, train, argv)


if __name__ == "__main__":
    runner.exit_with(main())

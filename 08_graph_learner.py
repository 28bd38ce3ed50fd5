"""Stage 08 (graph learner): adds over 07 a learner that runs on the device in one launch, with the same
learning per frame: the replay rings live on the device (a vector step's new frames go there in one copy), and
the whole train step (sample, loss, backward, Adam) is a CUDA graph replayed every N frames, the trainer at most
one Queue item ahead (on CUDA the play side's batched forward also tries a graph, keeping the faster). Not in
the article: on a GPU 07's learner pays kernel launches and host sampling every step; target 5,000 f/s on one
H200 (not measured on a GPU yet), and no slower than 07 on a CPU, where the ring stays in host memory and the
step runs eagerly (measured: 1.04-1.09x of 07; docs/measurements.md).
Its preprocessing differs from 05-06's in five ways, each kept, with its reason and test, in
docs/ledger.md ("Stages 07-08"). Each game has a ring of its own; an autoreset is no transition.

Usage: python 08_graph_learner.py [--envs 4] [--steps 4] [--capture auto|none|graph|compile] ...
"""

import torch
import torch.optim as optim

from lib import graph_step, parallel, vector_env
from lib.loss import calc_loss
from lib.model import DQN
from lib.optimizer import adam_options
from lib.replay_device import DeviceReplayBuffer
from lib.run import runner
from lib.run.knobs import resolve_capture
from lib.schedules import crossed, epsilon_at
from lib.vector_play import play

STAGE = "08"


def build(shape, n_actions, params, device, envs, capture):
    """The learner: net, target net (a copy of it), optimizer, and the replay rings on the device."""
    net = DQN(shape, n_actions).to(device, memory_format=torch.channels_last)
    tgt_net = DQN(shape, n_actions).to(device, memory_format=torch.channels_last)
    tgt_net.load_state_dict(net.state_dict())
    optimizer = optim.Adam(net.parameters(), lr=params.learning_rate, **adam_options(device, capture))
    buffer = DeviceReplayBuffer(params.replay_size, envs, device=device)
    return net, tgt_net, optimizer, buffer


def train_step(buffer, batch_size, net, tgt_net, optimizer, params, device, precision="bf16"):
    """One gradient step on a batch drawn on the device; the loss comes back as a tensor, unread.
    ``--precision fp32`` leaves autocast off: plain fp32, as stages 01-05."""
    optimizer.zero_grad()
    batch = buffer.sample(batch_size)  # no host read, fixed shapes: the whole step can be captured
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
    capture = resolve_capture(args.capture, device.type)
    net, tgt_net, optimizer, buffer = build(shape, n_actions, params, device, args.envs, capture)
    run.attach(net=net, tgt_net=tgt_net, optimizer=optimizer, buffer=buffer)
    trainer_threads, player_threads = parallel.split_threads(device)
    torch.set_num_threads(trainer_threads)
    net.share_memory()
    step = graph_step.capture(train_step, capture, log=lambda line: print(f"stage {STAGE}: {line}", flush=True))
    queue = parallel.context().Queue(maxsize=max(2, 2 * args.steps // args.envs))
    player = parallel.start_player(
        run, play, parallel.PlayArgs.of(run, net, queue, threads=player_threads, capture=capture)
    )
    print(
        f"stage {STAGE}: {params.env_name} x{args.envs} on {device}, {torch.get_num_threads()} threads, "
        f"train step capture: {capture}, learner {args.precision}",
        flush=True,
    )

    pace = graph_step.Pacer(device)
    # the loop's parts, as the run measures them (lib.run.probes)
    buffer, receive, learn, pace = run.parts(buffer=buffer, receive=parallel.receive, learn=step, pace=pace)
    received = run.frame_idx
    for frame_idx in run.frames(args.steps):
        while received < frame_idx:
            item = receive(queue, player)
            pace()  # the device is at most one item behind
            buffer.add_vector_step(  # one copy to the device
                item.stepped, item.actions, item.rewards, item.terminated, item.dones, item.next_frames, item.starts
            )
            if item.stepped is not None:
                received += int(item.stepped.sum())
            epsilon = epsilon_at(received, params)
            for game_return in item.finished:
                run.game_over(game_return, received, epsilon)  # a solve ends the run
        if len(buffer) < params.replay_initial:
            continue
        if learn.ready:  # f/s counts from after capture: compile and capture time is not speed
            run.speed.start(frame_idx)
        if crossed(frame_idx - args.steps, frame_idx, params.target_net_sync):
            tgt_net.load_state_dict(net.state_dict())

        loss_v = learn(buffer, params.batch_size * args.steps, net, tgt_net, optimizer, params, device, args.precision)
        run.tracker.loss(loss_v, frame_idx)


def main(argv=None):
    return runner.main(STAGE, __doc__, train, argv)


if __name__ == "__main__":
    runner.exit_with(main())

"""``python -m lib.bench.trainstep``: the train step of the stage whose learner is on the device
(08), timed in each of its forms on a full ring, for the GPU check (``results/gpu_check.sh``).

    python -m lib.bench.trainstep --device cuda --capture none,graph,compile --batch 128
    python -m lib.bench.trainstep --device cpu --capture none --precision bf16,fp32 --batch 128

``--precision`` times the learner in bf16 autocast and in plain fp32 (``auto``, the default, is
the one a stage picks on this device): bf16 is the slower of the two where torch emulates it (a
CPU without AVX-512 bf16 or AMX) and on some CPUs that have it (AVX-512 bf16 without AMX, on Intel).

The learner is the stage's own (its script's ``build``: nets, optimizer, rings on the device,
train step), made anew for each form; its rings hold what one ring in host memory holds, filled
once as the bench fills rings (``parts.fill_rings``) to ``--replay-size`` slots and loaded into
each form's rings in one copy: the fill is 6,250 vector steps of Python at 100,000 slots over 16
rings, seconds that four forms would otherwise pay four times within the GPU check's budget for
this step. Each form is timed over ``--iters`` steady-state train steps, after warm-up and
capture (or compilation), with CUDA events on CUDA; one ``TRAINSTEP`` line each, its
``graphed`` yes where the form ran as CUDA graphs, and after it a ``GRAPH`` line that says so or
why not, as torch reported it (``lib.graph_step.Captured.graphed``).

Beside each form's ms, its floor: the step's arithmetic (``lib.model.train_step_flops``: 8.73
GFLOP at batch 128) over the rate at which this device multiplies two 2048x2048 matrices in that
precision, measured in the same process just before (``lib.bench.floor``); ``ratio`` is ms over floor;
``floor_math`` names the arithmetic the floor was timed in, the convolutions' (bf16; for fp32,
tf32 where cuDNN uses TF32, as on CUDA by default, else ieee).
A step cannot beat its floor by much (a convolution is no better shaped for the hardware than a
large square matmul); what lies above it is the step's own overhead: casts, layout changes,
element-wise passes, Python, and kernels worse shaped than the matmul.
"""

from __future__ import annotations

import sys
import time

import numpy as np
import torch

from lib import graph_step
from lib.bench.floor import floor_math, floor_ms, matmul_rate
from lib.bench.parts import fill_rings
from lib.model import DQN, train_step_flops
from lib.params import FRAME_SHAPE, GAMES, STACK
from lib.replay_device import DeviceReplayBuffer
from lib.run import cli
from lib.run.knobs import KNOBS, resolve_capture
from lib.run.scripts import load_script
from lib.run.stages import STAGES

STAGE = next(s.id for s in STAGES.values() if s.sampling == "device")  # the stage timed: 08
STEPS = KNOBS["steps"].default  # N: frames per train step (the batch is --batch, a multiple of N)
SHAPE, N_ACTIONS = (STACK, *FRAME_SHAPE), 6  # Pong's


def filled_ring(capacity: int, streams: int, seed: int = 0) -> DeviceReplayBuffer:
    """``streams`` full rings of ``capacity // streams`` slots in host memory, filled once for every form."""
    ring = DeviceReplayBuffer(capacity, streams)
    pool = np.random.default_rng(seed).integers(0, 256, (64,) + SHAPE[1:], dtype=np.uint8)
    fill_rings(ring, ring.per_stream, pool, N_ACTIONS)
    return ring


def time_train_step(device, capture: str, batch_size: int, iters: int, ring, seed: int = 0, precision="bf16"):
    """(ms per steady-state train step, seconds of warm-up/capture/compilation, whether it ran as
    a CUDA graph: ``Captured.graphed``) on rings holding ``ring``'s transitions."""
    params = GAMES["pong"].replace(replay_size=ring.capacity, batch_size=batch_size // STEPS)
    device = torch.device(device)
    torch.manual_seed(seed)
    module = load_script(STAGE)
    net, tgt_net, optimizer, buffer = module.build(SHAPE, N_ACTIONS, params, device, ring.streams, capture)
    buffer.load_state_dict(ring.state_dict())  # one copy of the filled ring
    step = graph_step.capture(module.train_step, capture)
    args = (buffer, batch_size, net, tgt_net, optimizer, params, device, precision)
    while not step.ready or step.calls < step.warmup + 2:
        step(*args)
    cuda = device.type == "cuda"
    if cuda:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
    else:
        t0 = time.perf_counter()
    for _ in range(iters):
        step(*args)
    if cuda:
        end.record()
        torch.cuda.synchronize()
        ms = start.elapsed_time(end) / iters
    else:
        ms = 1000 * (time.perf_counter() - t0) / iters
    return ms, step.prepare_seconds, step.graphed


def make_parser() -> cli.Parser:
    p = cli.Parser(prog="python -m lib.bench.trainstep", description=f"Time stage {STAGE}'s train step forms.")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=("cpu", "cuda"))
    p.add_argument("--capture", default="none,graph", help="comma-separated forms: none, graph, compile")
    p.add_argument("--batch", type=int, default=128, help=f"transitions per train step (32*N, N={STEPS})")
    p.add_argument("--iters", type=int, default=500, help="timed train steps per form")
    p.add_argument("--replay-size", type=int, default=100_000, help="ring slots (filled before timing)")
    p.add_argument("--envs", type=int, default=16, help="rings (envs K)")
    p.add_argument(
        "--precision",
        default=KNOBS["precision"].default,
        help="comma-separated: auto, bf16, fp32 (the stage's --precision; auto as a stage here runs it)",
    )
    return p


def main(argv=None) -> int:
    p = make_parser()
    try:
        args = p.parse_args(argv)
        try:
            forms = [resolve_capture(c.strip(), args.device) for c in args.capture.split(",")]
        except ValueError as e:
            raise cli.UsageError(str(e)) from None
        try:  # auto: as a stage on this device would run
            precisions = [KNOBS["precision"].resolve(x.strip(), args.device) for x in args.precision.split(",")]
        except ValueError:
            known = KNOBS["precision"].choices
            raise cli.UsageError(f"--precision {args.precision!r}: each must be one of {', '.join(known)}") from None
        if args.device == "cuda" and not torch.cuda.is_available():
            raise cli.UsageError("--device cuda: no CUDA device is available")
        if min(args.batch, args.iters, args.envs) < 1 or args.replay_size // args.envs < 6:
            raise cli.UsageError("--batch, --iters and --envs must be at least 1, and --replay-size at least 6 per env")
        if args.batch % STEPS:
            raise cli.UsageError(f"--batch {args.batch}: a train step of N={STEPS} takes a multiple of {STEPS}")
    except cli.UsageError as e:
        return cli.usage_exit(p.prog, e)
    ring = filled_ring(args.replay_size, args.envs)
    gflop = train_step_flops(DQN(SHAPE, N_ACTIONS), SHAPE, args.batch) / 1e9
    for precision in precisions:
        rate = matmul_rate(args.device, precision, seconds=0.5)
        floor = floor_ms(SHAPE, args.batch, rate)
        for form in forms:
            ms, prep, graphed = time_train_step(args.device, form, args.batch, args.iters, ring, precision=precision)
            print(
                f"TRAINSTEP capture={form} precision={precision} device={args.device} batch={args.batch} "
                f"ms={ms:.4f} floor_ms={floor:.4f} ratio={ms / floor:.2f} prepare_s={prep:.1f} iters={args.iters} "
                f"gflop={gflop:.4f} matmul_gflops={rate / 1e9:.1f} floor_math={floor_math(args.device, precision)} "
                f"graphed={'yes' if graphed == 'graphed' else 'no'}",
                flush=True,
            )
            print(f"GRAPH capture={form} precision={precision}: {graphed}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

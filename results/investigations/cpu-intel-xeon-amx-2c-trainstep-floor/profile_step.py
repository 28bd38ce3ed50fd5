"""Stage 08's bf16 train step under torch.profiler, at batch 128 on a filled ring: self time
per op and input shape over 20 steps. Run from the repository root:

    python results/investigations/cpu-intel-xeon-amx-2c-trainstep-floor/profile_step.py [bf16|fp32]
"""

import sys

import torch
from torch.profiler import profile

from lib import graph_step
from lib.bench import trainstep
from lib.params import GAMES
from lib.run.scripts import load_script


def main(precision: str = "bf16"):
    ring = trainstep.filled_ring(20_000, 4)
    params = GAMES["pong"].replace(replay_size=ring.capacity, batch_size=32)
    torch.manual_seed(0)
    stage, device = load_script("08"), torch.device("cpu")
    net, tgt_net, optimizer, buffer = stage.build(trainstep.SHAPE, trainstep.N_ACTIONS, params, device, 4, "none")
    buffer.load_state_dict(ring.state_dict())
    step = graph_step.capture(stage.train_step, "none")
    args = (buffer, 128, net, tgt_net, optimizer, params, device, precision)
    for _ in range(10):
        step(*args)
    with profile(record_shapes=True) as prof:
        for _ in range(20):
            step(*args)
    print(prof.key_averages(group_by_input_shape=True).table(sort_by="self_cpu_time_total", row_limit=25))


if __name__ == "__main__":
    main(*sys.argv[1:])

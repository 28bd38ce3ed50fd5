"""Stage 08's bf16 train step (batch 128, 40 steps a form, ``lib.bench.trainstep``) with conv1's
input laid out NHWC before the conv (``lib.model.DQN.forward`` today) against left NCHW for
oneDNN to lay out itself, interleaved over four rounds. Run from the repository root:

    python results/investigations/cpu-intel-xeon-amx-2c-trainstep-floor/conv1_input_nchw.py
"""

import torch
import torch.nn.functional as F

from lib import model
from lib.bench import trainstep

NHWC = model.DQN.forward


def nchw(self, x):
    """DQN.forward with the cast input left NCHW (the autocast branch only)."""
    if x.dtype != torch.uint8 or not torch.is_autocast_enabled(x.device.type):
        return NHWC(self, x)
    first = self.conv[0]
    x = x.to(torch.get_autocast_dtype(x.device.type))
    x = F.conv2d(x, first.weight / 255.0, first.bias, first.stride, first.padding)
    hidden = self.fc[:-1](self.conv[1:](x).flatten(1))
    with torch.autocast(x.device.type, enabled=False):
        return self.fc[-1](hidden.float())


def main():
    ring = trainstep.filled_ring(20_000, 4)
    forms = [("nhwc", NHWC), ("nchw", nchw)]
    for r in range(4):
        cells = []
        for name, forward in forms if r % 2 == 0 else forms[::-1]:
            model.DQN.forward = forward
            ms, _ = trainstep.time_train_step("cpu", "none", 128, 40, ring)
            cells.append(f"{name} {ms:.1f}")
        print(f"round {r + 1}: " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()

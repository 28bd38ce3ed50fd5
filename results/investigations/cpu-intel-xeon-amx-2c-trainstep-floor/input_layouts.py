"""The train step's input made ready for conv1, each way timed alone (batch 128 states of
4x84x84 bytes, bf16 under autocast, 20 tries a way, the 25th percentile), three rounds:

- ``cast``: the bytes cast to bf16, NCHW as the ring gives them;
- ``nhwc``: cast, then made channels-last (what ``lib.model.DQN.forward`` does today);
- ``to_both``: one ``Tensor.to`` with the dtype and the memory format together;
- ``unshuffle``: cast, then ``pixel_unshuffle(4)`` (space-to-depth: 64 channels of 21x21);
- ``unshuffle_nhwc``: the same made channels-last, as a 2x2 conv over 64 channels would take it;
- ``conv_nhwc`` / ``conv_nchw``: conv1's forward after ``nhwc`` / after ``cast`` (oneDNN lays out
  an NCHW input itself).

Run from the repository root: python results/investigations/cpu-intel-xeon-amx-2c-trainstep-floor/input_layouts.py
"""

import time

import torch
import torch.nn.functional as F

B, CL = 128, torch.channels_last


def main():
    x = torch.randint(0, 256, (B, 4, 84, 84), dtype=torch.uint8)
    weight = (torch.randn(32, 4, 8, 8) * 0.05).contiguous(memory_format=CL)
    bias = torch.zeros(32)

    def conv(prepare):
        def run():
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return F.conv2d(prepare(), weight / 255.0, bias, 4)

        return run

    ways = {
        "cast": lambda: x.to(torch.bfloat16),
        "nhwc": lambda: x.to(torch.bfloat16).contiguous(memory_format=CL),
        "to_both": lambda: x.to(torch.bfloat16, memory_format=CL),
        "unshuffle": lambda: F.pixel_unshuffle(x.to(torch.bfloat16), 4),
        "unshuffle_nhwc": lambda: F.pixel_unshuffle(x.to(torch.bfloat16), 4).contiguous(memory_format=CL),
    }
    ways["conv_nhwc"], ways["conv_nchw"] = conv(ways["nhwc"]), conv(ways["cast"])
    assert torch.equal(ways["to_both"](), ways["nhwc"]())
    assert torch.equal(ways["conv_nhwc"](), ways["conv_nchw"]())
    with torch.no_grad():
        for r in range(3):
            cells = []
            for name, way in ways.items():
                times = []
                for _ in range(20):
                    t0 = time.perf_counter()
                    way()
                    times.append(time.perf_counter() - t0)
                cells.append(f"{name} {1000 * sorted(times)[5]:.2f}")
            print(f"round {r + 1} (ms): " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()

"""The pieces of the bf16 train step measured alone, at batch 128, in one process: the input's
layout change and cast, conv1 as an 8x8 stride-4 conv against its space-to-depth form, and the
gathers a space-to-depth input would need from the replay ring. Each figure is the best of
several timed batches (ms). Run from the repository root:

    python results/investigations/cpu-intel-xeon-amx-2c-trainstep-floor/parts.py
"""

import time

import numpy as np
import torch
import torch.nn.functional as F

B, N = 128, 100_000
CL = torch.channels_last


def best_ms(fn, n=20, rounds=7) -> float:
    for _ in range(3):
        fn()
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t0) / n)
    return round(1000 * best, 3)


def s2d_weight(w):
    """(32, 4, 8, 8) -> (32, 64, 2, 2): input channel (frame, row in block, column in block)."""
    return w.reshape(32, 4, 2, 4, 2, 4).permute(0, 1, 3, 5, 2, 4).reshape(32, 64, 2, 2)


def main():
    torch.manual_seed(0)
    frames = torch.randint(0, 256, (B, 5, 84, 84), dtype=torch.uint8)  # a gathered batch: state = 0:4
    state = frames[:, :4]
    print("input, per state:")
    print("  uint8 -> NHWC -> bf16 (before)", best_ms(lambda: state.contiguous(memory_format=CL).to(torch.bfloat16)))
    print("  uint8 -> bf16 -> NHWC (after) ", best_ms(lambda: state.to(torch.bfloat16).contiguous(memory_format=CL)))

    def s2d_input():
        x = state.reshape(B, 4, 21, 4, 21, 4).permute(0, 2, 4, 1, 3, 5)  # (B, 21, 21, frame, row, column)
        return torch.empty(B, 21, 21, 4, 4, 4, dtype=torch.bfloat16).copy_(x)

    print("  space-to-depth NHWC bf16 from the ring's frames", best_ms(s2d_input))

    w = torch.randn(32, 4, 8, 8)
    x_cl = state.to(torch.bfloat16).contiguous(memory_format=CL)
    x_s2d = s2d_input().view(B, 21, 21, 64).permute(0, 3, 1, 2)
    w_cl = w.to(torch.bfloat16).contiguous(memory_format=CL).requires_grad_()
    w_s2d = s2d_weight(w).to(torch.bfloat16).contiguous(memory_format=CL).requires_grad_()
    bias = torch.zeros(32, dtype=torch.bfloat16, requires_grad=True)

    def forward_backward(x, weight, stride):
        F.conv2d(x, weight, bias, stride).sum().backward()

    print("conv1, bf16 NHWC:")
    print("  8x8/4 forward", best_ms(lambda: F.conv2d(x_cl, w_cl, bias, 4)))
    print("  2x2/1 on space-to-depth forward", best_ms(lambda: F.conv2d(x_s2d, w_s2d, bias, 1)))
    print("  8x8/4 forward+backward", best_ms(lambda: forward_backward(x_cl, w_cl, 4)))
    print("  2x2/1 on space-to-depth forward+backward", best_ms(lambda: forward_backward(x_s2d, w_s2d, 1)))
    same = F.conv2d(state.float(), w, None, 4)
    other = F.conv2d(x_s2d.float(), s2d_weight(w), None, 1)
    print("  fp32 max difference", float((same - other).abs().max()), "of", float(same.abs().max()))

    ring = torch.randint(0, 256, (N, 84, 84), dtype=torch.uint8)
    blocks = ring.reshape(N, 21, 4, 21, 4).permute(0, 1, 3, 2, 4).contiguous().view(N, 441, 16)  # 4x4 blocks
    rows = torch.randint(0, N - 5, (B,))[:, None] + torch.arange(5)
    out = np.empty((B, 5, 84, 84), np.uint8)
    pixels = torch.arange(441)[None, :, None]
    print("gathers from a ring of", N, "frames:")
    print("  np.take of whole frames (today)", best_ms(lambda: np.take(ring.numpy(), rows.numpy(), axis=0, out=out)))
    print("  4x4 blocks, pixel-major, advanced indexing", best_ms(lambda: blocks[rows[:, None, :], pixels]))


if __name__ == "__main__":
    main()

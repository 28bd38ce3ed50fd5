"""How close to its floor the bf16 train step's arithmetic alone can run on this CPU: the net's
and the target's forward and the backward, with every input already bf16 and NHWC, the weights
already bf16, no optimizer, no sampling, no casts, against the floor (``lib.bench.floor``) and
against stage 08's whole step (``lib.bench.trainstep``), all in one process, in rounds.

Each round measures, in this order:
- the bf16 matmul rate (2048 square) and so the floor of a step at batch 128;
- each layer alone, forward and backward, against its own share of that floor;
- the arithmetic of the whole step as above, with conv1 as it is (8x8 stride 4 over 4 channels)
  and as space-to-depth (2x2 stride 1 over 64 channels: the same arithmetic);
- the fused Adam step over the net's fp32 weights alone;
- stage 08's whole train step (``lib.bench.trainstep.time_train_step``, ``--capture none``).

If the arithmetic alone, in its best form, takes more than twice the floor, no change around the
net (sampling, casts, layout, the optimizer) brings the whole step within 2x: only faster
convolution kernels could. Run from the repository root, with nothing else on the machine:

    python results/investigations/cpu-intel-xeon-amx-2c-trainstep-floor/compute_alone.py [rounds]
"""

import sys

import torch
import torch.nn.functional as F
from parts import best_ms as best_of  # this folder's, beside this script
from parts import s2d_weight

from lib.bench import floor
from lib.bench.trainstep import SHAPE, filled_ring, time_train_step
from lib.model import DQN
from lib.optimizer import adam_options

B, CL, BF = 128, torch.channels_last, torch.bfloat16


def best_ms(fn) -> float:
    return best_of(fn, n=10, rounds=5)


def s2d_input(x):
    """(B, 4, 84, 84) -> (B, 64, 21, 21) in the channel order of ``s2d_weight``."""
    return x.reshape(B, 4, 21, 4, 21, 4).permute(0, 1, 3, 5, 2, 4).reshape(B, 64, 21, 21)


def weights(net: DQN, s2d: bool, grad: bool):
    """The net's (weight, bias, stride) per layer in bf16, conv weights NHWC."""
    out = []
    for i, layer in enumerate([net.conv[0], net.conv[2], net.conv[4], net.fc[0], net.fc[2]]):
        w = layer.weight.detach()
        if i == 0 and s2d:
            w = s2d_weight(w)
        w = w.to(BF)
        if w.dim() == 4:
            w = w.contiguous(memory_format=CL)
        stride = 1 if (i == 0 and s2d) else getattr(layer, "stride", (1,))[0]
        b = layer.bias.detach().to(BF)
        out.append((w.requires_grad_(grad), b.requires_grad_(grad), stride))
    return out


def forward(ws, x):
    for w, b, stride in ws[:3]:
        x = F.relu(F.conv2d(x, w, b, stride))
    x = F.relu(F.linear(x.flatten(1), *ws[3][:2]))
    return F.linear(x, *ws[4][:2]).float()


def main(rounds: int) -> None:
    torch.manual_seed(0)
    net = DQN(SHAPE, 6)
    macs = dict(net.layer_macs(SHAPE))
    frames = torch.randint(0, 256, (2, B, *SHAPE), dtype=torch.uint8)
    x = {False: [f.to(BF).contiguous(memory_format=CL) for f in frames],
         True: [s2d_input(f).to(BF).contiguous(memory_format=CL) for f in frames]}  # fmt: skip
    actions, rewards = torch.randint(0, 6, (B, 1)), torch.randn(B)
    params = {s2d: (weights(net, s2d, True), weights(net, s2d, False)) for s2d in (False, True)}

    def step(s2d: bool) -> None:
        ws, target = params[s2d]
        with torch.no_grad():
            next_q = forward(target, x[s2d][1]).max(1)[0]
        q = forward(ws, x[s2d][0]).gather(1, actions).squeeze(1)
        F.mse_loss(q, rewards + 0.99 * next_q).backward()
        for w, b, _ in ws:
            w.grad = b.grad = None

    # each layer alone: its input, forward, and forward + backward (conv1: no input gradient)
    layers, h = [], x[False][0]
    for (w, b, stride), name in zip(params[False][0], ("conv1", "conv2", "conv3", "fc1", "fc2")):
        h_in = h.flatten(1) if name == "fc1" else h
        h_in = h_in.detach().requires_grad_(name != "conv1")
        op = (
            (lambda i, w=w, b=b, s=stride: F.conv2d(i, w, b, s))
            if w.dim() == 4
            else (lambda i, w=w, b=b: F.linear(i, w, b))
        )
        with torch.no_grad():
            out = op(h_in)
        grad_out = torch.randn_like(out)  # the layout and dtype the layer's output has, as autograd's would
        wrt = (w, b) if name == "conv1" else (h_in, w, b)  # no gradient accumulated: autograd.grad returns them
        layers.append((name, h_in, op, grad_out, wrt))
        h = F.relu(out)

    fp32_params = [p for p in net.parameters()]
    for p in fp32_params:
        p.grad = torch.randn_like(p)
    adam = torch.optim.Adam(fp32_params, lr=1e-4, **adam_options(torch.device("cpu")))
    ring = filled_ring(20_000, 4)

    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, batch {B}, bf16")
    w1, f32 = net.conv[0].weight.detach(), frames[0].float()
    same, other = F.conv2d(f32, w1, None, 4), F.conv2d(s2d_input(f32), s2d_weight(w1), None, 1)
    print(
        f"conv1 as space-to-depth, fp32: max difference {float((same - other).abs().max()):.1e} of {float(same.abs().max()):.1f}"
    )
    for r in range(1, rounds + 1):
        rate = floor.matmul_rate("cpu", "bf16")
        floor_ms = floor.floor_ms(SHAPE, B, rate)
        print(f"round {r}: bf16 matmul {rate / 1e9:.0f} GFLOP/s, floor {floor_ms:.2f} ms")
        for name, h_in, op, grad_out, wrt in layers:
            fwd = best_ms(lambda op=op, h_in=h_in: op(h_in))
            both = best_ms(lambda op=op, h_in=h_in, wrt=wrt, g=grad_out: torch.autograd.grad(op(h_in), wrt, g))
            share = 1000 * 2 * B * macs[name] / rate  # one forward's floor, ms
            back_share = share * (1 if name == "conv1" else 2)
            print(f"  {name}: forward {fwd:.2f} ms ({fwd / share:.1f}x its floor {share:.2f}); "
                  f"forward+backward {both:.2f} ms ({both / (share + back_share):.1f}x {share + back_share:.2f})")  # fmt: skip
        plain, s2d = best_ms(lambda: step(False)), best_ms(lambda: step(True))
        print(f"  arithmetic alone, conv1 8x8/4: {plain:.1f} ms ({plain / floor_ms:.2f}x floor)")
        print(f"  arithmetic alone, conv1 space-to-depth 2x2/1: {s2d:.1f} ms ({s2d / floor_ms:.2f}x floor)")
        opt = best_ms(adam.step)
        print(f"  fused Adam over the fp32 weights: {opt:.2f} ms")
        whole, _ = time_train_step("cpu", "none", B, 40, ring, precision="bf16")
        print(f"  stage 08's whole step (--capture none): {whole:.1f} ms ({whole / floor_ms:.2f}x floor)")
        sys.stdout.flush()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)

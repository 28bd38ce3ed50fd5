"""The Nature-DQN network (Mnih et al. 2015) used by every stage."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class DQN(nn.Module):
    """conv 32x8x8/4, conv 64x4x4/2, conv 64x3x3/1, fc 512, fc n_actions; ReLU between.

    Takes uint8 frames (N, 4, 84, 84) and scales them to [0, 1] inside ``forward``, so that
    the replay buffer and the host-to-device copies move bytes, not floats.
    """

    def __init__(self, input_shape: tuple[int, int, int], n_actions: int):
        super().__init__()
        self.conv = nn.Sequential(
            nn.Conv2d(input_shape[0], 32, kernel_size=8, stride=4),
            nn.ReLU(),
            nn.Conv2d(32, 64, kernel_size=4, stride=2),
            nn.ReLU(),
            nn.Conv2d(64, 64, kernel_size=3, stride=1),
            nn.ReLU(),
        )
        conv_out = self.conv(torch.zeros(1, *input_shape)).numel()
        self.fc = nn.Sequential(
            nn.Linear(conv_out, 512),
            nn.ReLU(),
            nn.Linear(512, n_actions),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.uint8 and torch.is_autocast_enabled(x.device.type):
            # Under autocast (stages 06+) the pixels go in as they are: bf16 and fp16 hold
            # 0..255 exactly, and conv1(x / 255) == conv1 with its weights / 255. This skips
            # three passes over the batch (to fp32, divide, to bf16), a share of the step that
            # grows as the rest of the step gets cheaper.
            first = self.conv[0]
            x = x.to(torch.get_autocast_dtype(x.device.type))
            if first.weight.is_contiguous(memory_format=torch.channels_last):
                # NHWC weights (stages 06+) take NHWC input, laid out after the cast: a CPU
                # transposes 2-byte pixels faster than 1-byte ones (1.6 against 2.5 ms at batch 128).
                x = x.contiguous(memory_format=torch.channels_last)
            x = F.conv2d(x, first.weight / 255.0, first.bias, first.stride, first.padding)
            x = self.conv[1:](x)
        else:
            x = self.conv(x.float() / 255.0)
        hidden = self.fc[:-1](x.flatten(1))
        # The Q-value head stays in fp32 under autocast (stage 06): TD errors are small
        # differences of Q-values that bf16's 8-bit mantissa would round away.
        with torch.autocast(x.device.type, enabled=False):
            return self.fc[-1](hidden.float())

    def layer_macs(self, input_shape: tuple[int, int, int]) -> list[tuple[str, int]]:
        """(layer, multiply-adds for one input) of each conv and linear layer, in order: a conv's
        output elements times its kernel's inputs (in_channels x kh x kw), a linear layer's
        in x out. The arithmetic a forward pass cannot avoid; bias adds and ReLUs left out."""
        out, x = [], torch.zeros(1, *input_shape, device=self.fc[-1].weight.device)
        names = iter(("conv1", "conv2", "conv3", "fc1", "fc2"))
        for layer in [*self.conv, *self.fc]:
            if isinstance(layer, nn.Linear) and x.dim() > 2:
                x = x.flatten(1)
            with torch.no_grad():
                y = layer(x)
            if isinstance(layer, nn.Conv2d):
                out.append((next(names), y.numel() * layer.weight[0].numel()))
            elif isinstance(layer, nn.Linear):
                out.append((next(names), layer.in_features * layer.out_features))
            x = y
        return out


def train_step_flops(net: DQN, input_shape: tuple[int, int, int], batch: int) -> int:
    """Floating-point operations of one DQN train step on ``batch`` transitions (2 per
    multiply-add): the net's forward, the target net's forward, and the backward pass, which
    costs two forwards (the gradients of each layer's input and of its weights) less the first
    layer's input gradient, which nothing needs (the frames are not trained)."""
    macs = net.layer_macs(input_shape)
    forward = sum(m for _, m in macs)
    return 2 * batch * (forward + forward + 2 * forward - macs[0][1])


class ActiveUnits:
    """Which units of a DQN's ReLU layers were active (> 0) for some input since ``reset``: each
    conv layer's channels (active anywhere in the frame), the hidden fc layer's units.

    A layer none of whose units is active passes zeros on for every input: the net's Q is then
    the same for every state, and no gradient reaches the weights below that layer, so the net
    cannot learn again (docs/learning.md: stage 01 at lr 1e-4 loses its last conv layer so on
    some seeds). ``training_only`` counts only forwards made with gradients on (train steps)."""

    NAMES = ("conv1", "conv2", "conv3", "fc1")

    def __init__(self, net: DQN, training_only: bool = False):
        self.training_only = training_only
        relus = [m for m in [*net.conv, *net.fc] if isinstance(m, nn.ReLU)]
        self._handles = [relu.register_forward_hook(self._seen(i)) for i, relu in enumerate(relus)]
        self.reset()

    def _seen(self, i: int):
        def hook(module, inputs, out):
            if self.training_only and not torch.is_grad_enabled():
                return
            hit = (out > 0).flatten(2).any(2).any(0) if out.dim() == 4 else (out > 0).any(0)
            self._active[i] = hit if self._active[i] is None else self._active[i] | hit

        return hook

    def reset(self) -> None:
        self._active = [None] * len(self._handles)

    def counts(self) -> list[tuple[str, int, int]]:
        """(layer, units active, units) per layer; empty before the first forward."""
        if any(a is None for a in self._active):
            return []
        return [(name, int(a.sum()), a.numel()) for name, a in zip(self.NAMES, self._active)]

    def dead(self) -> list[str]:
        """The layers with no unit active."""
        return [name for name, active, _ in self.counts() if active == 0]

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()

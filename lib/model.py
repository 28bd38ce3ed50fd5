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
            x = F.conv2d(x, first.weight / 255.0, first.bias, first.stride, first.padding)
            x = self.conv[1:](x)
        else:
            x = self.conv(x.float() / 255.0)
        hidden = self.fc[:-1](x.flatten(1))
        # The Q-value head stays in fp32 under autocast (stage 06): TD errors are small
        # differences of Q-values that bf16's 8-bit mantissa would round away.
        with torch.autocast(x.device.type, enabled=False):
            return self.fc[-1](hidden.float())

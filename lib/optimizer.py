"""Adam as the stages build it: PyTorch's defaults and the article's learning rate everywhere
(``optim.Adam(net.parameters(), lr=params.learning_rate, ...)`` in each script), and from stage
06 on the fastest implementation the device has (``adam_options``), capturable where stage 08
captures its train step.
"""

from __future__ import annotations

import torch


def adam_options(device, capture: str = "none") -> dict:
    """Adam's keywords for the fastest multi-tensor update on ``device``: fused where this torch
    build has a fused Adam for it (CUDA; CPU since torch 2.4), foreach otherwise; and
    ``capturable=True`` where the train step is captured (``capture`` other than none, CUDA
    only: torch refuses it for CPU tensors), which keeps Adam's step counters on the device."""
    try:
        probe = torch.nn.Parameter(torch.zeros(1, device=device))
        torch.optim.Adam([probe], fused=True).step()
        options = {"fused": True}
    except (RuntimeError, TypeError, ValueError):
        options = {"foreach": True}
    if capture != "none" and torch.device(device).type == "cuda":
        options["capturable"] = True
    return options

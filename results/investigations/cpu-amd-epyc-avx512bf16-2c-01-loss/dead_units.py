"""A kept run's net on states from its own replay ring: the units of each ReLU layer active for
some of 1,024 of them (lib.model.ActiveUnits), the Q-values' spread over the states, and the
greedy actions. Needs the run's checkpoint.pt and replay-*.pt (kept on the machine that ran it,
never committed).

    python results/investigations/cpu-amd-epyc-avx512bf16-2c-01-loss/dead_units.py RUN_DIR ...
"""

import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3]))
from lib.model import DQN, ActiveUnits  # noqa: E402

STATES = 1024

torch.set_num_threads(1)
for run in map(pathlib.Path, sys.argv[1:]):
    checkpoint = torch.load(run / "checkpoint.pt", weights_only=False, map_location="cpu")
    ring = torch.load(next(run.glob("replay-*.pt")), weights_only=False, map_location="cpu")
    frames = ring["frames"]
    filled = min(ring["written"], frames.shape[0])
    picks = torch.randint(4, filled, (STATES,), generator=torch.Generator().manual_seed(0)).tolist()
    states = torch.stack([frames[i - 3 : i + 1] for i in picks])  # four consecutive ring frames each
    net = DQN((4, 84, 84), checkpoint["net"]["fc.2.weight"].shape[0])
    net.load_state_dict(checkpoint["net"])
    units = ActiveUnits(net)
    with torch.no_grad():
        q = net(states)
    print(f"{run} (ring written to frame {ring['transitions']}):")
    print("  units active: " + ", ".join(f"{name} {active}/{total}" for name, active, total in units.counts()))
    print("  Q, mean per action: " + " ".join(f"{x:.4f}" for x in q.mean(0).tolist()))
    print("  Q, std over the states per action: " + " ".join(f"{x:.4f}" for x in q.std(0).tolist()))
    print(
        "  greedy actions (count per action): "
        + " ".join(str(n) for n in torch.bincount(q.argmax(1), minlength=q.shape[1]).tolist())
    )

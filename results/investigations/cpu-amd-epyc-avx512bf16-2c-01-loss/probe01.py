"""Stage 01 as it is, watching its net's ReLUs (an investigation, not a stage).

Every WINDOW train steps it prints the units of each ReLU layer (a conv layer's channels, the
fc layer's units) that were active, > 0, for some input of the train batches in that window.
A layer with none active for a whole window has collapsed: no gradient reaches the weights
below it again, the net's Q no longer depends on its input, and the run is stopped (SIGTERM:
its summary and event files are written as on Ctrl-C).

    python results/investigations/cpu-amd-epyc-avx512bf16-2c-01-loss/probe01.py \\
        [--adam today|2017] [--lr LR] [01's flags ...]

--adam 2017 steps with torch 0.3's Adam (``adam03.py``); --lr replaces the Pong set's rate.
"""

import argparse
import os
import pathlib
import runpy
import signal
import sys

import torch

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path[:0] = [str(ROOT), str(HERE)]
from adam03 import Adam03  # noqa: E402

from lib import model, params  # noqa: E402

WINDOW = 1000

parser = argparse.ArgumentParser()
parser.add_argument("--adam", choices=["today", "2017"], default="today")
parser.add_argument("--lr", type=float)
ours, rest = parser.parse_known_args()
if ours.adam == "2017":
    torch.optim.Adam = Adam03
if ours.lr is not None:
    params.GAMES["pong"] = params.GAMES["pong"].replace(learning_rate=ours.lr)

watched = []  # the first DQN built is the trained net (01: net, then its target copy)
init = model.DQN.__init__


def watching_init(self, *args, **kwargs):
    init(self, *args, **kwargs)
    if watched:
        return
    units = model.ActiveUnits(self, training_only=True)
    steps = [0]

    def train_step_done(module, inputs, out):
        if not torch.is_grad_enabled():
            return  # acting, not training
        steps[0] += 1
        if steps[0] % WINDOW == 0:
            parts = " ".join(f"{name}={active}/{total}" for name, active, total in units.counts())
            print(f"PROBE train_steps={steps[0]} live {parts}", flush=True)
            dead = units.dead()
            units.reset()
            if dead:
                print(f"COLLAPSED train_steps={steps[0]}", flush=True)
                os.kill(os.getpid(), signal.SIGTERM)

    self.register_forward_hook(train_step_done)  # after the ReLUs' own hooks have counted
    watched.append(self)


model.DQN.__init__ = watching_init
sys.argv = ["01_dqn_basic.py"] + rest
runpy.run_path(str(ROOT / "01_dqn_basic.py"), run_name="__main__")

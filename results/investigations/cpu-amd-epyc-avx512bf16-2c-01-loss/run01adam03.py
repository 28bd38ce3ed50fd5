"""Stage 01 as it is, with torch 0.3's Adam (eps added to sqrt(v) before the bias correction)."""

import pathlib
import runpy
import sys

import torch

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path[:0] = [str(ROOT), str(HERE)]
from adam03 import Adam03  # noqa: E402

torch.optim.Adam = Adam03
sys.argv = ["01_dqn_basic.py"] + sys.argv[1:]
runpy.run_path(str(ROOT / "01_dqn_basic.py"), run_name="__main__")

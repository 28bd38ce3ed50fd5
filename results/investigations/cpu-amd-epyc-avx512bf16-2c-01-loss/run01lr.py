"""Stage 01 as it is, with the Pong set's learning rate replaced (an investigation, not a stage).

python results/investigations/cpu-amd-epyc-avx512bf16-2c-01-loss/run01lr.py LR [01's flags ...]
"""

import pathlib
import runpy
import sys

ROOT = pathlib.Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
from lib import params  # noqa: E402

params.GAMES["pong"] = params.GAMES["pong"].replace(learning_rate=float(sys.argv[1]))
sys.argv = ["01_dqn_basic.py"] + sys.argv[2:]
runpy.run_path(str(ROOT / "01_dqn_basic.py"), run_name="__main__")

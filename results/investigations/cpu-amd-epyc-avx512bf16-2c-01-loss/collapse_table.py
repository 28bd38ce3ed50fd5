"""The table of probe01.py's runs: for each folder given (a probe's --run-dir, holding its
run.log and the run's TensorBoard folder), the Adam and seed, the fewest last-conv-layer units
active in any 1,000-step window, the train step at which a layer had none (the collapse), the
first frame with TD loss below 0.015, and the last frame reached.

    python results/investigations/cpu-amd-epyc-avx512bf16-2c-01-loss/collapse_table.py DIR ...
"""

import re
import sys
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

LEVEL = 0.015
print(
    "| Adam | seed | fewest conv3 units active in a window (of 64) | collapsed at train step | first frame with loss < 0.015 | last frame |"
)
print("|---|---:|---:|---:|---:|---:|")
for folder in map(Path, sys.argv[1:]):
    log = (folder / "run.log").read_text()
    adam, seed = re.search(r"--adam (\S+) --seed (\d+)", (folder / "cmd").read_text()).groups()
    conv3 = [int(n) for n in re.findall(r"conv3=(\d+)/64", log)]
    collapsed = re.search(r"COLLAPSED train_steps=(\d+)", log)
    last = re.search(r"RESULT .* frames=(\d+)", log)
    run = next(p for p in folder.iterdir() if p.is_dir())
    acc = EventAccumulator(str(run), size_guidance={"scalars": 0})
    acc.Reload()
    points = acc.Scalars("loss")[1:]  # the first holds the first train step or few alone
    first = next((e.step for e in points if e.value < LEVEL), None)
    print(
        f"| {adam} | {seed} | {min(conv3) if conv3 else '—'} | {collapsed.group(1) if collapsed else '—'} | "
        f"{first if first is not None else 'never'} | {last.group(1) if last else 'running'} |"
    )

#!/bin/bash
# stage 08's f/s in each arm of the ablation, interleaved, on this machine: 3,000 training frames after a fill of 1,000
. .venv/bin/activate
# run from the repository root
for r in 1 2; do
  for arm in "base:" "steps1:--steps 1" "envs1:--envs 1" "fp32:--precision fp32"; do
    name=${arm%%:*}; flags=${arm#*:}
    line=$(python 08_graph_learner.py --device cpu --capture none --seed 0 --replay-initial 1000 --max-frames 4000 --quiet --run-dir /tmp/armfps/runs $flags 2>&1 | grep "^RESULT")
    echo "round $r arm $name: $line"
  done
done

#!/bin/bash
# stage 08's f/s in each arm of the ablation (and --lag zero, the weights'-age arm; from commit 0922760), interleaved, on this machine: 3,000 training frames after a fill of 1,000; ROUNDS=n for n rounds (2 unless set)
. .venv/bin/activate
# run from the repository root
for r in $(seq "${ROUNDS:-2}"); do
  for arm in "base:" "steps1:--steps 1" "envs1:--envs 1" "fp32:--precision fp32" "age0:--lag zero"; do
    name=${arm%%:*}; flags=${arm#*:}
    line=$(python 08_graph_learner.py --device cpu --capture none --seed 0 --replay-initial 1000 --max-frames 4000 --quiet --run-dir /tmp/armfps/runs $flags 2>&1 | grep "^RESULT")
    age=$(python -c "import glob, json, os; d = max(glob.glob('/tmp/armfps/runs/*/'), key=os.path.getmtime); print(json.load(open(d + 'summary.json'))['weights_age'])")
    echo "round $r arm $name: $line weights_age=$age"
  done
done

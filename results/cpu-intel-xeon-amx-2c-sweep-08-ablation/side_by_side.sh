#!/bin/bash
# Frames per hour of the ablation's machine: one run of stage 08 on both cores against two runs side
# by side with one thread each (as `lib.sweep --per-run-cpus 1` starts them), interleaved, 2 rounds;
# 3,000 training frames after a fill of 1,000, base settings. Run from the repository root.
. .venv/bin/activate
one() { python 08_graph_learner.py --device cpu --capture none --seed "$1" --replay-initial 1000 --max-frames 4000 \
  --quiet --run-dir /tmp/sidebyside/runs 2>&1 | grep "^RESULT"; }
for r in 1 2; do
  start=$(date +%s.%N); line=$(one 0); end=$(date +%s.%N)
  echo "round $r alone (2 threads): wall $(echo "$end - $start" | bc) s: $line"
  start=$(date +%s.%N)
  OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 one 0 > /tmp/sidebyside/a.txt &
  OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 one 1 > /tmp/sidebyside/b.txt &
  wait; end=$(date +%s.%N)
  echo "round $r side by side (1 thread each): wall $(echo "$end - $start" | bc) s: $(cat /tmp/sidebyside/a.txt) | $(cat /tmp/sidebyside/b.txt)"
done

#!/usr/bin/env bash
# Interleaved plain runs of stages 07 and 08 on CPU: the code before the GPU-readiness and
# structure changes (BEFORE, a checkout of 56d977f) against the code after (AFTER), one run
# after the other on a quiet machine, each 1,000 warm-up + 2,400 training frames, seed 0.
# Usage: bash ab.sh BEFORE_DIR AFTER_DIR OUT_DIR PAIRS
set -u
before=$1 after=$2 out=$3 pairs=${4:-2}
mkdir -p "$out"
for pair in $(seq 1 "$pairs"); do
  for stage in 07_vector_play 08_graph_learner; do
    for side in before after; do
      dir=$before; [ "$side" = after ] && dir=$after
      line=$(cd "$dir" && python "$stage.py" --device cpu --max-frames 3400 --replay-initial 1000 --seed 0 --quiet \
        --run-dir "$out/runs/$side-$pair" 2>&1 | grep "^RESULT")
      echo "pair=$pair side=$side $line" | tee -a "$out/ab.txt"
    done
  done
done

#!/bin/bash
# Stages 01, 02 and 08 run one after another from the tree before and the tree after, three
# rounds, the order of the trees swapped each round; one line per run: round, tree, stage, and
# its RESULT and TIME lines.
#   bash tight.sh BEFORE_TREE AFTER_TREE
set -euo pipefail
before=$1 after=$2
runs=$(mktemp -d)
trap 'rm -rf "$runs"' EXIT
for round in 1 2 3; do
  order="before after"
  [ "$round" = 2 ] && order="after before"
  for side in $order; do
    tree=$before
    [ "$side" = after ] && tree=$after
    for script in 01_dqn_basic 02_play_steps 08_graph_learner; do
      out=$(cd "$tree" && python $script.py --device cpu --max-frames 2200 --replay-initial 1000 --quiet --run-dir "$runs")
      echo "$round $side ${script%%_*} $(grep ^RESULT <<<"$out") $(grep ^TIME <<<"$out")"
    done
  done
done

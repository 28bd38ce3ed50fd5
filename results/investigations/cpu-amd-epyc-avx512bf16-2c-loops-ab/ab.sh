#!/bin/bash
# Two interleaved rounds of the bench's stage runs (01-08, no play-steps sweep), from the tree
# before the loops' restructure and from the tree after it, on the same machine and venv:
# round 1 before then after, round 2 after then before.
#   bash ab.sh BEFORE_TREE AFTER_TREE OUT
set -euo pipefail
before=$1 after=$2 out=$3
for round in 1 2; do
  order="before after"
  [ "$round" = 2 ] && order="after before"
  for side in $order; do
    tree=$before
    [ "$side" = after ] && tree=$after
    (cd "$tree" && python -m lib.bench --device cpu --no-sweep --repeat 1 --frames 1200 --bound-seconds 1 \
      --out "$out" --tag "$side-$round")
  done
done

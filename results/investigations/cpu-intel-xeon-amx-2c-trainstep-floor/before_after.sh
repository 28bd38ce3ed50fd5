#!/bin/bash
# interleaved before/after of the train step bench, same machine, one at a time
# BEFORE: a checkout of 3261f3c (the floor in the bench, the input made NHWC as bytes); AFTER: of the commit after it
BEFORE=${BEFORE:?a checkout of 3261f3c}; AFTER=${AFTER:-.}
. $AFTER/.venv/bin/activate
for r in 1 2 3; do
  for t in before after; do
    dir=$AFTER; [ $t = before ] && dir=$BEFORE
    echo "== round $r $t $(cd $dir && git rev-parse --short HEAD) $(date -Is) load $(cut -d' ' -f1 /proc/loadavg)"
    (cd $dir && python -m lib.bench.trainstep --device cpu --capture none --precision bf16,fp32 --batch 128 --iters 100 --envs 4)
  done
done

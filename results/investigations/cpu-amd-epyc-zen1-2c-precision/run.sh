#!/usr/bin/env bash
# bf16 autocast against fp32 on this CPU: stage 08's train step alone, then stage 08 itself, interleaved.
# Run from the repository root on an otherwise idle machine: bash results/investigations/cpu-amd-epyc-zen1-2c-precision/run.sh
set -euo pipefail
out=results/investigations/cpu-amd-epyc-zen1-2c-precision
runs=$(mktemp -d)
trap 'rm -rf "$runs"' EXIT
: > "$out/trainstep.log"
for i in 1 2; do
  python -m lib.bench.trainstep --device cpu --capture none --precision bf16,fp32 --batch 128 --iters 20 \
    --replay-size 100000 --envs 4 | tee -a "$out/trainstep.log"
done
: > "$out/stage08.log"
for p in bf16 fp32; do
  python 08_graph_learner.py --device cpu --precision "$p" --max-frames 1600 --replay-initial 1000 \
    --run-dir "$runs/$p" --quiet 2>&1 | grep -E '^(stage|RESULT)' | tee -a "$out/stage08.log"
done

#!/usr/bin/env bash
# The GPU check behind results/gpu-*/: one prepared run on a machine with one GPU.
#   1. the benchmark alone on CUDA (every stage, the N sweep, the bounds);
#   2. then, side by side on the same GPU: stage 07 until Pong is solved, and stages 05 and
#      06 with the same seed for up to 300k frames (their reward_100 curves must agree).
# Usage: bash results/gpu_check.sh OUTDIR [BENCH_SECONDS] [RUNS_SECONDS]
# Wheels in .whl/ (gymnasium, ale-py) are installed first where the machine lacks them.
set -u
out=${1:?usage: gpu_check.sh OUTDIR [BENCH_SECONDS] [RUNS_SECONDS]}
bench_s=${2:-260}
runs_s=${3:-300}
export PYTHONUNBUFFERED=1
if ! python3 -c "import gymnasium, ale_py" 2>/dev/null && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
mkdir -p "$out"
{ nvidia-smi -L; nproc; python3 -c "import torch, gymnasium, ale_py; print(torch.__version__, gymnasium.__version__, ale_py.__version__)"; } 2>&1 | tee "$out/machine.txt"
device=${DEVICE:-cuda}

bench_args=${BENCH_ARGS:---frames 3000 --sweep-frames 1000 --bound-seconds 2}
timeout -s INT "$bench_s" python3 -m lib.bench --device "$device" $bench_args --out "$out/results" 2>&1 | tee "$out/bench.log"

frames=${CURVE_FRAMES:-300000}
solve_frames=${SOLVE_FRAMES:-2000000}
timeout "$runs_s" python3 07_vector_play.py --device "$device" --envs ${SOLVE_ENVS:-12} --max-frames "$solve_frames" \
  --run-dir "$out/runs/solve" --progress 15 --quiet > "$out/solve07.log" 2>&1 &
for s in 05_new_wrapper 06_bf16_learner; do
  timeout "$runs_s" python3 $s.py --device "$device" --seed 1 --max-frames "$frames" \
    --run-dir "$out/runs/curves" --progress 30 --quiet > "$out/${s%%_*}.log" 2>&1 &
done
wait
grep -h RESULT "$out"/*.log
python3 -m lib.curves "$out/runs/curves" --out "$out/curves_05_06.png" 2>&1 | tail -5
python3 -m lib.curves "$out/runs/solve" --out "$out/solve07.png" 2>&1 | tail -5

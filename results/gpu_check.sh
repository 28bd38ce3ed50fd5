#!/usr/bin/env bash
# The GPU check behind results/gpu-*/: one prepared run on a machine with one GPU, over within
# 9 minutes (TOTAL_SECONDS, default 540), every step under its own timeout:
#   tests   the CUDA tests (pytest -m cuda, up to 90 s): the captured train step against the
#           eager one, no host sync during replay, no recompilation of the compiled form after
#           warm-up, the device replay ring on CUDA;
#   bench   the bench on CUDA, one round of short budgets, no N sweep, every stage (01-08);
#   timing  stage 08's train step at batch 128 in each form (eager, hand-captured CUDA graph,
#           torch.compile reduce-overhead), CUDA events, after a full 100k ring is written;
#   solve   stage 08 on Pong, seed 1, until solved or the time is up, and its curve. It gets
#           what the other steps leave (at least 200 s); PARTS=solve gives it the whole budget,
#           which is the way to test "Pong solved in under 5 minutes".
#   sweep   (only when asked: PARTS=sweep) stages 07 and 08 x seeds 0-2 side by side on the one
#           GPU (a third of it each) through lib.sweep, with their seed statistics.
# Usage: bash results/gpu_check.sh OUTDIR
#   PARTS=tests,bench,timing,solve (default; PARTS=solve gives the solve the whole time)
#   BENCH_ARGS, BENCH_SECONDS, SOLVE_ENVS, TIMING_ARGS, TOTAL_SECONDS, CAPTURES override the
#   defaults below. DEVICE=cpu runs the same steps on the CPU (the timing in the eager form
#   alone): a dry run of the script itself, whose figures mean nothing for the GPU.
# A GPU machine whose Python has torch but not the emulator: first, on a machine with a package
# index, `bash results/gpu_wheels.sh 3.12` (that machine's Python version) puts the wheels of
# gymnasium and ale-py in .whl/; copy .whl/ along with the working tree, and they are installed
# here into /tmp/site before anything runs.
set -u
out=${1:?usage: gpu_check.sh OUTDIR}
total=${TOTAL_SECONDS:-540}
parts=,${PARTS:-tests,bench,timing,solve},
deadline=$((SECONDS + total))
export PYTHONUNBUFFERED=1
mkdir -p "$out"
log="$out/check.log"

# seconds for a step: WANT, but never past the deadline less RESERVE (the steps still to come)
budget() {
  local want=$1 reserve=${2:-0} left=$((deadline - SECONDS - ${2:-0}))
  [ "$left" -lt "$want" ] && want=$left
  [ "$want" -lt 1 ] && want=1
  echo "$want"
}
has() { [[ $parts == *",$1,"* ]]; }
say() { echo "[gpu_check $(date +%H:%M:%S) +${SECONDS}s] $*" | tee -a "$log"; }

if ! python3 -c "import gymnasium, ale_py" 2>/dev/null; then
  if ls .whl/*.whl >/dev/null 2>&1; then
    timeout 90 python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  fi
  if ! why=$(python3 -c "import gymnasium, ale_py" 2>&1); then
    say "$(echo "$why" | tail -1)"
    say "gymnasium and ale-py cannot be imported: run results/gpu_wheels.sh where pip reaches an index, bring .whl/"
    exit 1
  fi
fi

say "hardware"
timeout 30 bash -c '
  nvidia-smi -L
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,power.limit --format=csv
  echo "cpu cores: $(nproc); $(grep -m1 "model name" /proc/cpuinfo)"
  free -g | head -2
  python3 -c "import sys, torch, gymnasium, ale_py; print(sys.version.split()[0], torch.__version__, torch.version.cuda, gymnasium.__version__, ale_py.__version__)"
' 2>&1 | tee "$out/machine.txt"
device=${DEVICE:-cuda}
envs=${SOLVE_ENVS:-16}
if [ "$device" = cuda ]; then captures=${CAPTURES:-none,graph,compile}; else captures=${CAPTURES:-none}; fi

# Reserves: what the later steps need at least, so that a slow step cannot starve the solve.
reserve_solve=$(has solve && echo 225 || echo 0)
reserve_timing=$(has timing && echo 60 || echo 0)

if has tests; then
  say "CUDA tests"
  if python3 -c "import pytest" 2>/dev/null; then
    timeout "$(budget 90 $((reserve_solve + reserve_timing)))" python3 -m pytest -q -m cuda -p no:cacheprovider \
      tests/test_replay_device.py tests/test_graph_step.py 2>&1 | tail -25 | tee "$out/tests_cuda.log"
  else
    echo "pytest is not installed here: the CUDA tests did not run" | tee "$out/tests_cuda.log"
  fi
fi

if has bench; then
  say "bench"
  bench_args=${BENCH_ARGS:---repeat 1 --no-sweep --frames 1500 --replay-initial 1000 --bound-seconds 1}
  timeout -s INT "$(budget "${BENCH_SECONDS:-150}" $((reserve_solve + reserve_timing)))" \
    python3 -m lib.bench --device "$device" $bench_args --envs "$envs" --out "$out/results" 2>&1 | tee "$out/bench.log"
fi

if has timing; then
  timing_args=${TIMING_ARGS:---batch 128 --iters 200}
  say "train step forms: $timing_args"
  timeout "$(budget 75 "$reserve_solve")" python3 -m lib.graph_step --device "$device" --capture "$captures" \
    $timing_args 2>&1 | tail -20 | tee "$out/trainstep.log"
fi

if has solve; then
  solve_s=$(budget 100000 25)
  say "stage 08 on Pong, seed 1, K=$envs, up to $solve_s s"
  timeout "$solve_s" python3 08_graph_learner.py --device "$device" --seed 1 --envs "$envs" \
    --run-dir "$out/runs/solve" --progress 15 --quiet > "$out/solve08.log" 2>&1
  grep -h "RESULT\|ready in\|error" "$out/solve08.log" | tee -a "$log"
  timeout 20 python3 -m lib.curves "$out/runs/solve" --out "$out/solve08.png" 2>&1 | tail -5 | tee -a "$log"
fi

if has sweep; then
  say "seed sweep: stages 07 and 08 x seeds 0-2 on one GPU"
  RAY_USAGE_STATS_ENABLED=0 timeout -s INT "$(budget 100000 10)" python3 -m lib.sweep --stages 07,08 --seeds 0-2 \
    --games pong --max-frames "${SWEEP_FRAMES:-400000}" --per-run-gpus 0.33 --per-run-cpus 2 --out "$out/sweep" \
    -- --envs "$envs" 2>&1 | tail -40 | tee "$out/sweep.log"
fi

say "done"
grep -h "^RESULT\|^TRAINSTEP" "$out"/bench.log "$out"/trainstep.log "$out"/solve08.log 2>/dev/null
tail -1 "$out/tests_cuda.log" 2>/dev/null

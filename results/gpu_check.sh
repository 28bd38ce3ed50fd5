#!/usr/bin/env bash
# The GPU check behind results/gpu-*/: one prepared run on a machine with one GPU, over within
# 8.5 minutes (TOTAL_SECONDS, default 510), its steps ordered by the value of what they bring
# back, each under its own timeout, each leaving its output in OUTDIR:
#   deps      one import line for every runtime dependency (torch with CUDA, gymnasium, ale-py,
#             cv2, tensorboard, matplotlib), one clear line for a missing one       deps.log
#   hardware  GPU, driver, CPU cores, memory, library versions                       machine.txt
#   tests     the CUDA tests except the compiled form's (pytest -m cuda, up to 60 s) tests_cuda.log
#   solve     stage 08 on Pong, seed 1, --envs auto, up to 300 s: its RESULT line (f/s), PROGRESS
#             lines, and the curve of reward_100 against frames and minutes        solve08.log/.png
#             If the run fails (e.g. in capture), its log is kept (solve08_failed.log) and the same
#             run starts again with --capture none for the time left, so a figure comes back anyway.
#   timing    stage 08's train step at batch 128, eager and hand-captured graph, each in bf16
#             and fp32 (CUDA events, up to 60 s)                                   trainstep.log
#   bench     the bench of 01-08, one round of short budgets                       bench.log, results/
#   compiled  last: the compiled form's no-recompilation test and its timing       compiled.log
# summary.txt gets one line per step as it ends (passed, failed, timed out, skipped, with its
# seconds and key figure), so a run cut short still says what it did.
# Usage: bash results/gpu_check.sh OUTDIR
#   PARTS=deps,hardware,tests,solve,timing,bench,compiled (the default: all, in this order)
#   SOLVE_SECONDS (300), SOLVE_ENVS (auto), TIMING_ARGS, BENCH_ARGS, TOTAL_SECONDS override.
#   DEVICE=cpu runs the same steps on the CPU (the train step eager alone): a dry run of the
#   script itself, whose figures mean nothing for the GPU.
# A GPU machine whose Python has torch but not the emulator: first, on a machine with a package
# index, `bash results/gpu_wheels.sh 3.12` (that machine's Python version) puts the wheels of
# gymnasium and ale-py in .whl/; copy .whl/ along with the working tree, and they are installed
# here into /tmp/site before anything runs.
set -u
out=${1:?usage: gpu_check.sh OUTDIR}
total=${TOTAL_SECONDS:-510}
parts=,${PARTS:-deps,hardware,tests,solve,timing,bench,compiled},
device=${DEVICE:-cuda}
deadline=$((SECONDS + total))
export PYTHONUNBUFFERED=1 RAY_USAGE_STATS_ENABLED=0
mkdir -p "$out"
log="$out/check.log"
summary="$out/summary.txt"
: > "$summary"

has() { [[ $parts == *",$1,"* ]]; }
say() { echo "[gpu_check $(date +%H:%M:%S) +${SECONDS}s] $*" | tee -a "$log" >&2; }
# seconds for a step: WANT, but never past the deadline
budget() {
  local want=$1 left=$((deadline - SECONDS))
  [ "$left" -lt "$want" ] && want=$left
  echo "$want"
}
# record STEP STATUS STARTED DETAIL: one line of summary.txt
record() {
  printf '%-9s %-10s %4ss  %s\n' "$1" "$2" "$((SECONDS - $3))" "$4" | tee -a "$summary" >> "$log"
}
# status of an exit code under timeout(1)
status_of() {
  case $1 in 0) echo passed ;; 124 | 137) echo "timed out" ;; *) echo "failed ($1)" ;; esac
}
# start STEP WANT: print the step's budget, or record it as skipped and return 1
start() {
  local b
  b=$(budget "$2")
  if [ "$b" -lt 5 ]; then
    record "$1" skipped "$SECONDS" "no time left of the ${total} s"
    return 1
  fi
  say "$1 (up to ${b} s)"
  echo "$b"
}

# -- deps: the emulator's wheels where they travelled with the tree, then one line per import --
t0=$SECONDS
if has deps; then
  if ! python3 -c "import gymnasium, ale_py" 2>/dev/null && ls .whl/*.whl >/dev/null 2>&1; then
    timeout 90 python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl >> "$out/deps.log" 2>&1
  fi
fi
[ -d /tmp/site ] && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
if has deps; then
  timeout 60 python3 - "$device" > "$out/deps.log" 2>&1 <<'EOF'
import importlib, sys
missing = []
for name, module in [("torch", "torch"), ("gymnasium", "gymnasium"), ("ale-py", "ale_py"), ("opencv", "cv2"),
                     ("tensorboard", "tensorboard"), ("matplotlib", "matplotlib")]:
    try:
        mod = importlib.import_module(module)
    except Exception as e:
        print(f"MISSING {name}: {type(e).__name__}: {e}".splitlines()[0])
        missing.append(name)
        continue
    line = f"ok {name} {getattr(mod, '__version__', '?')}"
    if module == "torch":
        cuda = mod.cuda.is_available()
        line += f" (CUDA {mod.version.cuda}, device: {mod.cuda.get_device_name(0) if cuda else 'none'})"
        if sys.argv[1] == "cuda" and not cuda:
            print(line.replace("ok", "MISSING", 1) + ": torch sees no CUDA device")
            missing.append("CUDA")
            continue
    print(line)
sys.exit(1 if missing else 0)
EOF
  rc=$?
  cat "$out/deps.log" | tee -a "$log"
  if [ "$rc" -ne 0 ]; then
    record deps failed "$t0" "$(grep -m3 MISSING "$out/deps.log" | tr '\n' ';')"
    say "a runtime dependency is missing (see deps.log): for gymnasium or ale-py run results/gpu_wheels.sh where pip reaches an index and bring .whl/"
    exit 1
  fi
  record deps passed "$t0" "$(grep -m1 '^ok torch' "$out/deps.log")"
fi

# -- hardware --------------------------------------------------------------------------------
t0=$SECONDS
if has hardware; then
  timeout 30 bash -c '
    command -v nvidia-smi >/dev/null && nvidia-smi -L &&
      nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,power.limit --format=csv
    echo "cpu cores: $(nproc); $(grep -m1 "model name" /proc/cpuinfo)"
    free -g | head -2
    python3 -c "import sys, torch, gymnasium, ale_py; print(sys.version.split()[0], torch.__version__, torch.version.cuda, gymnasium.__version__, ale_py.__version__)"
    echo "commit $(git describe --always --dirty --abbrev=7 2>/dev/null)"
  ' > "$out/machine.txt" 2>&1
  rc=$?
  tee -a "$log" < "$out/machine.txt"
  record hardware "$(status_of $rc)" "$t0" "$(head -1 "$out/machine.txt")"
fi

# -- tests: the CUDA tests but the compiled form's ---------------------------------------------
t0=$SECONDS
if has tests; then
  if b=$(start tests 60); then
    if python3 -c "import pytest" 2>/dev/null; then
      timeout "$b" python3 -m pytest -q -m cuda -k "not compiled_step" -p no:cacheprovider tests > "$out/tests_cuda.log" 2>&1
      rc=$?
      tail -15 "$out/tests_cuda.log" | tee -a "$log"
      record tests "$(status_of $rc)" "$t0" "$(tail -1 "$out/tests_cuda.log")"
    else
      echo "pytest is not installed here: the CUDA tests did not run" | tee "$out/tests_cuda.log"
      record tests skipped "$t0" "pytest is not installed"
    fi
  fi
fi

# -- solve: stage 08 on Pong, seed 1 ----------------------------------------------------------
solve_run() {  # solve_run LOG SECONDS [flags]: stage 08, stopped by SIGINT at the time limit (RESULT still printed)
  local to=$1 secs=$2
  shift 2
  timeout -s INT -k 30 "$secs" python3 08_graph_learner.py --device "$device" --seed 1 --envs "${SOLVE_ENVS:-auto}" \
    --run-dir "$out/runs/solve" --progress 15 --quiet "$@" > "$to" 2>&1
}
t0=$SECONDS
if has solve; then
  if b=$(start solve "${SOLVE_SECONDS:-300}"); then
    solve_run "$out/solve08.log" "$b"
    rc=$?
    detail=""
    if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && ! grep -q "interrupted=SIGINT" "$out/solve08.log"; then
      mv "$out/solve08.log" "$out/solve08_failed.log"
      grep -h "error\|Error" "$out/solve08_failed.log" | tail -3 | tee -a "$log"
      left=$((b - (SECONDS - t0)))
      detail="the first run failed (exit $rc, solve08_failed.log); again with --capture none: "
      if [ "$left" -ge 20 ]; then
        say "solve: again with --capture none, up to ${left} s"
        solve_run "$out/solve08.log" "$left" --capture none
        rc=$?
      fi
    fi
    grep -h "^stage 08\|^acting\|ready in\|PROGRESS\|RESULT\|error" "$out/solve08.log" 2>/dev/null | tail -8 | tee -a "$log"
    timeout 30 python3 -m lib.curves "$out/runs/solve" --out "$out/solve08.png" > "$out/solve08_curve.log" 2>&1
    tail -6 "$out/solve08_curve.log" | tee -a "$log"
    result=$(grep -h "^RESULT" "$out/solve08.log" 2>/dev/null | tail -1)
    status=$(status_of "$rc")
    grep -q "solved=yes" <<< "$result" && status=solved
    grep -q "interrupted=SIGINT" <<< "$result" && status="time up"
    record solve "$status" "$t0" "${detail}${result:-no RESULT line}"
  fi
fi

# -- timing: the train step, eager and captured ------------------------------------------------
# On CUDA each form in bf16 and fp32 (a launch-bound step may not gain from bf16); a CPU dry run takes --precision auto.
if [ "$device" = cuda ]; then forms=none,graph precisions=bf16,fp32; else forms=none precisions=auto; fi
t0=$SECONDS
if has timing; then
  if b=$(start timing 60); then
    timing_args=${TIMING_ARGS:---batch 128 --iters 200}
    timeout "$b" python3 -m lib.bench.trainstep --device "$device" --capture "$forms" --precision "$precisions" $timing_args > "$out/trainstep.log" 2>&1
    rc=$?
    tail -5 "$out/trainstep.log" | tee -a "$log"
    record timing "$(status_of $rc)" "$t0" "$(grep -h '^TRAINSTEP' "$out/trainstep.log" | sed 's/ device=.*ms=/ ms=/; s/ prepare_s.*//' | tr '\n' ' ')"
  fi
fi

# -- bench: 01-08, one round, short budgets ----------------------------------------------------
t0=$SECONDS
if has bench; then
  if b=$(start bench 150); then
    bench_args=${BENCH_ARGS:---repeat 1 --no-sweep --frames 1500 --replay-initial 1000 --bound-seconds 1}
    timeout -s INT -k 20 "$b" python3 -m lib.bench --device "$device" $bench_args --out "$out/results" > "$out/bench.log" 2>&1
    rc=$?
    grep -h "^RESULT" "$out/bench.log" | tee -a "$log"
    record bench "$(status_of $rc)" "$t0" "$(grep -c '^RESULT' "$out/bench.log") stage runs; $(grep -h '^RESULT' "$out/bench.log" | sed 's/.*stage=\([0-9]*\).* fps=\([0-9.]*\).*/\1:\2/' | tr '\n' ' ')"
  fi
fi

# -- compiled: torch.compile's form, last (Inductor compiles for tens of seconds) ---------------
t0=$SECONDS
if has compiled; then
  if b=$(start compiled 120); then
    {
      timeout "$b" python3 -m pytest -q -m cuda -k "compiled_step" -p no:cacheprovider tests
      echo "test exit $?"
      left=$((b - (SECONDS - t0)))
      [ "$left" -ge 10 ] && timeout "$left" python3 -m lib.bench.trainstep --device "$device" --capture compile ${TIMING_ARGS:---batch 128 --iters 200}
    } > "$out/compiled.log" 2>&1
    rc=$?
    tail -5 "$out/compiled.log" | tee -a "$log"
    record compiled "$(status_of $rc)" "$t0" "$(grep -h '^TRAINSTEP\|passed\|failed' "$out/compiled.log" | tr '\n' ' ')"
  fi
fi

say "done"
cat "$summary"

#!/usr/bin/env bash
# The GPU check behind results/gpu-*/: one prepared run on a machine with one GPU, over within
# 9 minutes (TOTAL_SECONDS, default 540, every step's kill grace included), its steps ordered by
# the value of what they bring back, each under its own budget (a timeout at the budget less its
# kill grace, then the kill), in a scratch folder outside OUTDIR:
#   deps      the emulator's wheels from .whl/ where they travelled (pip's output kept), then
#             one import line for every runtime dependency (torch with CUDA, gymnasium, ale-py,
#             cv2, tensorboard, matplotlib), one clear line for a missing one       deps.log
#   hardware  GPU, driver, CPU cores, memory, library versions, the commit          machine.txt
#   tests     the CUDA tests except the compiled form's (pytest -m cuda, up to 60 s) tests_cuda.log
#   solve     stage 08 on Pong, seed 1, --envs auto, up to 270 s (less where the steps before it
#             ran long): its RESULT line (f/s), PROGRESS lines, run folder    solve08/solve08.log
#             If the run fails, or hangs (no line of output for SOLVE_STALL_SECONDS, 90), it is
#             stopped, its folder kept, and the same run starts again with --capture none (no
#             graph in the trainer nor the play process) for the time left, in a folder of its
#             own, run to its limit, so a figure comes back anyway.  solve08-capture-none/
#             Where that one fails too (it ends early without a good RESULT line), stage 07
#             (the same learning per frame, its learner on the host) runs to its limit in the
#             time left: an f/s figure of the stages before 08 here.  solve07/solve07.log
#             While a run goes on, the bundle is packed again every PACK_SECONDS (60), so that a
#             machine taken back mid-solve still returns its log so far.
#   curve     reward_100 against frames and minutes, of the solve's runs (up to 20 s) solve08.png/.md
#             (skipped where the solve finished no game: no point to draw)
#   timing    stage 08's train step at batch 128, eager and hand-captured graph, each in bf16
#             and fp32 (CUDA events, up to 45 s)                                   trainstep.log
#   bench     the bench of 07 and 08 (K auto), one round of 10,000 frames (up to 110 s) bench.log, bench/
#   compiled  last, in the time left: the compiled form's no-recompilation test and its
#             timing, "skipped: no time left" under 30 s                           compiled.log
# OUTDIR stays small enough to copy off a remote machine in one piece (at most 8 files, 16 MiB
# each, two folders deep): it holds three files, rewritten as each step ends so that a run cut short still
# brings back what it did:
#   summary.txt          the commit, then one line per step (passed, failed, timed out, hung,
#                        skipped, with its seconds and key figure)
#   solve08_result.txt   the solve's RESULT and TIME (time by part) lines
#   bundle.tar.gz        gpu_check/: every log above, the run folders (summary.json, event files;
#                        no checkpoints), the curve and the bench's folder; under BUNDLE_LIMIT bytes
#                        (16,000,000): past it the largest files are left out, named in DROPPED.txt
# The commit: git's where the tree has .git, else .whl/COMMIT (written by gpu_wheels.sh beside the
# wheels), else "unknown".
# Usage: bash results/gpu_check.sh OUTDIR
#   PARTS=deps,hardware,tests,solve,timing,bench,compiled (the default: all, in this order; the
#   curve goes with the solve)
#   SOLVE_SECONDS (270), SOLVE_ENVS (auto), SOLVE_STALL_SECONDS (90), PACK_SECONDS (60), BENCH_SECONDS (110),
#   TIMING_ARGS, BENCH_ARGS, TOTAL_SECONDS, BUNDLE_LIMIT override; WORK names the scratch folder
#   (default: a new one under /tmp, removed at the end); SOLVE_PYTHON (python3) runs the solve.
#   DEVICE=cpu runs the same steps on the CPU (the train step eager alone): a dry run of the
#   script itself, whose figures mean nothing for the GPU.
# A GPU machine whose Python has torch but not the emulator: first, on a machine with a package
# index, `bash results/gpu_wheels.sh 3.12` (that machine's Python version) puts the wheels of
# gymnasium and ale-py, and the commit, in .whl/; copy .whl/ along with the working tree, and the
# wheels are installed here into /tmp/site before anything runs.
set -u
out=${1:?usage: gpu_check.sh OUTDIR}
mkdir -p "$out" && out=$(cd "$out" && pwd)
total=${TOTAL_SECONDS:-540}
parts=,${PARTS:-deps,hardware,tests,solve,timing,bench,compiled},
device=${DEVICE:-cuda}
limit=${BUNDLE_LIMIT:-16000000}
deadline=$((SECONDS + total - 10)) # the last 10 s pack what was done
export PYTHONUNBUFFERED=1 RAY_USAGE_STATS_ENABLED=0
if [ -n "${WORK:-}" ]; then
  top=$WORK
  mkdir -p "$top"
else
  top=$(mktemp -d)
  trap 'rm -rf "$top"' EXIT
fi
top=$(cd "$top" && pwd)
work=$top/gpu_check # what the archive holds
mkdir -p "$work"
cd "$(dirname "$0")/.." || exit 1
log="$work/check.log"
summary="$out/summary.txt"

has() { [[ $parts == *",$1,"* ]]; }
say() { echo "[gpu_check $(date +%H:%M:%S) +${SECONDS}s] $*" | tee -a "$log" >&2; }

# The scratch folder into OUTDIR: bundle.tar.gz, written beside and renamed (a run cut short
# leaves the last whole archive); the largest files are left out while it is over the limit.
pack() {
  local list=$top/bundle.list drop=$work/DROPPED.txt part=$out/bundle.tar.gz.part size big
  cp -f "$summary" "$work/summary.txt"
  rm -f "$drop"
  (cd "$top" && find gpu_check -type f ! -name '*.pt' ! -name DROPPED.txt -printf '%s %p\n') | sort -rn > "$list"
  while :; do
    { cut -d' ' -f2- "$list"; [ -f "$drop" ] && echo gpu_check/DROPPED.txt; } |
      tar -czf "$part" -C "$top" --no-recursion -T - 2>/dev/null
    size=$(stat -c %s "$part")
    big=$(head -1 "$list")
    [ "$size" -le "$limit" ] || [ -z "$big" ] && break
    echo "left out ${big#* } (${big%% *} bytes): the archive was ${size} bytes, over ${limit}" >> "$drop"
    sed -i 1d "$list"
  done
  mv -f "$part" "$out/bundle.tar.gz"
}
trap 'say "stopped by SIGTERM"; pack; exit 143' TERM

# The commit, read before anything runs: git's, else the one gpu_wheels.sh wrote before the tree travelled.
if commit=$(git describe --always --dirty --abbrev=7 2>/dev/null) && [ -n "$commit" ]; then
  commit="$commit (git)"
elif [ -s .whl/COMMIT ]; then
  commit="$(head -1 .whl/COMMIT) (.whl/COMMIT)"
else
  commit="unknown (no .git, no .whl/COMMIT)"
fi
echo "commit $commit; device $device; ${total} s" > "$summary"
say "commit $commit"

# Budgets: a step gets WANT seconds, never past the deadline nor into what the steps after it
# keep (their WANT; the solve keeps up to 150 s, the compiled step, last, nothing).
declare -A want=([deps]=80 [hardware]=20 [tests]=60 [solve]=${SOLVE_SECONDS:-270} [curve]=20 [timing]=45
  [bench]=${BENCH_SECONDS:-110} [compiled]=120)
order=(deps hardware tests solve curve timing bench)
kept_after() {
  local s after=0 sum=0 keep
  for s in "${order[@]}"; do
    if [ "$after" = 1 ] && has "${s/curve/solve}"; then
      keep=${want[$s]}
      [ "$s" = solve ] && [ "$keep" -gt 150 ] && keep=150
      sum=$((sum + keep))
    fi
    [ "$s" = "$1" ] && after=1
  done
  echo "$sum"
}
budget() {
  local left=$((deadline - SECONDS - $(kept_after "$1"))) w=${want[$1]}
  [ "$left" -lt "$w" ] && w=$left
  echo "$w"
}
# record STEP STATUS STARTED DETAIL: one line of summary.txt
record() {
  printf '%-9s %-10s %4ss  %s\n' "$1" "$2" "$((SECONDS - $3))" "$4" | tee -a "$summary" >> "$log"
}
# status of an exit code under timeout(1)
status_of() {
  case $1 in 0) echo passed ;; 124 | 137) echo "timed out" ;; *) echo "failed ($1)" ;; esac
}
# start STEP GRACE [MIN]: print the step's budget, or record it as skipped (under GRACE + MIN s) and return 1
start() {
  local b
  b=$(budget "$1")
  if [ "$b" -lt $(($2 + ${3:-5})) ]; then
    record "$1" skipped "$SECONDS" "no time left (${b} s of the ${total} s)"
    return 1
  fi
  say "$1 (up to ${b} s)"
  echo "$b"
}
# within BUDGET GRACE CMD...: CMD stopped at BUDGET - GRACE s (SIGTERM, or $SIG) and killed GRACE s later
within() {
  local b=$1 g=$2
  shift 2
  [ "$b" -gt "$g" ] || b=$((g + 1)) # timeout 0 would mean none
  timeout -s "${SIG:-TERM}" -k "$g" "$((b - g))" "$@"
}

# -- deps: the emulator's wheels where they travelled with the tree, then one line per import --
t0=$SECONDS
if has deps; then
  : > "$work/deps.log"
  if ! within 15 2 python3 -c "import gymnasium, ale_py" 2> /dev/null && ls .whl/*.whl > /dev/null 2>&1; then
    echo "pip install .whl/*.whl into /tmp/site" >> "$work/deps.log"
    within 30 5 python3 -m pip install --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl >> "$work/deps.log" 2>&1
    echo "pip exit $?" >> "$work/deps.log"
  fi
fi
[ -d /tmp/site ] && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
if has deps; then
  within 35 5 python3 - "$device" >> "$work/deps.log" 2>&1 << 'EOF'
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
  tee -a "$log" < "$work/deps.log"
  if [ "$rc" -ne 0 ]; then
    record deps failed "$t0" "$(grep -m3 'MISSING\|pip exit [1-9]' "$work/deps.log" | tr '\n' ';')"
    say "a runtime dependency is missing (see deps.log): for gymnasium or ale-py run results/gpu_wheels.sh where pip reaches an index and bring .whl/"
    pack
    exit 1
  fi
  record deps passed "$t0" "$(grep -m1 '^ok torch' "$work/deps.log")"
  pack
fi

# -- hardware --------------------------------------------------------------------------------
t0=$SECONDS
if has hardware && b=$(start hardware 5); then
  within "$b" 5 bash -c '
    command -v nvidia-smi >/dev/null && nvidia-smi -L &&
      nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,power.limit --format=csv
    echo "cpu cores: $(nproc); $(grep -m1 "model name" /proc/cpuinfo)"
    free -g | head -2
    python3 -c "import sys, torch, gymnasium, ale_py; print(sys.version.split()[0], torch.__version__, torch.version.cuda, gymnasium.__version__, ale_py.__version__)"
  ' > "$work/machine.txt" 2>&1
  rc=$?
  echo "commit $commit" >> "$work/machine.txt"
  tee -a "$log" < "$work/machine.txt"
  record hardware "$(status_of $rc)" "$t0" "$(head -1 "$work/machine.txt")"
  pack
fi

# -- tests: the CUDA tests but the compiled form's ---------------------------------------------
t0=$SECONDS
if has tests && b=$(start tests 10 20); then
  if within 15 2 python3 -c "import pytest" 2> /dev/null; then
    within "$((b - (SECONDS - t0)))" 10 python3 -m pytest -q -m cuda -k "not compiled_step" -p no:cacheprovider tests > "$work/tests_cuda.log" 2>&1
    rc=$?
    tail -15 "$work/tests_cuda.log" | tee -a "$log"
    record tests "$(status_of $rc)" "$t0" "$(tail -1 "$work/tests_cuda.log")"
  else
    echo "pytest is not installed here: the CUDA tests did not run" | tee "$work/tests_cuda.log"
    record tests skipped "$t0" "pytest is not installed"
  fi
  pack
fi

# -- solve: stage 08 on Pong, seed 1 ----------------------------------------------------------
solve_grace=20
stall=${SOLVE_STALL_SECONDS:-90}
pack_every=${PACK_SECONDS:-60}
# solve_run DIR SECONDS STALL SCRIPT [flags]: stage SCRIPT (08_graph_learner.py, ...) in DIR
# (solve<stage>.log, runs/), stopped by SIGINT at SECONDS less the grace (its RESULT line still
# printed), or, where STALL > 0, as soon as its log has had no new line for STALL s (DIR/stalled
# says so); killed $solve_grace s after the SIGINT. The bundle is packed every $pack_every s meanwhile.
solve_run() {
  local dir=$1 secs=$2 stall=$3 script=$4 pid packed=$SECONDS
  shift 4
  local runlog=$dir/solve${script:0:2}.log
  mkdir -p "$dir"
  : > "$runlog"
  timeout -s INT -k "$solve_grace" "$((secs - solve_grace))" "${SOLVE_PYTHON:-python3}" "$script" --device "$device" --seed 1 \
    --envs "${SOLVE_ENVS:-auto}" --run-dir "$dir/runs" --progress 15 --quiet "$@" > "$runlog" 2>&1 &
  pid=$!
  while kill -0 "$pid" 2> /dev/null; do
    sleep 1
    if [ "$stall" -gt 0 ] && [ $(($(date +%s) - $(stat -c %Y "$runlog"))) -ge "$stall" ] && [ ! -e "$dir/stalled" ]; then
      echo "no line of output for ${stall} s: stopped" > "$dir/stalled"
      kill -INT "$pid" 2> /dev/null # timeout passes it on and kills after the grace
    fi
    if [ $((SECONDS - packed)) -ge "$pack_every" ]; then
      pack
      packed=$SECONDS
    fi
  done
  wait "$pid"
}
# ended_well DIR: the run stopped at its time limit or solved, without an error and without stalling
ended_well() {
  [ ! -e "$1/stalled" ] && grep -q '^RESULT .*\(solved=yes\|interrupted=SIGINT\)' "$1"/solve0?.log &&
    ! grep -q '^RESULT .*error=yes' "$1"/solve0?.log
}
# how_it_ended DIR RC: "failed (exit RC)", or how it hung
how_it_ended() {
  local how="failed (exit $2)"
  [ "$2" = 137 ] && how="hung (killed at its time limit)"
  [ -e "$1/stalled" ] && how="hung (no output for ${stall} s, exit $2)"
  echo "$how"
}
t0=$SECONDS
if has solve && b=$(start solve "$solve_grace" 10); then
  dir=$work/solve08
  solve_run "$dir" "$b" "$stall" 08_graph_learner.py
  rc=$?
  detail=""
  if ! ended_well "$dir"; then
    grep -h "error\|Error" "$dir/solve08.log" | tail -3 | tee -a "$log"
    left=$((b - (SECONDS - t0)))
    detail="the first run $(how_it_ended "$dir" "$rc"), solve08/solve08.log; "
    if [ "$left" -ge $((solve_grace + 10)) ]; then
      say "solve: again with --capture none, up to ${left} s"
      dir=$work/solve08-capture-none
      detail+="again with --capture none (solve08-capture-none/): "
      solve_run "$dir" "$left" 0 08_graph_learner.py --capture none # runs to its limit unless it fails
      rc=$?
    else
      detail+="no time left to run it again with --capture none: "
    fi
  fi
  left=$((b - (SECONDS - t0)))
  if [ "$dir" = "$work/solve08-capture-none" ] && ! ended_well "$dir" && [ "$left" -ge $((solve_grace + 10)) ]; then
    grep -h "error\|Error" "$dir/solve08.log" | tail -3 | tee -a "$log"
    say "solve: stage 07 instead, up to ${left} s"
    detail+="$(how_it_ended "$dir" "$rc"); stage 07 instead (solve07/): "
    dir=$work/solve07
    solve_run "$dir" "$left" 0 07_vector_play.py # the last try: it runs to its limit
    rc=$?
  fi
  grep -h "^stage 0\|^acting\|ready in\|PROGRESS\|RESULT\|TIME\|error" "$dir"/solve0?.log | tail -8 | tee -a "$log"
  for d in solve08 solve08-capture-none solve07; do
    [ -d "$work/$d" ] || continue
    echo "# $d/solve${d:5:2}.log"
    grep -h '^RESULT \|^TIME ' "$work/$d/solve${d:5:2}.log"
  done > "$out/solve08_result.txt"
  result=$(grep -h "^RESULT" "$dir"/solve0?.log | tail -1)
  status=$(status_of "$rc")
  [ -e "$dir/stalled" ] && status=hung
  grep -q "interrupted=SIGINT" <<< "$result" && [ ! -e "$dir/stalled" ] && status="time up"
  grep -q "solved=yes" <<< "$result" && status=solved
  record solve "$status" "$t0" "${detail}${result:-no RESULT line}"
  pack

  # -- curve: reward_100 of the solve's runs ---------------------------------------------------
  t0=$SECONDS
  runs=()
  for d in "$work"/solve08/runs "$work"/solve08-capture-none/runs "$work"/solve07/runs; do [ -d "$d" ] && runs+=("$d"); done
  if [ "${#runs[@]}" -eq 0 ]; then
    record curve skipped "$t0" "no run folder"
  elif b=$(start curve 5); then
    within "$b" 5 python3 -m lib.analysis.curves "${runs[@]}" --out "$work/solve08.png" > "$work/solve08_curve.log" 2>&1
    rc=$?
    tail -6 "$work/solve08_curve.log" | tee -a "$log"
    if [ "$rc" = 2 ] && grep -q "no run has reward_100 points yet" "$work/solve08_curve.log"; then
      record curve skipped "$t0" "no reward_100 points: the solve finished no game"  # nothing to draw
    else
      record curve "$(status_of $rc)" "$t0" "$(grep -m1 -i 'error\|wrote' "$work/solve08_curve.log" | sed "s|$work/||g")"
    fi
    pack
  fi
fi

# -- timing: the train step, eager and captured ------------------------------------------------
# On CUDA each form in bf16 and fp32 (a launch-bound step may not gain from bf16); a CPU dry run takes --precision auto.
if [ "$device" = cuda ]; then forms=none,graph precisions=bf16,fp32; else forms=none precisions=auto; fi
t0=$SECONDS
if has timing && b=$(start timing 10); then
  timing_args=${TIMING_ARGS:---batch 128 --iters 200}
  # shellcheck disable=SC2086
  within "$b" 10 python3 -m lib.bench.trainstep --device "$device" --capture "$forms" --precision "$precisions" $timing_args > "$work/trainstep.log" 2>&1
  rc=$?
  tail -5 "$work/trainstep.log" | tee -a "$log"
  record timing "$(status_of $rc)" "$t0" "$(grep -h '^TRAINSTEP' "$work/trainstep.log" | sed 's/ device=.*ms=/ ms=/; s/ prepare_s.*//' | tr '\n' ' ')"
  pack
fi

# -- bench: 07 and 08, one round -------------------------------------------------------------
# 10,000 frames each: 07 at ~700 f/s on the H200 and 08 with its capture fit 110 s with their bounds.
t0=$SECONDS
if has bench && b=$(start bench 20 30); then
  bench_args=${BENCH_ARGS:---stages 07,08 --repeat 1 --no-sweep --frames 10000 --replay-initial 1000 --bound-seconds 1}
  # shellcheck disable=SC2086
  SIG=INT within "$b" 20 python3 -m lib.bench --device "$device" $bench_args --out "$work/bench" > "$work/bench.log" 2>&1
  rc=$?
  rates=$(grep -h ' f/s over ' "$work/bench.log" | sed 's/^\[[0-9/]*\] stage \([0-9]*\).*: \([0-9.]*\) f\/s over.*/\1:\2/')
  tail -12 "$work/bench.log" | tee -a "$log"
  record bench "$(status_of $rc)" "$t0" "$(grep -c . <<< "$rates") stage runs; f/s $(tr '\n' ' ' <<< "$rates")"
  pack
fi

# -- compiled: torch.compile's form, last, in the time left (Inductor compiles for tens of seconds) --
t0=$SECONDS
if has compiled && b=$(start compiled 10 20); then
  within "$b" 10 python3 -m pytest -q -m cuda -k "compiled_step" -p no:cacheprovider tests > "$work/compiled.log" 2>&1
  rc=$?
  echo "test exit $rc" >> "$work/compiled.log"
  left=$((b - (SECONDS - t0)))
  if [ "$left" -ge 20 ]; then
    # shellcheck disable=SC2086
    within "$left" 5 python3 -m lib.bench.trainstep --device "$device" --capture compile ${TIMING_ARGS:---batch 128 --iters 200} >> "$work/compiled.log" 2>&1
    trc=$?
    [ "$rc" -eq 0 ] && rc=$trc
    detail=$(grep -h '^TRAINSTEP\|passed\|failed' "$work/compiled.log" | tr '\n' ' ')
  else
    detail="$(grep -h 'passed\|failed' "$work/compiled.log" | tr '\n' ' '); the timing skipped: no time left"
  fi
  tail -5 "$work/compiled.log" | tee -a "$log"
  record compiled "$(status_of $rc)" "$t0" "$detail"
fi

say "done"
pack
cat "$summary"

#!/usr/bin/env bash
# Stage 08's train step before and after the frames' dtype is converted ahead of their layout
# (lib/model.py), in bf16 and fp32, the two commits interleaved over five rounds. Each line also
# gives the share of the machine's CPU time that its hypervisor took for other guests while the
# line was measured (steal, from /proc/stat): on a shared host that is where the noise comes from.
# Run from the repository root on an otherwise idle machine:
#   bash results/investigations/cpu-intel-xeon-amx-2c-input-order/run.sh BEFORE AFTER
set -euo pipefail
before=${1:?the commit before the change}
after=${2:?the commit with it}
out=results/investigations/cpu-intel-xeon-amx-2c-input-order
trees=$(mktemp -d)
cleanup() {
  git worktree remove --force "$trees/before" 2>/dev/null || true
  git worktree remove --force "$trees/after" 2>/dev/null || true
  rm -rf "$trees"
}
trap cleanup EXIT
git worktree add --detach --quiet "$trees/before" "$before"
git worktree add --detach --quiet "$trees/after" "$after"
: > "$out/trainstep.log"
cpu_ticks() { awk '/^cpu /{print $2+$3+$4+$5+$6+$7+$8+$9, $9}' /proc/stat; }
for round in 1 2 3 4 5; do
  for side in before after; do
    commit=$(git -C "$trees/$side" rev-parse --short HEAD)
    for precision in bf16 fp32; do
      read -r total0 steal0 < <(cpu_ticks)
      line=$(cd "$trees/$side" && python -m lib.bench.trainstep --device cpu --capture none --precision "$precision" \
        --batch 128 --iters 100 --replay-size 100000 --envs 4 | grep '^TRAINSTEP')
      read -r total1 steal1 < <(cpu_ticks)
      steal=$(awk -v s=$((steal1 - steal0)) -v t=$((total1 - total0)) 'BEGIN{printf "%.1f", t ? 100 * s / t : 0}')
      echo "round=$round $side=$commit $line steal_pct=$steal" | tee -a "$out/trainstep.log"
    done
  done
done

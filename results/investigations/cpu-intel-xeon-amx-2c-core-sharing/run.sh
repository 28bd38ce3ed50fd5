#!/usr/bin/env bash
# Stages 05 and 08 on CPU at each of the given commits, the commits interleaved over three rounds,
# every run resumed from a copy of the same late Pong checkpoint (epsilon at its floor: the speed
# a solve spends its time at). Each line also gives the share of the machine's CPU time that its
# hypervisor took for other guests while that bench ran (steal, from /proc/stat).
# Run from the repository root on an otherwise idle machine:
#   bash results/investigations/cpu-intel-xeon-amx-2c-core-sharing/run.sh CHECKPOINT COMMIT [COMMIT ...]
set -euo pipefail
checkpoint=$(realpath "${1:?a Pong checkpoint of stage 08}")
shift
out=$(pwd)/results/investigations/cpu-intel-xeon-amx-2c-core-sharing
trees=$(mktemp -d)
cleanup() {
  for tree in "$trees"/tree-*; do git worktree remove --force "$tree" 2>/dev/null || true; done
  rm -rf "$trees"
}
trap cleanup EXIT
for commit in "$@"; do git worktree add --detach --quiet "$trees/tree-$commit" "$commit"; done
: > "$out/bench.log"
cpu_ticks() { awk '/^cpu /{print $2+$3+$4+$5+$6+$7+$8+$9, $9}' /proc/stat; }
for round in 1 2 3; do
  for commit in "$@"; do
    read -r total0 steal0 < <(cpu_ticks)
    (cd "$trees/tree-$commit" && python -m lib.bench --stages 05,08 --no-sweep --repeat 1 --frames 1600 \
      --bound-seconds 2 --resume "$checkpoint" --out "$trees/bench" --tag "$commit-$round") > "$trees/$commit-$round.log" 2>&1
    read -r total1 steal1 < <(cpu_ticks)
    steal=$(awk -v s=$((steal1 - steal0)) -v t=$((total1 - total0)) 'BEGIN{printf "%.1f", t ? 100 * s / t : 0}')
    grep -E 'bound [0-9.]+ f/s|f/s over [0-9]+ training frames' "$trees/$commit-$round.log" \
      | sed "s/^/round=$round commit=$commit steal_pct=$steal /" | tee -a "$out/bench.log"
  done
done

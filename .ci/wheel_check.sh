#!/usr/bin/env bash
# The package as a user installs it without -e: its wheel in a clean venv, used from a folder
# outside the checkout. Every entry point answers --help; dqn-curves draws a committed run and
# dqn-watch plays a net; dqn-bench and dqn-sweep, which run the numbered scripts (not in a wheel),
# refuse in one line; every lib module imports. Run by .ci/run with the checkout's venv active.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
python -m pip wheel -q --no-deps --no-build-isolation -w "$work/dist" "$root"
python3 -m venv "$work/venv"
bin="$work/venv/bin"
"$bin/python" -m pip install -q "torch==2.13.0"  # the CPU build (an unpinned torch is a CUDA build)
"$bin/python" -m pip install -q "$work"/dist/*.whl
cd "$work"  # nothing of the checkout on the path from here

for cmd in dqn-bench dqn-sweep dqn-curves dqn-watch; do
    "$bin/$cmd" --help > /dev/null
done
"$bin/python" - <<'PY'
import importlib
import pkgutil

import lib

names = [m.name for m in pkgutil.walk_packages(lib.__path__, "lib.") if not m.name.endswith("__main__")]
for name in names:
    importlib.import_module(name)
print(f"wheel: {len(names)} lib modules import")
PY

run="$root/results/cpu-intel-xeon-amx-2c-sweep-08-ablation/runs/08+base2-pong-seed1"
"$bin/dqn-curves" "$run" --out "$work/curves.png" > /dev/null
test -s "$work/curves.png"
grep -q "2017" "$work/curves.md"  # the 2017 run's line, from the log the package carries

# A net to watch: a short run of the checkout's stage 01 (its checkpoint), played by the wheel.
python "$root/01_dqn_basic.py" --device cpu --max-frames 40 --replay-size 64 --replay-initial 16 \
    --save-every 40 --run-dir "$work/runs" --quiet > /dev/null
"$bin/dqn-watch" "$work"/runs/*/checkpoint.pt --episodes 1 --max-steps 100 --device cpu > /dev/null

for cmd in "dqn-bench --quick" "dqn-sweep --stages 01"; do
    if out=$($bin/$cmd 2>&1); then
        echo "wheel: $cmd ran outside a checkout" >&2
        exit 1
    fi
    if [ "$(printf '%s\n' "$out" | wc -l)" -ne 1 ] || ! grep -q "checkout" <<< "$out"; then
        echo "wheel: $cmd did not answer in one line: $out" >&2
        exit 1
    fi
done
echo "wheel: installed outside the checkout, every entry point answers"

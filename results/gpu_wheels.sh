#!/usr/bin/env bash
# The wheels results/gpu_check.sh needs on a GPU machine whose Python lacks the emulator stack:
# gymnasium, ale-py (it ships the ROMs) and farama-notifications, the one need of theirs that a
# PyTorch image does not hold (numpy, cloudpickle and typing-extensions it does). Run it on a
# machine that can reach a package index, in the repository root, before the GPU run; the GPU
# machine needs no network then. The wheels go to .whl/, which git ignores; ship that folder with
# the working tree (it is about 3.6 MB), and gpu_check.sh installs them into /tmp/site when the
# GPU machine's python3 cannot import gymnasium and ale_py.
# Usage: bash results/gpu_wheels.sh [PYTHON_VERSION]   (the GPU machine's, default 3.12)
#   GYMNASIUM, ALE_PY: versions (default: the ones the tests were last run with)
set -eu
py=${1:-3.12}
if ! [[ $py =~ ^3\.[0-9]+$ ]]; then
  echo "gpu_wheels.sh: expected a Python version like 3.12, got '$py'" >&2
  exit 2
fi
dest=.whl
mkdir -p "$dest"
rm -f "$dest"/*.whl  # one version of each: two would stop the install there
# manylinux tags from old to new: pip matches each exactly, and ale-py's wheel names 2_27/2_28
platforms=()
for tag in manylinux1 manylinux2014 manylinux_2_17 manylinux_2_27 manylinux_2_28; do
  platforms+=(--platform "${tag}_x86_64")
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$py" --implementation cp \
  "${platforms[@]}" -d "$dest" \
  "gymnasium==${GYMNASIUM:-1.4.0}" "ale-py==${ALE_PY:-0.12.1}" "farama-notifications>=0.0.1"
ls -l "$dest"/*.whl
if commit=$(git describe --always --dirty --abbrev=7 2> /dev/null); then
  echo "$commit" > "$dest/COMMIT"
  echo "commit $commit in $dest/COMMIT"
else
  rm -f "$dest/COMMIT" # not a git checkout: gpu_check.sh says "unknown"
fi

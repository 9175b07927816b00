#!/usr/bin/env bash
# Wheels for the GPU kit's Colossal-AI path on a bare CUDA machine (torch, timm and numpy there; no
# network): everything in requirements/gpu-kit.txt, for that machine's Python, into one folder that
# travels with the checkout.
#
#     scripts/gpu_wheels.sh .whl                  # here: for CPython 3.12 on x86-64 Linux (~2 MiB)
#     scripts/gpu_wheels.sh .whl 3.11             # for another Python version
#     # there:
#     python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
#     PYTHONPATH=/tmp/site python3 -m benchmarks.gpu --path colossalai --out results
#
# Binary wheels come from PyPI for the target Python and platform; Colossal-AI and contexttimer are
# published as source only and are pure Python, so they are built into wheels here. Refused when the
# wheels and the checkout's tracked files together pass the 64 MiB that travels (less 1 MiB of room).
set -euo pipefail

dest=${1:?usage: scripts/gpu_wheels.sh DEST_DIR [PYTHON_VERSION]}
pyver=${2:-3.12}
root=$(cd "$(dirname "$0")/.." && pwd)
req="$root/requirements/gpu-kit.txt"
py=${PYTHON:-python3}

if [ -e "$dest" ] && [ -n "$(ls -A "$dest" 2>/dev/null)" ]; then
    echo "error: $dest exists and is not empty; give a new or empty folder" >&2
    exit 2
fi
mkdir -p "$dest"
sdists="colossalai contexttimer"
binary=$(grep -v -E '^\s*(#|$)' "$req" | grep -v -E "^($(echo $sdists | tr ' ' '|'))==")
source=$(grep -E "^($(echo $sdists | tr ' ' '|'))==" "$req")
# Local pip settings (constraints, extra indexes) are for this machine's own installs, not for a download
# for another Python: PIP_CONFIG_FILE=/dev/null leaves only PyPI.
PIP_CONFIG_FILE=/dev/null "$py" -m pip download -q --no-deps --only-binary=:all: --python-version "$pyver" \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 -d "$dest" $binary
PIP_CONFIG_FILE=/dev/null "$py" -m pip wheel -q --no-deps -w "$dest" $source
rm -f "$dest"/*.tar.gz
size=$(du -cb "$dest"/*.whl | tail -1 | cut -f1)
checkout=$(cd "$root" && git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
limit=$((63 * 1024 * 1024 - checkout))
if [ "$size" -ge "$limit" ]; then
    echo "error: wheels in $dest are $size bytes; with the checkout's $checkout that passes 63 of the 64 MiB that travels" >&2
    exit 1
fi
echo "wheels $dest: $(ls "$dest" | wc -l) files, $size bytes (+ checkout $checkout of 64 MiB); there: python3 -m pip install -q --no-index --no-deps --target /tmp/site $dest/*.whl && PYTHONPATH=/tmp/site python3 -m benchmarks.gpu --path colossalai"

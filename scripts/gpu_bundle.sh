#!/usr/bin/env bash
# Packs what the GPU measurement kit (python -m benchmarks.gpu) needs beyond torch, timm and numpy
# into one folder, for a bare CUDA machine without DALI, Colossal-AI or a network:
#
#     scripts/gpu_bundle.sh /tmp/vitlarge-gpu            # here (about 1 MiB; refused over 64 MiB)
#     cd /tmp/vitlarge-gpu && python -m benchmarks.gpu --out results    # there
#
# What travels: the Python sources of vitlarge/, the kit (benchmarks/gpu/) and the harness it shares
# with the CPU benchmarks (benchmarks/harness/), and recipes/ (the kit builds the models from them). Not the benchmark results, not data, not the venv. Colossal-AI travels separately,
# as wheels (scripts/gpu_wheels.sh, about 2 MiB); without them the kit takes its plain
# single-device path and says so in its output.
set -euo pipefail

dest=${1:?usage: scripts/gpu_bundle.sh DEST_DIR}
root=$(cd "$(dirname "$0")/.." && pwd)
limit=$((64 * 1024 * 1024))

if [ -e "$dest" ] && [ -n "$(ls -A "$dest" 2>/dev/null)" ]; then
    echo "error: $dest exists and is not empty; give a new or empty folder" >&2
    exit 2
fi
mkdir -p "$dest"
(cd "$root" && find vitlarge benchmarks/__init__.py benchmarks/gpu benchmarks/harness recipes -name '*.py' \
    -not -path '*/__pycache__/*' -print0 \
    | tar --null -cf - -T -) | tar -xf - -C "$dest"
cat > "$dest/README.txt" <<'TXT'
vitlarge GPU measurement kit (made by scripts/gpu_bundle.sh). Needs python with torch, timm, numpy.
    python -m benchmarks.gpu --out results        # writes results/gpu.json and results/gpu.md
    python -m benchmarks.gpu --device cpu --tiny  # smoke run, numbers mean nothing
TXT
size=$(du -sb "$dest" | cut -f1)
if [ "$size" -ge "$limit" ]; then
    echo "error: bundle $dest is $size bytes, over the 64 MiB limit" >&2
    exit 1
fi
echo "bundle $dest: $size bytes; run there: python -m benchmarks.gpu --out results"

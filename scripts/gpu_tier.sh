#!/usr/bin/env bash
# The GPU tier (tests/gpu/) in one command on a bare CUDA machine that has torch, timm, numpy and pytest but
# neither this project's venv nor a network: the wheels bundle (scripts/gpu_wheels.sh: Colossal-AI and what
# it needs, crc32c) goes into a folder of its own on PYTHONPATH, then pytest runs the tier and prints its table.
#
#     scripts/gpu_wheels.sh .whl                     # here, once (~2 MiB, travels with the checkout)
#     scripts/gpu_tier.sh .whl                       # there; extra arguments go to pytest
#     VITLARGE_GPU_TABLE=out/gpu_tier.md scripts/gpu_tier.sh .whl    # the table also into a file
#
# Where the project's venv is installed (a cluster's login or compute node), `make test-gpu` runs the same tier.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
if [ $# -gt 0 ] && [ -d "$1" ]; then
    site=${TMPDIR:-/tmp}/vitlarge-gpu-site
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "$1"/*.whl
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
    shift
fi
exec "$py" -m pytest tests/gpu -p no:cacheprovider -rA "$@"

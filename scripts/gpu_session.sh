#!/usr/bin/env bash
# The next GPU session, prepared: DALI's wheels in parts, the GPU tier with DALI, the data path through train.py
# (issue 43), then the GPU kit (issue 44). docs/GPU_SESSION.md "The GPU session, step by step" lists the device tool's calls;
# `plan` prints them for the parts packed here.
#
#   scripts/gpu_session.sh prepare          # here, in the checkout the session calls the device from: wheels ->
#                                           #   .gpu/parts (5 parts of <= 57 MiB, ignored), then the plan
#   scripts/gpu_session.sh plan             # here: each call's command, carry, timeout_s and MiB carried
#   bash scripts/gpu_session.sh part N      # there, one call per part: stage it (part 1 also probes the machine
#                                           #   and starts making the JPEGs in the background)
#   bash scripts/gpu_session.sh part N tier # there, the last part: stage, join, install, check DALI, the tier
#   bash scripts/gpu_session.sh data        # there: benchmarks/gpu/data.py (vit_b16 through train.py, DALI)
#   bash scripts/gpu_session.sh kit [DIR] [ARGS]  # there: python -m benchmarks.gpu within its time budget (DIR: the
#                                           #   Colossal-AI wheels carried with the call, in a session of its own)
#   scripts/gpu_session.sh dry-run [parts]  # here: the device side of every step on the CPU (no CUDA); PYTHON312:
#                                           #   a Python 3.12 standing for the machine's python3: numpy, Pillow, six,
#                                           #   packaging, typing-extensions, protobuf (DALI, tfrecord), torch, psutil
#
# There, what a step installs or makes lives in one folder of the user's own, VITLARGE_GPU_HOME (default
# ~/.cache/vitlarge-gpu: parts/, the stage gpu_parts.py checks is private; site/; bench/), never a fixed name in the
# shared /tmp, where another user could make it first; the machine keeps it only while it stays warm (about 30 s
# idle): send the calls back to back. Results go to $OUT.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
GPU_HOME=${VITLARGE_GPU_HOME:-~/.cache/vitlarge-gpu} # ~: HOME, or where HOME is unset the passwd entry's
SITE=${VITLARGE_GPU_SITE:-$GPU_HOME/site}
STAGE=${VITLARGE_GPU_STAGE:-$GPU_HOME/parts}
BENCH=${VITLARGE_GPU_BENCH:-$GPU_HOME/bench}
OUT=${OUT:-/tmp/vitlarge-out}
PARTS=.gpu/parts
JPEGS=4096 # ImageNet-shaped (data_tools.make_bench_dataset --quality 96 --noise 10,14: ~110 KB each)
export PYTHONUNBUFFERED=1

probe() { # one line: what the machine is, what it has that DALI loads lazily
    local gpu libs
    gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1 || true)
    libs=$(for l in libnvjpeg.so.13 libnppc.so.13 libnppicc.so.13 libnppig.so.13 libcufft.so.12; do
        if ldconfig -p 2>/dev/null | grep -q "$l" || ls /usr/local/cuda/lib64/"$l" >/dev/null 2>&1; then echo -n "$l "; fi
    done)
    echo "gpu_session: $(date -u +%FT%TZ) ${gpu:-no nvidia-smi}; $("$PY" -c 'import sys,torch;print(f"python {sys.version.split()[0]}, torch {torch.__version__}")' 2>&1 | tail -1); $(nproc) cores; /dev/shm $(df -h /dev/shm 2>/dev/null | awk 'NR==2{print $4}') free; CUDA libraries found outside the wheels: ${libs:-none}"
}

case "${1:-}" in
prepare)
    [ -d .gpu/wheels ] || "$PY" scripts/gpu_parts.py download .gpu/wheels
    [ -f $PARTS/manifest.json ] || "$PY" scripts/gpu_parts.py pack .gpu/wheels $PARTS
    exec "$PY" scripts/gpu_parts.py plan $PARTS
    ;;
plan)
    exec "$PY" scripts/gpu_parts.py plan $PARTS
    ;;
part)
    n=${2:?usage: gpu_session.sh part N [tier]}
    mkdir -p "$OUT"
    if [ "$n" = 1 ]; then
        probe
        mkdir -p "$BENCH"
        # The JPEGs for the data step, made on the CPU while the other parts travel (a new session: it outlives
        # this command).
        setsid nohup "$PY" -m data_tools.make_bench_dataset "$BENCH/jpeg" --num-images $JPEGS --classes 1000 \
            --quality 96 --noise 10,14 >"$BENCH/make.log" 2>&1 </dev/null &
        echo "gpu_session: making $JPEGS JPEGs in $BENCH/jpeg in the background (log $BENCH/make.log)"
    fi
    if [ "${3:-}" != tier ]; then
        exec "$PY" scripts/gpu_parts.py receive $PARTS --stage "$STAGE"
    fi
    "$PY" scripts/gpu_parts.py install $PARTS --stage "$STAGE" --target "$SITE"
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
    "$PY" scripts/gpu_parts.py check --device "${VITLARGE_GPU_DEVICE:-cuda}" 2>&1 | tee "$OUT/dali_check.txt" ||
        echo "gpu_session: the DALI check failed (above); the tier runs anyway (its DALI tests say why they skip or fail)"
    VITLARGE_GPU_TABLE="$OUT/gpu_tier.md" bash scripts/gpu_tier.sh -n "${VITLARGE_GPU_WORKERS:-8}" -q 2>&1 | tee "$OUT/gpu_tier.log"
    ;;
data)
    mkdir -p "$OUT"
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
    for _ in $(seq 120); do [ -f "$BENCH/jpeg/bench.json" ] && break; sleep 1; done
    [ -f "$BENCH/jpeg/bench.json" ] || { echo "gpu_session: $BENCH/jpeg is not finished (part 1 starts it; see $BENCH/make.log)" >&2; exit 2; }
    "$PY" -m benchmarks.gpu.data --jpeg "$BENCH/jpeg" --out "$OUT" "${@:2}" 2>&1 | tee "$OUT/data_gpu.log"
    ;;
kit)
    mkdir -p "$OUT"
    shift
    if [ $# -gt 0 ] && [ -d "$1" ]; then # a session of its own: the Colossal-AI wheels carried with this call
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$1"/*.whl
        shift
    fi
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
    "$PY" -m benchmarks.gpu --out "$OUT" --time-budget "${VITLARGE_KIT_BUDGET_S:-500}" "$@" 2>&1 | tee "$OUT/kit.log"
    ;;
dry-run)
    # The device side of every step here, on the CPU: the parts staged and installed with a Python 3.12 (the
    # machine's), DALI checked on the CPU, the data step and the kit at toy sizes. The tier needs CUDA.
    py312=${PYTHON312:-python3.12}
    tmp=$(mktemp -d /tmp/vitlarge-dry-XXXXXX)
    n=$("$PY" -c "import json;print(len(json.load(open('$PARTS/manifest.json'))['parts']))")
    for i in $(seq "$n"); do
        mkdir -p "$tmp/c$i/.gpu/parts"
        cp $PARTS/manifest.json "$tmp/c$i/.gpu/parts/" && ln $PARTS/part-$(printf %02d "$i") "$tmp/c$i/.gpu/parts/"
        s=$(date +%s.%N)
        (cd "$tmp/c$i" && "$py312" "$OLDPWD/scripts/gpu_parts.py" $([ "$i" = "$n" ] && echo install || echo receive) \
            .gpu/parts --stage "$tmp/stage" $([ "$i" = "$n" ] && echo --target "$tmp/site"))
        echo "gpu_session: dry run: part $i took $(echo "$(date +%s.%N) - $s" | bc) s"
    done
    PYTHONPATH="$tmp/site" "$py312" scripts/gpu_parts.py check --device cpu
    rm -rf "$tmp"
    [ "${2:-}" = parts ] && exit 0
    s=$(date +%s)
    .venv/bin/python -m benchmarks.gpu.data --device cpu --tiny
    echo "gpu_session: dry run: data step $(($(date +%s) - s)) s"
    s=$(date +%s)
    .venv/bin/python -m benchmarks.gpu --device cpu --tiny
    echo "gpu_session: dry run: kit $(($(date +%s) - s)) s"
    ;;
*)
    awk 'NR > 1 && !/^#/ { exit } NR > 1' "$0" >&2 # the header comment, whatever its length
    exit 2
    ;;
esac

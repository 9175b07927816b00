#!/usr/bin/env bash
# `make test`: the suite as two pytest runs at the same time, with one exit status.
#
#   scripts/test_suite.sh PYTHON WORKERS TESTS [SERIAL_FILE...]
#
# The serial files (`make test`: the Slurm ones, which share the machine's one test cluster and change its shape
# between them) run in a pytest process of their own, one after another in the order given; the rest of TESTS runs on
# WORKERS pytest-xdist workers, each taking whole files (--dist loadfile: a file's module fixtures are made once;
# tests/conftest.py hands out the end-to-end files first). The serial run's output follows the other's. The status is
# the first run's that failed (pytest's own), else 0. WORKERS=0: one plain pytest process over everything, in pytest's
# order.
set -uo pipefail
py=$1 workers=$2 tests=$3
shift 3
if [ "$workers" = 0 ] || [ $# = 0 ]; then
    exec "$py" -m pytest -n "$workers" "$tests"
fi
log=$(mktemp)
trap 'rm -f "$log"' EXIT
"$py" -m pytest -n 0 "$@" >"$log" 2>&1 &
serial=$!
trap 'kill "$serial" 2>/dev/null; exit 130' INT TERM
ignore=()
for f in "$@"; do ignore+=(--ignore "$f"); done
"$py" -m pytest -n "$workers" --dist loadfile "$tests" "${ignore[@]}"
rest=$?
wait "$serial"
status=$?
echo
echo "---- the serial files' run ($*) ----"
cat "$log"
if [ "$rest" != 0 ]; then exit "$rest"; fi
exit "$status"

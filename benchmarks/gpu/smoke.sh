#!/usr/bin/env bash
# The GPU smoke run of olmx: install the carried wheels on the image's own python3, then a fixed
# sequence of runs under a hard budget (465 s), every step in its own time box and reported the
# moment it ends (benchmarks/gpu/smoke.py's docstring lists the steps and the files). Run from
# anywhere in the tree:
#
#     bash benchmarks/gpu/wheels.sh                # first, where PyPI is reachable: .whl/ (carry it)
#     bash benchmarks/gpu/smoke.sh                 # on the GPU machine: OUT=$OUT (default benchmarks/gpu/out)
#     REHEARSE=1 PYTHON=/venv/bin/python bash benchmarks/gpu/smoke.sh   # the same on a CPU, tiny sizes
#
# Environment: PYTHON (the interpreter, default python3: on the device the image's venv; nothing
# is installed into it, the wheels go into a --target folder under SCRATCH put on PYTHONPATH),
# OUT, WHL_DIR (default .whl), SCRATCH (default /tmp/olmx-smoke: install, run directories,
# logs), BUDGET (seconds from this script's start; default 465, rehearsal 150).
# Without a CUDA GPU (and without REHEARSE=1) it stops at once with exit status 3 and the reason.
# Exit status: 0 all ran, 1 a step failed or timed out, 124 cut by the budget's backstop.
set -uo pipefail
started=$(date +%s)
cd "$(dirname "$0")/../.."
PY="${PYTHON:-python3}"
OUT="${OUT:-benchmarks/gpu/out}"
args=(--out "$OUT" --wheels "${WHL_DIR:-.whl}" --scratch "${SCRATCH:-/tmp/olmx-smoke}")
if [ "${REHEARSE:-0}" = 1 ]; then
    BUDGET="${BUDGET:-150}"
    args+=(--rehearse)
else
    BUDGET="${BUDGET:-465}"
fi
deadline=$((started + BUDGET))
# smoke.py boxes every step within the deadline; the outer timeout (SIGTERM, which smoke.py turns
# into "cut" lines, then SIGKILL 5 s later) is only the backstop.
limit=$((deadline - $(date +%s) + 5))
if command -v timeout >/dev/null; then
    exec timeout --kill-after=5 "$limit" "$PY" benchmarks/gpu/smoke.py "${args[@]}" --deadline "$deadline"
fi
exec "$PY" benchmarks/gpu/smoke.py "${args[@]}" --deadline "$deadline"

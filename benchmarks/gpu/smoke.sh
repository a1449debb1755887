#!/usr/bin/env bash
# GPU smoke run of olmx: under 8 minutes on one GPU; writes JSON records and a RESULTS.md
# section into $OUT (or benchmarks/gpu/out). Run on the GPU machine from the repository root:
#
#     bash benchmarks/gpu/wheels.sh        # first, on the development machine (PyPI), once
#     bash benchmarks/gpu/smoke.sh         # then on the GPU machine
#
# It fails at once, with the reason, where there is no CUDA GPU. What it runs is
# benchmarks/gpu/smoke.py (see its docstring): the environment (compute capability,
# versions, whether torchao's C++ extensions loaded), `pytest -m gpu`, a 1B olmx run
# (tokens/s, MFU, peak memory) and 10-step runs of a 30M model through each path.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-benchmarks/gpu/out}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
if ! "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    echo "smoke.sh: no CUDA GPU visible to $PY (torch.cuda.is_available() is false): nothing to measure" >&2
    exit 3
fi
if [ ! -x .venv-gpu/bin/python ]; then
    # The image's torch stays (system site packages); olmx and its pure-Python dependencies
    # come from the wheels carried in .whl/ (benchmarks/gpu/wheels.sh), nothing is downloaded.
    "$PY" -m venv --system-site-packages .venv-gpu
    .venv-gpu/bin/pip install -q --no-index --find-links .whl --no-deps .whl/*.whl 2>&1 | tail -3 || true
    .venv-gpu/bin/pip install -q --no-index --no-deps --no-build-isolation -e . 2>&1 | tail -3
fi
if [ "${MEMORY_MODEL:-0}" = 1 ]; then
    # Opt-in (MEMORY_MODEL=1, about 3 more minutes): the memory model's GPU column, its
    # 1-process rows, merged with the CPU rows into $OUT/memory_model.{md,json}.
    cp benchmarks/results/memory_model.json "$OUT"/ 2>/dev/null || true
    timeout 240 .venv-gpu/bin/python benchmarks/memory_model.py --out "$OUT" || echo "smoke.sh: memory_model.py failed" >&2
fi
exec timeout 470 .venv-gpu/bin/python benchmarks/gpu/smoke.py --out "$OUT"

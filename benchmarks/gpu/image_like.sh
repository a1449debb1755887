#!/usr/bin/env bash
# An interpreter set up like the GPU machine's image, for rehearsing the device run on a CPU from
# a fresh clone (benchmarks/gpu/README.md, "Rehearsal (CPU)"): a venv of CPython 3.12 with
# torch 2.11.0 from PyPI (its CUDA 13 build: about 5 GiB installed with its nvidia-* libraries,
# 1.5 minutes here; on a CPU it imports and runs, torch.cuda.is_available() is false) and the
# image's common packages at the versions /work/.library/device/KINDS.md lists (numpy 2.5.2,
# transformers 5.17.0, huggingface_hub 1.33.0, safetensors 0.8.0, tokenizers 0.23.2, triton 3.6
# through torch), and nothing of olmx's (no olmx, OLMo-core, hydra, torchao). protobuf is 5.29.5,
# older than OLMo-core's import chain needs (>=6.33.5): the image lists protobuf without a version,
# so the rehearsal takes the worst case and shows the carried one installed and imported.
#
#     bash benchmarks/gpu/image_like.sh /tmp/img312          # prints /tmp/img312/bin/python
#     PY312=/path/to/python3.12 bash benchmarks/gpu/image_like.sh DIR
#
# A DIR that already holds such a venv is reused. Needs PyPI (pip's cache makes a second one quick).
set -euo pipefail
DIR="${1:?usage: bash benchmarks/gpu/image_like.sh DIR}"
is312() { [ -n "$1" ] && "$1" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; }
if [ -z "${PY312:-}" ]; then  # python3.12 on PATH (a pyenv shim may name a version not selected), else pyenv's
    for candidate in "$(command -v python3.12 || true)" "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12*/bin/python3.12; do
        if is312 "$candidate"; then PY312=$candidate; break; fi
    done
fi
if ! is312 "${PY312:-}"; then
    echo "image_like.sh: no CPython 3.12 found (python3.12 on PATH or pyenv's); name one: PY312=/path/to/python3.12" >&2
    exit 2
fi
PY="$DIR/bin/python"
want='import sys, torch, google.protobuf as p; assert sys.version_info[:2] == (3, 12) and torch.__version__.startswith("2.11.0") and p.__version__ == "5.29.5"'
if [ -x "$PY" ] && "$PY" -c "$want" 2>/dev/null; then
    echo "$PY"
    exit 0
fi
started=$(date +%s)
"$PY312" -m venv "$DIR"
"$PY" -m pip install -q --upgrade pip >&2
"$PY" -m pip install -q torch==2.11.0 numpy==2.5.2 safetensors==0.8.0 transformers==5.17.0 huggingface_hub==1.33.0 \
    tokenizers==0.23.2 protobuf==5.29.5 pyyaml rich typer jinja2 matplotlib requests tensorboard pytest setuptools \
    packaging >&2
"$PY" -c "$want"
# (-P: not the working directory, which is the clone, with olmx/ in it, when run as the README says)
if "$PY" -P -c 'import importlib.util as u, sys; sys.exit(any(u.find_spec(m) for m in ("olmx", "olmo_core", "hydra", "torchao")))'; then
    echo "image_like.sh: $DIR ($(du -sh "$DIR" | cut -f1)) in $(( $(date +%s) - started )) s" >&2
    echo "$PY"
else
    echo "image_like.sh: $DIR has a package of olmx's (olmx, OLMo-core, hydra or torchao): not like the image" >&2
    exit 1
fi

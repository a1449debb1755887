#!/usr/bin/env bash
# Prepares, on a machine that reaches PyPI, every package the GPU machine's image lacks, as
# wheels in one folder that travels there with the tree (benchmarks/gpu/smoke.sh installs them
# with `pip install --no-index --no-deps --target`, nothing downloaded there):
#
#     bash benchmarks/gpu/wheels.sh                       # for the GPU image: CPython 3.12, manylinux x86-64, into .whl/
#     PYTHON=/path/to/python bash benchmarks/gpu/wheels.sh   # for that interpreter's Python version (the rehearsal)
#     WHL_DIR=/tmp/w bash benchmarks/gpu/wheels.sh        # into another folder
#
# The image (`/opt/torch/.venv`, Python 3.12) has torch 2.11 (CUDA 13.0), triton, numpy, pyyaml,
# rich, typer, jinja2, matplotlib, requests, safetensors, transformers 5 (and huggingface-hub,
# filelock, packaging, tqdm through it), tokenizers, tensorboard (protobuf, grpcio) and pytest.
# What it lacks is the closure of olmx's and OLMo-core 3.0.0's requirements minus the image's,
# pinned to the versions of this repository's .venv (`pip show`), as listed in PINS below, plus:
#   - antlr4-python3-runtime 4.9.3 (omegaconf's pin): PyPI has only its sdist, so it is built
#     here into a wheel (pure Python);
#   - olmx itself, built into a wheel from the working tree (uncommitted edits included), so
#     that its plugins' entry points are found through importlib.metadata there;
#   - typer 0.28 (with shellingham and annotated-doc), although the image has a typer: olmx
#     needs >=0.26,<0.29 and the image's version is not known; first on PYTHONPATH, it wins;
#   - protobuf 7.36.2: OLMo-core's import of olmo_core.train and olmo_core.io goes through
#     cached_path -> google-api-core -> googleapis-common-protos 1.76, whose generated modules
#     need protobuf >=6.33.5,<8; the image lists protobuf without a version, so it is carried and
#     smoke.py installs it only where the image's is outside that range;
#   - not pandas: OLMo-core declares it but never imports it (12 MiB saved).
# The two builds (antlr4, olmx) run in pip's isolated build environments, with the setuptools
# their [build-system] asks for (olmx: >=77, for the SPDX `license = "Apache-2.0"`), fetched
# from PyPI like the wheels: the building interpreter's own setuptools (a system python3 may
# have 65) plays no part, so any python3 with pip builds them.
# Everything must stay under the device's 64 MiB (tree included); the script checks it.
# With the default folder it adds `/.whl/` to .git/info/exclude (a local ignore, not a commit),
# so that the folder is an ignored path to name in the device run's `carry`.
set -euo pipefail
cd "$(dirname "$0")/../.."
REPO=$PWD
WHL_DIR="${WHL_DIR:-.whl}"
# The interpreter that downloads and builds (it needs pip, nothing else); not the target's.
if [ -z "${BUILD_PYTHON:-}" ]; then
    if [ -x .venv/bin/python ]; then BUILD_PYTHON=.venv/bin/python; else BUILD_PYTHON=python3; fi
fi
if ! "$BUILD_PYTHON" -m pip --version >/dev/null 2>&1; then
    echo "wheels.sh: $BUILD_PYTHON has no pip; name an interpreter that has one: BUILD_PYTHON=/path/to/python" >&2
    exit 2
fi
if [ -n "${PYTHON:-}" ]; then
    TARGET=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
else
    TARGET=3.12
fi
PINS=(
    ai2-olmo-core==3.0.0 torchao==0.15.0 hydra-core==1.3.8 omegaconf==2.3.1 entry-points-txt==0.3.0
    bettermap==1.3.1 dataclass-extensions==0.5.0 dill==0.4.1 importlib-resources==7.1.0 cached-path==1.8.10
    boto3==1.44.8 botocore==1.44.8 s3transfer==0.19.3 jmespath==1.1.0
    google-cloud-storage==3.17.1 google-api-core==2.44.0 google-auth==2.63.0 google-cloud-core==2.8.0
    google-resumable-media==2.11.0 google-crc32c==1.9.0 googleapis-common-protos==1.76.0 proto-plus==1.29.0
    pyasn1==0.6.5 pyasn1-modules==0.4.2 cryptography==50.0.2 cffi==2.1.1 pycparser==3.12 opentelemetry-api==1.45.2
    protobuf==7.36.2 typer==0.28.0 shellingham==1.5.4 annotated-doc==0.0.7
)
started=$(date +%s)
mkdir -p "$WHL_DIR"
rm -f "$WHL_DIR"/*.whl "$WHL_DIR"/BUILD_INFO.json
if [ "$WHL_DIR" = .whl ] && exclude=$(git rev-parse --git-path info/exclude 2>/dev/null); then
    mkdir -p "$(dirname "$exclude")"
    grep -qx '/.whl/' "$exclude" 2>/dev/null || echo '/.whl/' >> "$exclude"
fi

echo "wheels.sh: downloading ${#PINS[@]} wheels for CPython $TARGET (manylinux x86-64) into $WHL_DIR"
"$BUILD_PYTHON" -m pip download -q --no-deps --only-binary=:all: --implementation cp --python-version "$TARGET" \
    --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform any -d "$WHL_DIR" "${PINS[@]}"

# Pure-Python builds, each in pip's isolated build environment (the header says why).
echo "wheels.sh: building antlr4-python3-runtime 4.9.3 from its sdist"
"$BUILD_PYTHON" -m pip wheel -q --no-deps -w "$WHL_DIR" antlr4-python3-runtime==4.9.3

# olmx from a copy of the working tree (building in place would leave build/ in the tree).
src=$(mktemp -d)
trap 'rm -rf "$src"' EXIT
if git ls-files >/dev/null 2>&1; then
    git ls-files -z --cached --others --exclude-standard | tar --null -T - --ignore-failed-read -cf - 2>/dev/null \
        | tar -xf - -C "$src"
else
    tar --exclude=.git --exclude=.venv --exclude=.whl --exclude=runs --exclude=build -cf - . | tar -xf - -C "$src"
fi
tree_mib=$(du -sm "$src" | cut -f1)
echo "wheels.sh: building olmx's wheel from the working tree"
"$BUILD_PYTHON" -m pip wheel -q --no-deps -w "$WHL_DIR" "$src"

commit=$(git rev-parse HEAD 2>/dev/null || echo unknown)
dirty=$(git status --porcelain 2>/dev/null | wc -l | tr -d ' ')
"$BUILD_PYTHON" - "$WHL_DIR" "$TARGET" "$commit" "$dirty" <<'EOF'
import json, sys, time
from pathlib import Path
out, target, commit, dirty = sys.argv[1:]
wheels = sorted(p.name for p in Path(out).glob("*.whl"))
info = {"built": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "python": target, "commit": commit,
        "uncommitted_files": int(dirty), "wheels": wheels}
(Path(out) / "BUILD_INFO.json").write_text(json.dumps(info, indent=1) + "\n")
EOF

count=$(ls "$WHL_DIR"/*.whl | wc -l)
whl_mib=$(du -sm "$WHL_DIR" | cut -f1)
echo "wheels.sh: $count wheels, $whl_mib MiB (tree $tree_mib MiB) in $(( $(date +%s) - started )) s"
if [ $((whl_mib + tree_mib)) -gt 64 ]; then
    echo "wheels.sh: $WHL_DIR ($whl_mib MiB) and the tree ($tree_mib MiB) exceed the device's 64 MiB" >&2
    exit 1
fi

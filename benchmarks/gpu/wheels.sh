#!/usr/bin/env bash
# On the development machine (it reaches PyPI): download, for the GPU machine's Python 3.12,
# the wheels olmx needs there besides torch/triton (which its image has), into .whl/ at the
# repository root (excluded from git by .git/info/exclude), so that they travel with the tree.
set -euo pipefail
cd "$(dirname "$0")/../.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
mkdir -p .whl
# Versions as in this repository's .venv (olmx's pins, OLMo-core 3.0.0's requirements that the
# GPU image lacks); torch, triton, numpy, pandas, pyyaml, requests, rich, jinja2, matplotlib,
# safetensors, filelock and packaging are in the image.
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 --platform any -d .whl \
    ai2-olmo-core==3.0.0 torchao==0.15.0 hydra-core==1.3.2 omegaconf==2.3.0 antlr4-python3-runtime==4.9.3 \
    'typer>=0.26,<0.29' entry-points-txt==0.3.0 bettermap dill dataclass-extensions importlib_resources \
    cached-path==1.8.10 boto3 botocore s3transfer jmespath google-cloud-storage google-api-core google-auth \
    google-cloud-core google-resumable-media google-crc32c googleapis-common-protos proto-plus cachetools \
    pyasn1 pyasn1-modules rsa
ls .whl | wc -l

#!/usr/bin/env bash
# Create .venv (if needed) and install bertpipe with its test and edge (ONNX export) extras. Idempotent.
# torch is pinned to the CPU build first, so that resolving transformers/accelerate does not pull a CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip >/dev/null 2>&1 || true
if ! .venv/bin/python -c "import torch" >/dev/null 2>&1; then
  .venv/bin/python -m pip install --quiet "torch==${TORCH_VERSION:-2.13.0}" \
    || .venv/bin/python -m pip install --quiet torch --index-url https://download.pytorch.org/whl/cpu
fi
.venv/bin/python -m pip install --quiet -e '.[dev,sweep,edge]'

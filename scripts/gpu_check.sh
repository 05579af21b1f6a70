#!/usr/bin/env bash
# One prepared check of bertpipe on a CUDA machine (which this project's CI cannot run). See scripts/gpu_check.py.
#   bash scripts/gpu_check.sh bundle DIR [--python 3.12] [--have FREEZE.txt] [--no-wheels]   # here: registry + ../shared
#   bash scripts/gpu_check.sh run DIR OUT [--dry-run]                                       # there: no network
# `bundle` runs under this project's .venv (it saves MiniLM in bf16 through transformers); `run` runs under the
# GPU machine's own python3 (or $PYTHON) and its torch, from the bundle's copy of the source.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
command="${1:-}"
case "$command" in
  bundle)
    python="${BUNDLE_PYTHON:-$here/../.venv/bin/python}"
    [ -x "$python" ] || python=python3
    exec "$python" "$here/gpu_check.py" "$@" ;;
  run)
    [ $# -ge 3 ] || { echo "usage: gpu_check.sh run DIR OUT [--dry-run]" >&2; exit 2; }
    python="${PYTHON:-python3}"
    # The bundle's own copy of the script, so that it matches the source it runs.
    script="$2/src/scripts/gpu_check.py"
    [ -f "$script" ] || { echo "gpu_check.sh: $2 is not a bundle (no src/scripts/gpu_check.py); make one with: gpu_check.sh bundle DIR" >&2; exit 2; }
    exec "$python" "$script" "$@" --python "$python" ;;
  *)
    echo "usage: gpu_check.sh bundle DIR [--python 3.12] [--have FREEZE.txt] [--no-wheels] | run DIR OUT [--dry-run]" >&2
    exit 2 ;;
esac

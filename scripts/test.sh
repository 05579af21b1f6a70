#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run the default test suite. Extra arguments go to pytest.
# Tests that need ../shared (the mirror and real data) skip cleanly when it is absent.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [ -z "${BERTPIPE_MIRROR:-}" ] && [ -d ../shared/mirror ]; then
  export BERTPIPE_MIRROR="$(cd ../shared/mirror && pwd)"
fi
export HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}" HF_DATASETS_OFFLINE="${HF_DATASETS_OFFLINE:-1}" TOKENIZERS_PARALLELISM=false
exec .venv/bin/python -m pytest "$@"

#!/usr/bin/env bash
# Set up, then fine-tune MiniLM on SST-2 (configs/classification/sst2.yaml), print its metrics and a few predictions.
# Air-gapped: BERTPIPE_MIRROR defaults to ../shared/mirror when that folder exists.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [ -z "${BERTPIPE_MIRROR:-}" ] && [ -d ../shared/mirror ]; then
  export BERTPIPE_MIRROR="$(cd ../shared/mirror && pwd)"
fi
RUN_DIR="${RUN_DIR:-runs/sst2-quickstart}"
.venv/bin/bertpipe train configs/classification/sst2.yaml output_dir="$RUN_DIR" overwrite=true "$@"
cat > "$RUN_DIR/examples.txt" <<'TEXT'
a gorgeous, witty and deeply moving film
the plot is thin and the jokes fall flat
it never quite decides what it wants to be, but the actors are wonderful
an exhausting two hours of noise
TEXT
.venv/bin/bertpipe predict "$RUN_DIR" --input "$RUN_DIR/examples.txt" --output "$RUN_DIR/examples.predictions.jsonl"
echo "--- predictions ($RUN_DIR/examples.predictions.jsonl)"
.venv/bin/python -c "
import json, sys
for line in open(sys.argv[1]):
    row = json.loads(line)
    print(f\"{row['label']:>8}  {row['score']:.3f}  {row['text']}\")
" "$RUN_DIR/examples.predictions.jsonl"

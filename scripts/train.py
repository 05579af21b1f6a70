"""``accelerate launch [ACCELERATE ARGS] scripts/train.py CONFIG [KEY=VALUE ...]``: ``bertpipe train`` under Accelerate.

On a CPU-only machine ``accelerate launch --multi_gpu --num_processes 2 scripts/train.py ...`` runs a
real two-process (gloo) job: the pipeline's Accelerator switches to CPU mode by itself.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tasks.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["train", *sys.argv[1:]]))

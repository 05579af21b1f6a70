"""Regenerate the README's configuration table from the config schema (pipelines/config.py).

In:  the README path (default: README.md next to this folder); ``--check`` only compares.
Out: the README with the table between its markers rewritten; with ``--check``, exit status 1 and a
     line saying so when the README's table is not the schema's (tests/test_readme.py checks the same).

    python scripts/config_table.py          # after adding or documenting a config field
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipelines.config_docs import readme_table, reference_table, update_readme  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("readme", nargs="?", default=str(Path(__file__).resolve().parents[1] / "README.md"))
    parser.add_argument("--check", action="store_true", help="exit 1 when the README's table differs from the schema")
    args = parser.parse_args(argv)
    if args.check:
        if readme_table(Path(args.readme).read_text(encoding="utf-8")) != reference_table():
            print(f"{args.readme}: the configuration table differs from pipelines/config.py; run scripts/config_table.py")
            return 1
        return 0
    print(f"{args.readme}: {'updated' if update_readme(args.readme) else 'already up to date'}")
    return 0


if __name__ == "__main__":
    from pipelines.errors import run_script

    run_script("config_table.py", main)

"""Where a benchmark writes: its ``--output-dir``, checked before any run and filled through a staging folder.

In:  the folder, whether ``--overwrite`` was given, the local inputs the benchmark reads (by the option or key
     that names each) and, for a training benchmark, its run config (whose ``data.path`` the folder must stay out of).
Out: :func:`benchmark_folder`, a context manager yielding the staging folder every run and result file is written
     to; it becomes ``--output-dir`` once the benchmark has finished. A refusal, a failed run, Ctrl-C or SIGTERM
     leave ``--output-dir`` as it was (absent, empty, or an earlier benchmark's results) and nothing beside it.

Accepted: a new or empty folder, or, with ``--overwrite``, a folder holding an earlier benchmark's results that
holds none of this benchmark's inputs. Written in place, a rerun mixed its runs with the earlier ones, and one
refused after its first run (a misspelt metric) had already replaced the earlier runs.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Iterator, Mapping

from pipelines.atomic_writes import replacing_folder
from pipelines.benchmark.report import RESULT_FILES
from pipelines.config import RunConfig
from pipelines.errors import OutputDirError
from pipelines.outputs import check_outside_data_folder, lies_inside

OPTION = "--output-dir"


def check_benchmark_folder(
    folder: Path, *, overwrite: bool, inputs: Mapping[str, str | Path], config: RunConfig | None = None
) -> None:
    """Refuse a ``folder`` the benchmark would mix its results into, or whose replacement would lose something."""
    if folder.exists() and not folder.is_dir():
        raise OutputDirError(f"{OPTION} {folder} is a file, not a folder; choose another {OPTION}")
    if config is not None:
        check_outside_data_folder(config, folder, OPTION)
    if folder.exists() and lies_inside(Path.cwd().resolve(), folder.resolve()):
        # Even empty: the finished benchmark is swapped in by renaming, and the shell's folder would be deleted under it.
        raise OutputDirError(f"{OPTION} {folder} holds the current directory, which the finished benchmark would replace; "
                             f"choose a {OPTION} outside it")
    if not folder.exists() or not any(folder.iterdir()):
        return
    earlier = next((name for name in RESULT_FILES if (folder / name).is_file()), None)
    if earlier is None:
        raise OutputDirError(
            f"{OPTION} {folder} is not empty and holds no earlier benchmark (none of {', '.join(RESULT_FILES)}); bertpipe "
            f"never writes into or deletes another folder's contents. Choose a new or empty {OPTION}"
        )
    if not overwrite:
        raise OutputDirError(
            f"{OPTION} {folder} holds an earlier benchmark ({earlier}); pass --overwrite to replace it once the new one has "
            f"finished, or choose another {OPTION}"
        )
    resolved = folder.resolve()
    for key, path in inputs.items():
        if lies_inside(Path(path).expanduser().resolve(), resolved):
            raise OutputDirError(
                f"--overwrite would replace {OPTION} {folder}, but {key} {path} lies inside it (an input of this benchmark). "
                f"Choose another {OPTION}, or move the input out first"
            )


@contextlib.contextmanager
def benchmark_folder(
    folder: str | Path, *, overwrite: bool = False, inputs: Mapping[str, str | Path] = {}, config: RunConfig | None = None
) -> Iterator[Path]:
    """:func:`check_benchmark_folder`, then the staging folder that replaces ``folder`` when the block ends without an error."""
    folder = Path(folder).expanduser()
    check_benchmark_folder(folder, overwrite=overwrite, inputs=inputs, config=config)
    with replacing_folder(folder, label=OPTION) as staging:
        yield staging


__all__ = ["benchmark_folder", "check_benchmark_folder"]

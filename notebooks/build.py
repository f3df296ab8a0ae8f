"""Build the notebooks in this folder from their jupytext percent-format sources (NN_name.py), executed.

    python notebooks/build.py                  # build and execute all four (about 3 minutes on 2 CPU cores)
    python notebooks/build.py 01_quickstart    # only the named ones
    python notebooks/build.py --no-execute     # write the cells without outputs

Edit the .py source, not the .ipynb: tests/test_notebooks.py checks that every .ipynb holds exactly its source's cells,
with outputs (they are committed executed so they read well on a code host), and executes each source. Code the
notebooks share lives in helpers.py; cells run with this folder as working directory, so they import it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import jupytext
import nbformat

HERE = Path(__file__).resolve().parent
KERNEL = "python3"
CELL_TIMEOUT_S = 300
SOURCE_FORMAT = "py:percent"
NOT_NOTEBOOKS = {"build", "helpers", "partition_worker"}  # the .py files here that are not notebook sources


def names() -> list[str]:
    """The notebooks' names: their sources' stems, in order."""
    return sorted(p.stem for p in HERE.glob("*.py") if p.stem not in NOT_NOTEBOOKS)


def source(name: str) -> Path:
    return HERE / f"{name}.py"


def path(name: str) -> Path:
    return HERE / f"{name}.ipynb"


def build(name: str) -> nbformat.NotebookNode:
    """The notebook `name` from its source, without outputs; cell ids are stable (the name's "01_" prefix and the
    cell's index) so a rebuild changes no id."""
    nb = jupytext.read(source(name), fmt=SOURCE_FORMAT)
    for index, cell in enumerate(nb.cells):
        cell.id = f"{name[:3]}{index}"
        cell.metadata = {}
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    nb.metadata = {
        "kernelspec": {"name": KERNEL, "display_name": "Python 3", "language": "python"},
        "language_info": {"name": "python"},
    }
    nb.nbformat, nb.nbformat_minor = 4, 5
    return nb


@contextlib.contextmanager
def own_kernel() -> Iterator[None]:
    """Within the block, the "python3" kernel runs this interpreter (`sys.executable`): a kernelspec for it is
    installed into a temporary folder put first on JUPYTER_PATH. A kernelspec found elsewhere may name a bare
    `python` from PATH, which need not be the environment remat is installed in."""
    with tempfile.TemporaryDirectory(prefix="remat-kernel-") as prefix:
        subprocess.run(
            [sys.executable, "-m", "ipykernel", "install", "--prefix", prefix, "--name", KERNEL],
            check=True,
            capture_output=True,
        )
        old = os.environ.get("JUPYTER_PATH")
        share = os.path.join(prefix, "share", "jupyter")
        os.environ["JUPYTER_PATH"] = share if not old else os.pathsep.join([share, old])
        try:
            yield
        finally:
            if old is None:
                del os.environ["JUPYTER_PATH"]
            else:
                os.environ["JUPYTER_PATH"] = old


def execute(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Run every cell of `nb` in place (cwd = this folder, as Jupyter runs a notebook opened here); a failing cell
    raises nbclient.exceptions.CellExecutionError. Call within `own_kernel()`."""
    from nbclient import NotebookClient

    client = NotebookClient(
        nb, timeout=CELL_TIMEOUT_S, kernel_name=KERNEL, record_timing=False, resources={"metadata": {"path": str(HERE)}}
    )
    client.execute()
    return nb


def main() -> None:
    known = names()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", help=f"notebooks to build, of {', '.join(known)} (default: all)")
    parser.add_argument("--no-execute", action="store_true", help="write the cells without running them")
    args = parser.parse_args()
    chosen = args.names or known
    unknown = [n for n in chosen if n not in known]
    if unknown:
        parser.error(f"unknown notebook(s) {unknown}; choose from {known}")
    with own_kernel() if not args.no_execute else contextlib.nullcontext():
        for name in chosen:
            nb = build(name)
            if not args.no_execute:
                start = time.perf_counter()
                execute(nb)
                print(f"{name}: executed in {time.perf_counter() - start:.1f} s")
            nbformat.validate(nb)
            nbformat.write(nb, path(name))


if __name__ == "__main__":
    main()

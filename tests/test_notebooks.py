"""The notebooks in notebooks/: each .ipynb built from its jupytext percent-format source (notebooks/NN_name.py),
committed executed, and each source still running top to bottom.

Each notebook runs in a Jupyter kernel of the interpreter running pytest (a kernelspec for it is installed into a
temporary folder for the duration, see build.own_kernel), with notebooks/ as working directory; a cell that raises
fails its test.
"""

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK_DIR = ROOT / "notebooks"
ON_DISK = sorted(p.stem for p in NOTEBOOK_DIR.glob("*.ipynb"))


def _load_build():
    spec = importlib.util.spec_from_file_location("notebooks_build", NOTEBOOK_DIR / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


build = _load_build()
SOURCES = build.names()


@pytest.fixture(scope="module")
def kernel():
    with build.own_kernel():
        yield


def _read(name):
    return nbformat.read(NOTEBOOK_DIR / f"{name}.ipynb", as_version=4)


def test_every_notebook_has_a_source():
    assert ON_DISK == SOURCES, (
        f"notebooks on disk {ON_DISK} differ from their percent-format sources {SOURCES}: add the .py source, or run "
        "`python notebooks/build.py` to write the missing .ipynb"
    )


def test_kernel_runs_this_interpreter(kernel):
    from jupyter_client.kernelspec import KernelSpecManager

    spec = KernelSpecManager().get_kernel_spec(build.KERNEL)
    assert Path(spec.argv[0]) == Path(sys.executable), spec.argv


@pytest.mark.parametrize("name", ON_DISK)
def test_cells_match_source(name):
    on_disk = [(c.cell_type, c.source) for c in _read(name).cells]
    built = [(c.cell_type, c.source) for c in build.build(name).cells]
    assert on_disk == built, (
        f"notebooks/{name}.ipynb differs from notebooks/{name}.py: edit the source, then run "
        f"`python notebooks/build.py {name}`"
    )


@pytest.mark.parametrize("name", ON_DISK)
def test_committed_executed(name):
    nb = _read(name)
    nbformat.validate(nb)
    cells = [c for c in nb.cells if c.cell_type == "code"]
    assert [c.execution_count for c in cells] == list(range(1, len(cells) + 1)), (
        f"notebooks/{name}.ipynb is not executed top to bottom: run `python notebooks/build.py {name}`"
    )
    assert any(c.outputs for c in cells), f"notebooks/{name}.ipynb has no outputs"
    errors = [o for c in cells for o in c.outputs if o.output_type == "error"]
    assert not errors, f"notebooks/{name}.ipynb holds error outputs: {[e.ename for e in errors]}"
    if (ROOT / ".git").exists() and shutil.which("git"):
        tracked = subprocess.run(
            ["git", "ls-files", "--error-unmatch", f"notebooks/{name}.ipynb"],
            cwd=ROOT,
            check=False,
            capture_output=True,
        )
        assert tracked.returncode == 0, f"notebooks/{name}.ipynb is not tracked by git: `git add` it, executed"


@pytest.mark.slow
@pytest.mark.parametrize("name", SOURCES)
def test_runs_top_to_bottom(kernel, name):
    nb = build.build(name)  # from the source, so a stale .ipynb cannot hide a failing cell
    build.execute(nb)  # raises nbclient.exceptions.CellExecutionError, with the cell and traceback, on a failure
    cells = [c for c in nb.cells if c.cell_type == "code"]
    assert [c.execution_count for c in cells] == list(range(1, len(cells) + 1))

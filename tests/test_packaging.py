"""What an installed remat carries besides its modules."""

import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_py_typed_marker_is_shipped_as_package_data():
    """PEP 561: the marker sits in the package and pyproject lists it, so the wheel installs it."""
    if sys.version_info < (3, 11):
        pytest.skip("tomllib is in the standard library from Python 3.11")
    import tomllib

    assert (ROOT / "remat" / "py.typed").is_file()
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "py.typed" in config["tool"]["setuptools"]["package-data"]["remat"]


@pytest.mark.slow
def test_wheel_contains_py_typed(tmp_path):
    """Build the wheel from a copy of the sources (the build leaves its folders there, not in the repository; no
    network: the interpreter's own setuptools) and look inside."""
    import shutil
    import subprocess

    pytest.importorskip("setuptools")
    source = tmp_path / "src"
    shutil.copytree(ROOT / "remat", source / "remat", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-build-isolation",
            "--no-deps",
            "-q",
            "-w",
            str(tmp_path / "dist"),
            str(source),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert build.returncode == 0, build.stderr
    (wheel,) = (tmp_path / "dist").glob("remat-*.whl")
    assert "remat/py.typed" in zipfile.ZipFile(wheel).namelist()


# The torch versions remat supports are one fact stated in four places: pyproject's requirement, the guard's message
# (remat/_torch/guard.py), the README's matrix and the matrix script. These tests keep them the same.


def _pyproject():
    if sys.version_info < (3, 11):
        pytest.skip("tomllib is in the standard library from Python 3.11")
    import tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _minor(version: str) -> tuple[int, int]:
    major, minor = version.split("+")[0].split(".")[:2]
    return int(major), int(minor)


def readme_matrix() -> list[str]:
    """The torch versions of the README's matrix, the first column of the table under "### torch versions"."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("### torch versions") :]
    section = section[: section.index("\n#", 1)]
    return [
        line.split("|")[1].strip().strip("`")
        for line in section.splitlines()
        if line.startswith("| `2.") or line.startswith("| 2.")
    ]


def test_pyproject_requires_the_oldest_tested_torch():
    from remat._torch import SUPPORTED_TORCH

    torch_requirements = [
        d.replace(" ", "")
        for d in _pyproject()["project"]["dependencies"]
        if d.split(">")[0].split("=")[0].split("<")[0].strip() == "torch"
    ]
    assert torch_requirements == [f"torch>={SUPPORTED_TORCH[0]}"] == ["torch>=2.11"]


def test_installed_metadata_requires_the_same_torch():
    import importlib.metadata

    try:
        requires = importlib.metadata.requires("remat") or []
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("remat is not installed here (imported from the source tree): no package metadata to read")
    assert "torch>=2.11" in [r.replace(" ", "") for r in requires]


def test_readme_matrix_spans_the_supported_range_and_matches_the_script():
    from remat._torch import SUPPORTED_TORCH

    versions = readme_matrix()
    assert versions == sorted(versions, key=lambda v: tuple(map(int, v.split("."))))
    assert _minor(versions[0]) == _minor(SUPPORTED_TORCH[0]) and _minor(versions[-1]) == _minor(SUPPORTED_TORCH[1])
    script = (ROOT / "scripts" / "test_matrix.sh").read_text()
    matrix_line = next(line for line in script.splitlines() if line.startswith("MATRIX=("))
    assert matrix_line[len("MATRIX=(") : matrix_line.index(")")].split() == versions


def test_the_torch_running_the_suite_is_in_the_matrix():
    import torch

    running = _minor(torch.__version__)
    listed = {_minor(v) for v in readme_matrix()}
    assert running in listed, (
        f"the suite runs on torch {torch.__version__}, which README's torch versions matrix does not list: add it "
        f"there, to scripts/test_matrix.sh and to remat._torch.SUPPORTED_TORCH once the suite passes on it"
    )

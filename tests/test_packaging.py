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
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-q",
                            "-w", str(tmp_path / "dist"), str(source)], capture_output=True, text=True, cwd=tmp_path)
    assert build.returncode == 0, build.stderr
    (wheel,) = (tmp_path / "dist").glob("remat-*.whl")
    assert "remat/py.typed" in zipfile.ZipFile(wheel).namelist()

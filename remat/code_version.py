"""A digest of remat's own source. It is part of the keys under which inductor caches the modules remat compiled, so
a module built by another version of remat (another rewrite, fusion barrier or never-reuse pass, none of which shows
in the module's code) is never served from inductor's cache on disk."""

from __future__ import annotations

import functools
import hashlib
import pathlib


@functools.lru_cache(maxsize=1)
def code_version() -> str:
    """sha256 of every Python file of the remat package (paths and contents), hex, 16 characters."""
    digest = hashlib.sha256()
    root = pathlib.Path(__file__).resolve().parent
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]

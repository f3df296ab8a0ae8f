"""The torch versions remat supports, and the lookup every other module of this package reaches torch through."""

from __future__ import annotations

import importlib
from typing import Any

# The torch versions remat supports, oldest and newest: pyproject's requirement and the README's test matrix agree.
SUPPORTED_TORCH = ("2.11", "2.14")
SUPPORTED = f"remat supports torch {SUPPORTED_TORCH[0]} to {SUPPORTED_TORCH[1]}"


class TorchAPIError(RuntimeError):
    """A private torch API remat relies on is missing or changed in this torch version."""


def missing(what: str) -> TorchAPIError:
    """The error for a piece of torch this version lacks, naming the version and the supported range."""
    import torch

    return TorchAPIError(f"remat needs {what}, which torch {torch.__version__} does not provide; {SUPPORTED}")


def lookup(module: str, name: str) -> Any:
    """`module.name`, or TorchAPIError naming the torch version when this torch lacks it."""
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise missing(f"{module}.{name}") from exc

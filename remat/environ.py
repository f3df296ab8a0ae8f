"""Options for callers that pass none: the REMAT_OPTIONS environment variable.

Frameworks that take a backend name but no options (`torch.compile(model, backend="remat")` written inside a
training framework, a backend chosen from a config file) reach remat with `options=None`; REMAT_OPTIONS gives them
the same options as JSON. Options given in code always win: the variable is read only when there are none.
"""

from __future__ import annotations

import json
import os
from typing import Mapping

from .config import RematConfig

ENV_VAR = "REMAT_OPTIONS"
_EXAMPLE = f"""{ENV_VAR}='{{"memory_budget": "6GiB", "inner": "aot_eager"}}'"""


def config_from_environment(environ: Mapping[str, str] | None = None) -> RematConfig:
    """The RematConfig REMAT_OPTIONS states: a JSON object of remat options, checked exactly as
    `torch.compile(..., options={...})` checks them. Unset or blank: the defaults. A bad value raises the error the
    option would raise, prefixed with the variable and its value."""
    raw = (os.environ if environ is None else environ).get(ENV_VAR, "")
    if not raw.strip():
        return RematConfig()
    where = f"{ENV_VAR}={raw!r}"
    try:
        options = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"{where}: not valid JSON ({exc.msg}, column {exc.colno}); set it to a JSON object of "
            f"remat options, e.g. {_EXAMPLE}"
        ) from None
    if not isinstance(options, dict):
        raise ValueError(f"{where}: expected a JSON object of remat options (name: value), e.g. {_EXAMPLE}")
    try:
        return RematConfig.from_options(options)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{where}: {exc}") from None

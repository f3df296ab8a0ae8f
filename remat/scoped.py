"""Compiles remat makes for itself (explain's capture, pareto's and max_batch's measurements) leave the process's
other compiled functions as they were.

dynamo keeps compiled code per code object: compiling the user's model or function again would add entries next to
the user's own (counted against its recompile limit), and torch._dynamo.reset() would throw the user's away. So the
compile goes through `own_code(fn)`, a function with a code object made for the call, whose cache entries live and
die with it; and `session()` forgets, when it ends, whatever else the compiles inside it left (entries a graph break
puts on the model's own code objects, the backends dynamo caches). Nothing compiled before changes.
"""

from __future__ import annotations

import contextlib
import types
from typing import Any, Callable, Iterator

from . import _torch


def own_code(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A function that calls `fn` with its arguments, through a code object no other function has."""

    def call(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    code = call.__code__.replace()  # a copy: a new code object with its own dynamo cache
    return types.FunctionType(code, call.__globals__, "remat_own_compile", call.__defaults__, call.__closure__)


@contextlib.contextmanager
def session() -> Iterator[None]:
    """Compiles inside the block are forgotten when it ends; compiles from before it keep their code and guards."""
    with _torch.forget_compiles():
        yield

"""dynamo's compile state: which compile is running, its structured trace, and forgetting what a block compiled."""

from __future__ import annotations

import contextlib
import copy
import importlib
from typing import Any, Callable, Iterator

from .guard import TorchAPIError, lookup


@contextlib.contextmanager
def forget_compiles() -> Iterator[None]:
    """Forget, when the block ends, what dynamo compiled inside it, leaving what it compiled before as it was: each
    cache entry the block added to a code object is invalidated as torch invalidates an entry whose guarded object
    died (its compiled code and backend are released; it never matches again), and the backends the block used are
    dropped from dynamo's backend cache, so nothing the block compiled stays alive. Entries made before the block
    stay valid: functions compiled earlier neither lose their code nor recompile. What dynamo learnt of the shapes it
    saw (its automatic-dynamic code state, keyed by file, line and name) is put back as it was, so that a later compile
    of other shapes is not traced with dynamic sizes for it. Where this torch lacks the pieces, the block's compiles
    are simply left in the caches."""
    with _code_state_kept(), _entries_forgotten():
        yield


@contextlib.contextmanager
def _code_state_kept() -> Iterator[None]:
    """The block's changes to dynamo's per-code shape memory (torch._dynamo.pgo's code state) undone when it ends."""
    pgo: Any
    try:
        pgo = importlib.import_module("torch._dynamo.pgo")
    except ImportError:
        pgo = None
    if pgo is None or not hasattr(pgo, "_CODE_STATE"):
        yield
        return
    before, initial = pgo._CODE_STATE, getattr(pgo, "_INIT_CODE_STATE", None)
    kept = {} if before is None else copy.deepcopy(dict(before))
    try:
        yield
    finally:
        if before is not None:
            before.clear()
            before.update(kept)
        pgo._CODE_STATE = before  # None: read afresh (from a saved profile, where there is one) at the next compile
        if hasattr(pgo, "_INIT_CODE_STATE"):
            pgo._INIT_CODE_STATE = initial


@contextlib.contextmanager
def _entries_forgotten() -> Iterator[None]:
    """forget_compiles' part for dynamo's cache entries and backend cache."""
    try:
        entries_of = lookup("torch._dynamo.eval_frame", "_debug_get_cache_entry_list")
        deleted = lookup("torch._dynamo.guards", "DeletedGuardManagerWrapper")
        seen = lookup("torch._dynamo.convert_frame", "input_codes").seen
        backends = lookup("torch._dynamo.eval_frame", "cached_backends")
    except TorchAPIError:
        yield
        return

    def live_entries() -> list:
        codes = [code for code in (ref() for ref in list(seen)) if code is not None]
        return [entry for code in codes for entry in entries_of(code) if entry.code is not None]

    # The compiled code objects of the entries made before, held so that their ids stay theirs during the block.
    held = [entry.code for entry in live_entries()]
    before = {id(code) for code in held}
    known_backends = set(backends)
    try:
        yield
    finally:
        for entry in live_entries():
            if id(entry.code) in before:
                continue
            manager = entry.guard_manager
            state = getattr(manager, "extra_state", None)
            if state is None:
                continue
            state.invalidate(entry, deleted("compiled by remat for its own use and forgotten after it"))
            manager.cache_entry = None  # torch's own invalidation (a guarded object dying) then finds nothing to do
        for key in set(backends) - known_backends:
            del backends[key]
        del held


def current_compile_id() -> str:
    """The id of the compile in progress as torch's logs and tlparse print it ("0/0"), or "" outside a compile or
    where this torch lacks it."""
    try:
        context = lookup("torch._guards", "CompileContext")
        compile_id = context.current_compile_id()
    except (TorchAPIError, AttributeError):
        return ""
    return str(compile_id) if compile_id is not None else ""


def current_compile_frame() -> tuple[int, int] | None:
    """(frame id, compile count within that frame) of the compile in progress: a frame is one code object dynamo
    compiles (a graph break resumes in another); a recompile of it has the same frame id and the next count. None
    outside a compile or where this torch lacks it."""
    try:
        context = lookup("torch._guards", "CompileContext")
        compile_id = context.current_compile_id()
    except (TorchAPIError, AttributeError):
        return None
    frame = getattr(compile_id, "frame_id", None)
    count = getattr(compile_id, "frame_compile_id", None)
    return (frame, count) if isinstance(frame, int) and isinstance(count, int) else None


def trace_artifact(name: str, payload_fn: Callable[[], str]) -> None:
    """Emit a JSON artifact named `name` through torch's structured logging (what `TORCH_TRACE=<dir>` writes and
    tlparse shows next to the compile's graphs). `payload_fn` runs only while a trace is being written. Does nothing
    where this torch has no structured logging."""
    try:
        trace_structured = lookup("torch._logging", "trace_structured")
    except TorchAPIError:
        return
    trace_structured("artifact", metadata_fn=lambda: {"name": name, "encoding": "json"}, payload_fn=payload_fn)

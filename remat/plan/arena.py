"""contiguous=True in the simulation: each packed saved value's own storage and its slot in the step's arena
(runtime/buffers.py), and the backward outputs inductor writes in place into those slots."""

from __future__ import annotations

from ..runtime.table import arena_slot_bytes
from .problem import Problem, Resolved
from .transfer import packed


def first_written(written_over: dict[int, int], alloc: list[int], n: int) -> dict[tuple[int, int], int]:
    """Per output written in place over another buffer, (owner, first step) -> the instance whose memory it is in:
    the first of a chain of such writes."""
    taken_by = {t: k for k, t in written_over.items()}
    found = {}
    for t, k in taken_by.items():
        while k in taken_by:
            k = taken_by[k]
        found[(t % n, alloc[t])] = k
    return found


def pack(
    problem: Problem,
    resolved: Resolved,
    spans,
    saved_spans,
    end: int,
    in_slots: dict[tuple[int, int], int],
    last_fw: list[int],
):
    """contiguous=True: each packed value is copied into its arena slot and read there from then on
    (rewrite/transfer.py): as it is computed, its own storage then living for the step that computes it only, or,
    where the forward's readers read the value itself (Problem.reads_unpacked), after the last of them, its storage
    living until then (`last_fw`: the last forward step reading each instance). A forward output, which the caller
    holds, stays. Its slot is live for the whole step, and so is the value as a saved one:
    recomputing it instead shrinks the arena wherever the peak is. A backward loop that writes its output in place
    over a packed value, or over a buffer so written (inplace.in_place; `in_slots`: first_written), writes it into
    the slot: the output takes no memory of its own."""
    a = problem.arrays
    names = packed(problem.graph, sorted(resolved.saved, key=a.index.__getitem__), resolved.moves)
    outputs = {a.storage[a.index[o]] for o in problem.graph.fw_outputs}
    stored = {a.index[name] for name in names}
    unpacked = problem.reads_unpacked
    out = []
    for owner, first, final in spans:
        if in_slots.get((owner, first), -1) in stored:
            continue
        if owner in stored and owner not in outputs and saved_spans.get(a.names[owner], (-1,))[0] == first:
            final = max(first, last_fw[owner]) if a.names[owner] in unpacked else first
        out.append((owner, first, final))
    for name in names:
        saved_spans[name] = (0, end)
    return out, [(a.index[name], arena_slot_bytes(a.nbytes[a.index[name]])) for name in names]

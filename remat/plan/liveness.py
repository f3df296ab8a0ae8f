"""The simulator's lifetimes as terms linear in a plan: the memory rows of the optimal solver's MILP.

One memory model: nothing here decides what is live. `liveness` runs `simulate.lifetimes` (the schedule, inductor's
fusion habits and buffer reuse, transfers) under two plans and reads off, per step, what every plan keeps live and
what each candidate keeps live when saved and when recomputed; a change to the simulation reaches the MILP as is.
"""

from __future__ import annotations

import dataclasses
import itertools
import types
from typing import Mapping

from .arrays import BACKWARD as BACKWARD_ROLE
from .problem import Problem
from .schedule import forward_ids
from .simulate import lifetimes


@dataclasses.dataclass(frozen=True)
class Liveness:
    """The simulation's lifetimes as terms linear in a plan, for the exact solver's memory rows. A row is a forward
    step every plan runs (a value the forward outputs need) or a backward node; recomputation counts at the row of
    the backward node it runs before. Terms are (first row, last row, bytes)."""

    rows: tuple[str, ...]  # the node of each row
    base: tuple[int, ...]  # bytes live at each row whatever the plan
    saved: Mapping[str, tuple[tuple[int, int, int], ...]]  # per candidate: what it keeps live if saved
    recomputed: Mapping[str, tuple[tuple[int, int, int], ...]]  # per candidate: what it keeps live if recomputed


def liveness(problem: Problem) -> Liveness:
    """Read off `lifetimes` under two plans: the one saving every candidate backward reads (each saved value's
    interval) and the one recomputing every choosable value (each recomputed value's interval, and the generator
    state a replayed random op keeps). Each term is cut to what holds in every plan: a saved value is live to the
    end of the forward and to its last backward reader, a recomputed one from its first backward reader to its last
    (in the all-recomputed plan chains reach further back, and readers recomputed only there read it later). What
    belongs to no candidate (backward temporaries, values only the outputs need) is `base`, the smaller of the two
    plans' counts per row, plus the forward part of each candidate the outputs need. A value kept in the forward
    only for a gradient formula's factor computed there (aot_eager) is counted with that factor (_held_for)."""
    a = problem.arrays
    every_saved, every_recomputed = problem.resolve(()), problem.resolve(problem.choosable)
    # The forward rows: the steps of the forward that saves everything, which every other plan's forward runs a
    # subset of. A value traced after the first backward node but computed from forward values alone (a gradient
    # formula's factor) runs at the end of that forward only where it is saved; elsewhere its row is the moment
    # between the forward and the backward.
    forward_rows = sorted(set(forward_ids(problem, every_saved)) | {a.index[n] for n in problem.fw_required})
    rows = [a.names[i] for i in forward_rows] + list(problem.backward)
    row_of = {a.index[name]: r for r, name in enumerate(rows)}
    candidates = {a.index[n] for n in problem.candidates}
    reads: dict[int, tuple[int, int]] = {}  # storage → first and last row of a backward node reading it
    for name in problem.backward:
        r = row_of[a.index[name]]
        for j in a.inputs[a.index[name]]:
            reads[a.storage[j]] = (reads.get(a.storage[j], (r, r))[0], r)
    fw_end = len(forward_rows) - 1
    spans: dict[str, dict[str, list[tuple[int, int, int]]]] = {"saved": {}, "recomputed": {}, "forward": {}}
    arena: dict[str, tuple[int, int, int]] = {}  # contiguous=True: a saved candidate's arena slot, every row
    held: list[tuple[str, str, tuple[int, int, int]]] = []  # (saved factor, value it holds, term): _held_for
    aliases: dict[int, list[int]] = {}  # storage → the nodes living in it (its owner and the owner's views)
    for i, o in enumerate(a.storage):
        aliases.setdefault(o, []).append(i)
    bases = []
    for which, resolved in (("saved", every_saved), ("recomputed", every_recomputed)):
        life = lifetimes(problem, resolved)
        steps = life.fw + life.bw
        at = [
            row_of.get(i, -1) if (p < len(life.fw)) == (a.role[i] != BACKWARD_ROLE) else -1 for p, i in enumerate(steps)
        ]  # the row a step is, or -1 (a recomputation or forward extra)
        first_row, last_row = [len(rows)] * (len(steps) + 1), [-1] * (len(steps) + 1)
        for p in reversed(range(len(steps))):
            first_row[p] = at[p] if at[p] >= 0 else first_row[p + 1]
        for p in range(len(steps)):
            last_row[p] = at[p] if at[p] >= 0 else last_row[p - 1]
        base = [0] * (len(rows) + 1)
        kept = {a.storage[a.index[s]] for s in resolved.saved}
        for owner, first, final in life.spans:
            lo, hi = first_row[first], last_row[final]
            if lo > hi:
                continue
            term = (lo, hi, a.nbytes[owner])
            name = a.names[owner]
            if owner not in candidates:
                base[lo] += term[2]
                base[hi + 1] -= term[2]
            elif first >= len(life.fw):
                # recomputed: live at least from its first backward reader to its last (in this plan chains reach
                # further back, and readers recomputed only here read it later)
                first_read, last_read = reads.get(owner, (len(rows), -1))
                if which == "recomputed" and max(lo, first_read) <= min(hi, last_read):
                    spans["recomputed"].setdefault(name, []).append((max(lo, first_read), min(hi, last_read), term[2]))
            elif which == "saved":
                # saved: live to the end of the forward and to its last backward reader at least (only here do
                # must-recompute readers read it, and a value not saved here is saved for a recomputed reader)
                if owner not in kept and final < len(life.fw):
                    held += _held_for(problem, every_saved, life.fw[final], aliases, owner, row_of, (lo, hi))
                hi = min(hi, max(reads.get(owner, (0, -1))[1], fw_end)) if owner in kept else fw_end
                if lo <= hi:
                    spans["saved"].setdefault(name, []).append((lo, hi, term[2]))
            elif name in problem.fw_required:
                end = hi if owner not in kept else min(hi, fw_end)
                spans["forward"].setdefault(name, []).append((lo, end, term[2]))
        if which == "saved":
            for owner, size in life.arena:
                if owner in candidates:
                    arena[a.names[owner]] = (0, len(rows) - 1, size)
                else:
                    base[0] += size
                    base[len(rows)] -= size
        bases.append(list(itertools.accumulate(base[:-1])))
        if which == "recomputed":  # a replayed random op keeps its generator state from its run to its replay
            fw_pos = {i: p for p, i in enumerate(life.fw)}
            bw_pos = {i: p for p, i in enumerate(life.bw, start=len(life.fw))}
            for name in sorted(resolved.recomputed & problem.constraints.replay.keys(), key=a.index.__getitem__):
                i = a.index[name]
                if i in fw_pos and i in bw_pos and first_row[fw_pos[i]] <= last_row[bw_pos[i]]:
                    spans["recomputed"].setdefault(name, []).append(
                        (first_row[fw_pos[i]], last_row[bw_pos[i]], problem.constraints.replay[name])
                    )
    merged = [0] * (len(rows) + 1)
    for terms in spans["forward"].values():
        for lo, hi, size in terms:
            merged[lo] += size
            merged[hi + 1] -= size
    forward = list(itertools.accumulate(merged[:-1]))
    saved = {}
    for name, terms in spans["saved"].items():
        after = max((hi for _, hi, _ in spans["forward"].get(name, ())), default=-1)
        saved[name] = tuple((max(lo, after + 1), hi, size) for lo, hi, size in terms if hi > after)
    for factor, value, (lo, hi, size) in held:
        # Live there when the factor is saved, counted with the factor; the value's own saved term leaves those rows
        # out (saved without the factor, it is live there uncounted: the rows stay a relaxation).
        saved[factor] = saved.get(factor, ()) + ((lo, hi, size),)
        saved[value] = tuple(_cut(saved.get(value, ()), lo, hi))
    outputs = {a.storage[a.index[o]] for o in problem.graph.fw_outputs}
    for name, term in arena.items():
        # Saved, the value lives in its slot at every row, and its own storage only where it is computed: the
        # forward readers `base` counts it for read the slot (a forward output's storage stays, the caller holds it).
        early = () if a.index[name] in outputs else spans["forward"].get(name, ())
        saved[name] = saved.get(name, ()) + (term,) + tuple((lo + 1, hi, -size) for lo, hi, size in early if hi > lo)
    return Liveness(
        tuple(rows),
        tuple(min(x, y) + f for x, y, f in zip(*bases, forward)),
        types.MappingProxyType(saved),
        types.MappingProxyType({n: tuple(t) for n, t in spans["recomputed"].items()}),
    )


def _cut(terms, lo: int, hi: int):
    """`terms` without rows lo..hi."""
    for first, last, size in terms:
        if first < lo:
            yield first, min(last, lo - 1), size
        if last > hi:
            yield max(first, hi + 1), last, size


def _held_for(problem: Problem, every_saved, reader: int, aliases, owner: int, row_of, rows: tuple[int, int]):
    """A forward value that the forward's outputs no longer need can still be read at the end of the forward by a
    gradient formula's factor that runs there because it is saved (aot_eager keeps the joint graph's order): in the
    plan saving everything, `owner` lives over `rows` up to `reader`. It does so in every plan saving that factor,
    so the rows past its last needed reader are counted with the factor (and left out of the value's own saved term,
    so that a plan saving both counts them once). [] when no such reader holds it."""
    a = problem.arrays
    lo, hi = rows
    needed = [
        row_of[u]
        for j in aliases[owner]
        for u in a.users[j]
        if a.role[u] != BACKWARD_ROLE and a.names[u] in problem.fw_required
    ]
    if a.names[owner] in problem.fw_required:
        needed.append(row_of[owner])
    start = max(needed, default=lo - 1) + 1
    if start > hi:
        return []
    factor = _saved_reader(problem, every_saved, reader)
    if factor is None:
        return []
    return [(factor, a.names[owner], (start, hi, a.nbytes[owner]))]


def _saved_reader(problem: Problem, every_saved, start: int) -> str | None:
    """`start` if saved, else the first saved forward value (in joint order) computed from it: the factor whose
    being saved makes the forward compute `start`."""
    a = problem.arrays
    seen, stack = set(), [start]
    found = []
    while stack:
        i = stack.pop()
        if i in seen:
            continue
        seen.add(i)
        if a.names[i] in every_saved.saved:
            found.append(i)
            continue
        stack.extend(u for u in a.users[i] if a.role[u] != BACKWARD_ROLE)
    return a.names[min(found)] if found else None

"""The walk that resolves a choice (Problem.resolve_recomputing), continued from walks made before.

From what backward reads up through the forward, a forward value is recomputed where its position is in the set
recomputed (its inputs are then walked too) and saved otherwise; forward inputs are inputs. What a walk reaches and
how it classes each value depends on that set alone, and the walk of a set goes through the walk of any subset of
it: the values the subset saves and the set recomputes are walked on from, the rest stays as it was. So a walk
starts from the kept walk of the largest subset of its set (at least the walk recomputing nothing) and walks only what
it newly recomputes. The plans along a greedy walk or a ranking grow a step at a time: most walks are short. The
answer is the one a walk from nothing gives.

A walk also keeps its classes as sets of names (Walk.names), made from its start's sets and the names it walked: a
set copied from another carries its members' hashes along, where one built anew reads every name again, and on a
large graph the names lie all over memory.
"""

from __future__ import annotations

import dataclasses

from .arrays import FORWARD, PRIMAL

KEEP = 8  # walks kept to start from, besides the one recomputing nothing (the most recent ones)


@dataclasses.dataclass(frozen=True)
class Walk:
    recompute: frozenset[int]  # the positions the walk may recompute
    seen: bytes  # per position: reached (forward values and inputs)
    saved: tuple[int, ...]
    recomputed: tuple[int, ...]
    inputs: tuple[int, ...]  # forward inputs reached
    names: tuple[frozenset[str], frozenset[str], frozenset[str]]  # saved, recomputed and inputs, by name


class Walks:
    """The walks of one graph's forward from the positions backward reads (`needed`), each from the largest kept
    walk of a subset of its positions."""

    def __init__(self, a, needed: tuple[int, ...]):
        self._a = a
        nothing: frozenset[int] = frozenset()
        none: frozenset[str] = frozenset()
        start = Walk(nothing, bytes(len(a.names)), (), (), (), (none, none, none))
        self._base = self._walk(start, nothing, list(needed))
        self._kept: list[Walk] = []

    def walk(self, recompute: frozenset[int]) -> Walk:
        """The walk recomputing where a position is in `recompute`."""
        start = self._base
        for kept in self._kept:
            if len(start.recompute) < len(kept.recompute) <= len(recompute) and kept.recompute <= recompute:
                start = kept
        if start.recompute == recompute:
            return start
        found = self._walk(start, recompute, [])
        self._kept.append(found)
        if len(self._kept) > KEEP:
            del self._kept[0]
        return found

    def _walk(self, start: Walk, recompute: frozenset[int], stack: list[int]) -> Walk:
        """`start` walked on from `stack` and from the inputs of the values it saved that `recompute` recomputes."""
        a = self._a
        role, inputs_of = a.role, a.inputs
        seen = bytearray(start.seen)
        saved: list[int] = []
        recomputed = list(start.recomputed)
        moved: list[int] = []  # what the start saved and this walk recomputes
        for i in start.saved:
            if i in recompute:
                moved.append(i)
                stack.extend(inputs_of[i])
            else:
                saved.append(i)
        recomputed += moved
        kept_saved = len(saved)  # the start's saved values this walk keeps saving; the new ones follow
        inputs = list(start.inputs)
        while stack:
            i = stack.pop()
            if seen[i]:
                continue
            if role[i] == PRIMAL:
                seen[i] = 1
                inputs.append(i)
            elif role[i] == FORWARD:
                seen[i] = 1
                if i in recompute:
                    recomputed.append(i)
                    stack.extend(inputs_of[i])
                else:
                    saved.append(i)
        saved_names, recomputed_names, input_names = start.names
        if moved:
            saved_names = saved_names - self._names(moved)
        names = (
            _joined(saved_names, self._names(saved[kept_saved:])),
            _joined(recomputed_names, self._names(recomputed[len(start.recomputed) :])),
            _joined(input_names, self._names(inputs[len(start.inputs) :])),
        )
        return Walk(recompute, bytes(seen), tuple(saved), tuple(recomputed), tuple(inputs), names)

    def _names(self, positions: list[int]) -> frozenset[str]:
        """The names at `positions`."""
        return frozenset(map(self._a.names.__getitem__, positions))


def _joined(kept: frozenset[str], new: frozenset[str]) -> frozenset[str]:
    """`kept` with `new` added: `kept` itself where nothing is new."""
    return kept | new if new else kept

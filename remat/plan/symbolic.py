"""A plan's memory as sympy expressions in the graph's size symbols (dynamic shapes).

A plan is a set of decisions (save this, recompute that), and those stay meaningful at every size: the storages the
step allocates and when each is live do not depend on the sizes, only their bytes do. So the live bytes while a step
runs are a sum of the live storages' `nbytes_expr`, and the plan's peak is the Max of those sums over the steps.

A graph has thousands of steps, and a Max with thousands of arguments is unusable, so the step expressions are
reduced before the Max is built: each step's live bytes are kept as a vector of integer coefficients over the terms
(`1`, `s0`, `s0*s1`, `floor(s0/2)`, ...) the byte expressions are made of; identical vectors are merged; and a vector
is dropped when another one is proved at least as large for every positive integer size. The proof is cheap and
sound, not complete: term by term, where a monomial's shortfall may be made up by surplus on its multiples (for
positive integers s0 ≤ s0*s1 ≤ s0**2*s1), and any other surplus must sit on a term that is nonnegative. What cannot
be proved this way stays in the Max.
"""

from __future__ import annotations

import fractions
import functools
from typing import Mapping, Union

import sympy

from .problem import Problem, Resolved
from .simulate import lifetimes

Coefficient = Union[int, fractions.Fraction]
Vector = tuple[tuple[int, Coefficient], ...]  # (term id, nonzero coefficient), sorted by term id


def symbolic_memory(problem: Problem, resolved: Resolved) -> tuple[sympy.Expr, sympy.Expr]:
    """(peak bytes, saved bytes) of a plan as sympy expressions in the graph's size symbols, which are positive
    integers. Without symbols both are sympy Integers equal to `simulate`'s `peak_bytes` and `saved_bytes`.

    The expressions are this plan's figures as functions of the sizes: the decisions are held fixed, only the
    bytes of each storage vary. Pure: the problem and the choice are only read."""
    graph, index = problem.graph, problem.arrays.index
    life = lifetimes(problem, resolved)
    terms = _Terms()
    owner_vectors: dict[int, Mapping[int, Coefficient]] = {}
    for owner, _, _ in life.spans:
        if owner not in owner_vectors:
            owner_vectors[owner] = terms.decompose(graph.values[owner].nbytes_expr)

    saved: dict[int, Coefficient] = {}
    for name in life.saved_spans:
        _accumulate(saved, owner_vectors.get(index[name]) or terms.decompose(graph[name].nbytes_expr), 1)
    # Saved bytes that are no graph value (generator states of replayed random ops, shards) are fixed sizes here:
    # a generator state does not scale; a shard is taken at its size at the hint.
    extra_vectors = [terms.decompose(sympy.Integer(size)) for size, _, _ in life.extra_spans]
    for vector in extra_vectors:
        _accumulate(saved, vector, 1)
    saved_expr = terms.expression(_vector(saved))

    num_steps = len(life.fw) + len(life.bw)
    starts: list[list[int]] = [[] for _ in range(num_steps + 1)]
    ends: list[list[int]] = [[] for _ in range(num_steps + 1)]
    # contiguous=True: the arena's slots, for the whole step; sized at the hint, as its alignment rounds them.
    arena_vectors = [terms.decompose(sympy.Integer(size)) for _, size in life.arena]
    vectors = [owner_vectors[owner] for owner, _, _ in life.spans] + extra_vectors + arena_vectors
    intervals = [(first, final) for _, first, final in [*life.spans, *life.extra_spans]]
    intervals += [(0, num_steps - 1)] * len(arena_vectors)
    for k, (first, final) in enumerate(intervals):
        starts[first].append(k)
        ends[final + 1].append(k)
    live: dict[int, Coefficient] = {}
    distinct: set[Vector] = set()
    for step in range(num_steps):
        changed = bool(starts[step] or ends[step])
        for k in ends[step]:
            _accumulate(live, vectors[k], -1)
        for k in starts[step]:
            _accumulate(live, vectors[k], 1)
        if changed or step == 0:
            distinct.add(_vector(live))
    frontier = _undominated(distinct, terms)
    if not frontier:
        return sympy.Integer(0), saved_expr
    peaks = [terms.expression(v) for v in frontier]
    # No evaluation: sympy's pairwise comparisons cost milliseconds per pair and find little the pruning missed;
    # substituting numbers evaluates the Max.
    return (peaks[0] if len(peaks) == 1 else sympy.Max(*peaks, evaluate=False)), saved_expr


def positive_symbols(expr: sympy.Expr) -> sympy.Expr:
    """`expr` with every free symbol replaced by a symbol of the same name that is a positive integer (torch's size
    symbols already are; this makes sure for expressions built elsewhere)."""
    swap = {
        s: _positive_symbol(s.name)
        for s in expr.free_symbols
        if isinstance(s, sympy.Symbol) and not (s.is_integer and s.is_positive)
    }
    return expr.xreplace(swap) if swap else expr


@functools.lru_cache(maxsize=None)
def _positive_symbol(name: str) -> sympy.Symbol:
    return sympy.Symbol(name, integer=True, positive=True)


class _Terms:
    """Numbers the terms byte expressions are made of, and knows what can be proved about them for positive integer
    sizes: whether a term is nonnegative, and which monomials are at most which (m ≤ m' when m divides m')."""

    def __init__(self) -> None:
        self.ids: dict[sympy.Expr, int] = {}
        self.terms: list[sympy.Expr] = []
        self.nonnegative: list[bool] = []
        self.monomial: list[dict[sympy.Symbol, int] | None] = []  # exponents; {} for the constant 1
        self.at_two: list[Coefficient] = []  # value with every symbol at 2: the scan order of _undominated
        self.cache: dict[sympy.Expr, Mapping[int, Coefficient]] = {}

    def decompose(self, expr: sympy.Expr) -> Mapping[int, Coefficient]:
        """{term id: coefficient} with expr == Σ coefficient · term."""
        found = self.cache.get(expr)
        if found is None:
            found = {}
            for term, coefficient in sympy.expand(positive_symbols(expr)).as_coefficients_dict().items():
                if coefficient != 0:
                    found[self._id(term)] = _number(coefficient)
            self.cache[expr] = found
        return found

    def _id(self, term: sympy.Expr) -> int:
        if term not in self.ids:
            self.ids[term] = len(self.terms)
            self.terms.append(term)
            monomial = _monomial(term)
            self.monomial.append(monomial)
            self.nonnegative.append(monomial is not None or term.is_nonnegative is True)
            value = term.xreplace({s: sympy.Integer(2) for s in term.free_symbols})
            self.at_two.append(_number(value) if value.is_Rational else 0)
        return self.ids[term]

    def expression(self, vector: Vector) -> sympy.Expr:
        return sympy.Add(*(sympy.Rational(c.numerator, c.denominator) * self.terms[t] for t, c in vector))

    def key(self, vector: Vector) -> Coefficient:
        return sum(c * self.at_two[t] for t, c in vector)

    def below(self, small: int, big: int) -> bool:
        """Term `small` ≤ term `big` for all positive integer symbols: a monomial dividing another."""
        m, n = self.monomial[small], self.monomial[big]
        return m is not None and n is not None and all(n.get(s, 0) >= e for s, e in m.items())

    def dominated(self, small: Vector, big: Vector) -> bool:
        """True if Σ small ≤ Σ big is proved for every positive integer value of the symbols: where `small` has
        more of a term than `big`, the excess is covered by `big`'s surplus on that term's multiples (each at least
        the term itself), and every other surplus is on a nonnegative term."""
        diff = dict(big)
        for t, c in small:
            diff[t] = diff.get(t, 0) - c
        surplus = {t: d for t, d in diff.items() if d > 0}
        if any(not self.nonnegative[t] for t in surplus):
            return False
        deficits = sorted(((t, -d) for t, d in diff.items() if d < 0), key=lambda td: -self.at_two[td[0]])
        for t, need in deficits:  # largest terms first: they have the fewest multiples to draw on
            for u in sorted(surplus, key=lambda u: (self.at_two[u], u)):
                if need <= 0:
                    break
                if self.below(t, u):
                    take = min(need, surplus[u])
                    need -= take
                    surplus[u] -= take
            if need > 0:
                return False
        return True


def _monomial(term: sympy.Expr) -> dict[sympy.Symbol, int] | None:
    """Exponents of a product of positive integer symbols (the constant 1 is the empty product); None otherwise."""
    if term == 1:
        return {}
    exponents: dict[sympy.Symbol, int] = {}
    for base, exp in term.as_powers_dict().items():
        if not (isinstance(base, sympy.Symbol) and base.is_integer and base.is_positive and exp.is_Integer and exp > 0):
            return None
        exponents[base] = exponents.get(base, 0) + int(exp)
    return exponents


def _undominated(vectors: set[Vector], terms: _Terms) -> list[Vector]:
    """The vectors no other vector is proved to dominate. A dominator is at least as large with every symbol at 2,
    so scanning by decreasing value there compares each vector only with the ones already kept (a dominator that
    ties is found too when it sorts first; when it does not, the two are both kept, which is sound)."""
    order = sorted(vectors, key=lambda v: (-terms.key(v), v))
    kept: list[Vector] = []
    for v in order:
        if not any(terms.dominated(v, k) for k in kept):
            kept.append(v)
    return kept


def _accumulate(into: dict[int, Coefficient], vector: Mapping[int, Coefficient], sign: int) -> None:
    for t, c in vector.items():
        total = into.get(t, 0) + sign * c
        if total:
            into[t] = total
        else:
            into.pop(t, None)


def _vector(counts: Mapping[int, Coefficient]) -> Vector:
    return tuple(sorted(counts.items()))


def _number(value: sympy.Expr) -> Coefficient:
    if value.is_Integer:
        return int(value)
    if value.is_Rational:
        return fractions.Fraction(int(value.p), int(value.q))
    raise ValueError(f"symbolic_memory: a byte expression has the non-rational coefficient {value}")

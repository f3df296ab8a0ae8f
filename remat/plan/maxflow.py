"""The source side of a minimum cut, for mincut.py: scipy's compiled max-flow, checked, where the capacities fit it.

scipy.sparse.csgraph.maximum_flow takes int32 capacities only. The cut is kept exact anyway: every capacity above
`bound` (uncuttable edges included) is lowered to `bound`, which exceeds some cut's value; no minimum cut crosses
such an edge before or after, so the minimum cuts are the same. The flow scipy returns is then checked in int64
(capacities, conservation, its value below `bound`, no augmenting path left), and the source side read from its
residual network is the least one — the same set for every maximum flow, so the same set networkx's Boykov–Kolmogorov
finds. Where the capacities do not fit int32, or a check fails, the caller cuts with networkx instead (None).
"""

from __future__ import annotations

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import breadth_first_order, maximum_flow

INT32_MAX = 2**31 - 1


class Edges:
    """A flow network's directed edges as arrays, without 2-cycles: `tails[e] → heads[e]` over nodes 0..size-1."""

    def __init__(self, size: int, tails: list[int], heads: list[int]):
        self.size = size
        self.tails = np.asarray(tails, dtype=np.int32)
        self.heads = np.asarray(heads, dtype=np.int32)
        # The network's CSR layout, the same for every cut: edges sorted by (tail, head), as a CSR matrix built from
        # them holds its entries; each edge's key (tail * size + head) finds its entry in the flow scipy returns.
        self._order = np.lexsort((self.heads, self.tails))
        self._indices = self.heads[self._order]
        self._indptr = np.concatenate([[0], np.cumsum(np.bincount(self.tails, minlength=size))]).astype(np.int32)
        self._keys = self.tails.astype(np.int64) * size + self.heads
        reverse = self.heads.astype(np.int64) * size + self.tails
        if len(np.unique(self._keys)) != len(self._keys) or np.isin(reverse, self._keys).any():
            raise ValueError("maxflow.Edges: repeated edges or 2-cycles")

    def source_side(self, capacities: np.ndarray, bound: int, source: int, sink: int) -> np.ndarray | None:
        """Per node, whether it is on the source side of the least minimum cut under `capacities` (int64 per edge,
        `bound` or more for an uncuttable edge), given that some cut's value is below `bound`; None where scipy cannot
        take them (`bound` above int32) or its flow fails a check."""
        if bound > INT32_MAX:
            return None
        caps = np.minimum(capacities, bound)
        shape = (self.size, self.size)
        network = csr_matrix((caps[self._order].astype(np.int32), self._indices, self._indptr), shape=shape)
        result = maximum_flow(network, source, sink, method="dinic")
        flow = result.flow  # CSR: every edge, and the reverse of each
        if not flow.has_sorted_indices:
            flow = flow.sorted_indices()
        rows = np.repeat(np.arange(self.size, dtype=np.int64), np.diff(flow.indptr))
        keys = rows * self.size + flow.indices
        at = np.minimum(np.searchsorted(keys, self._keys), len(keys) - 1)
        if len(keys) == 0 or (keys[at] != self._keys).any():
            return None  # an edge missing from the flow: not the layout this reading assumes
        flows = np.asarray(flow.data[at], dtype=np.int64)
        net = np.bincount(self.tails, flows, self.size) - np.bincount(self.heads, flows, self.size)
        inner = np.ones(self.size, dtype=bool)
        inner[[source, sink]] = False
        value = int(net[source])
        if (
            (flows < 0).any()
            or (flows > caps).any()
            or np.abs(net[inner]).max(initial=0) > 0
            or value != int(result.flow_value)
            or value >= bound
        ):
            return None
        # the residual network: an edge where flow is below its capacity, its reverse where flow runs
        left = -np.asarray(flow.data, dtype=np.int64)  # a reverse entry: 0 - (-flow)
        left[at] += caps
        residual = csr_matrix(((left > 0).astype(np.int8), flow.indices, flow.indptr), shape=shape)
        residual.eliminate_zeros()
        reached = np.zeros(self.size, dtype=bool)
        reached[breadth_first_order(residual, source, directed=True, return_predecessors=False)] = True
        return None if reached[sink] else reached

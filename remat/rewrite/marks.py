"""How the rewrite marks the nodes it adds, for the passes after it (the schedule, the profile) to find them.

``node.meta[MARK]`` is (kind, name of the node it stands for): "replay" for a random op re-run in backward from its
saved generator state and the values computed from it; for the backward chain of a saved value's move, the move's
profile key (runtime/table.py): "gather" for a sharded value gathered again, "reload" for an offloaded value brought
back. Names are not relied on: inner compilers and graph copies may rename nodes.
"""

MARK = "remat_rewrite"


def recomputed(node, names) -> bool:
    """Whether the backward `node` recomputes a forward value: one of `names` (the plan's recomputed values), or a
    random op's replay and what is computed from it."""
    return node.name in names or node.meta.get(MARK, ("",))[0] == "replay"

"""Every rank of a sharded job (partition=) takes the same decisions: plans are compared across the group."""

from __future__ import annotations

import hashlib


def fingerprint(plan) -> str:
    """A stable hash of a plan's decisions (names, actions, bytes kept): equal plans hash equal on every rank."""
    text = "\n".join(f"{d.name}|{d.action.value}|{d.kept}" for d in plan.decisions)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class RankDisagreement(RuntimeError):
    """Ranks planned the same graph differently; sharded values would not line up."""


def check_ranks_agree(plan, group) -> None:
    """Gather every rank's decisions; raise on every rank, naming the first differing decision, if any differ."""
    import torch.distributed as dist

    from .. import _torch

    mine = (fingerprint(plan), [(d.name, d.action.value) for d in plan.decisions])
    gathered: list = [None] * dist.get_world_size(group)
    with _torch.eager_dispatch():
        dist.all_gather_object(gathered, mine, group=group)
    reference = gathered[0]
    for rank, other in enumerate(gathered):
        if other[0] == reference[0]:
            continue
        for i, (a, b) in enumerate(zip(reference[1], other[1])):
            if a != b:
                raise RankDisagreement(
                    f"partition: rank {rank} planned decision {i} as {b[0]} → {b[1]}, rank 0 as {a[0]} → {a[1]}; "
                    "every rank must plan the same graph identically (same model, inputs shapes and remat options; "
                    "a policy must not depend on the rank)"
                )
        raise RankDisagreement(
            f"partition: rank {rank} planned {len(other[1])} decisions, rank 0 planned {len(reference[1])} "
            f"(plan hashes {other[0]} vs {reference[0]}); every rank must compile the same graph with the same options"
        )

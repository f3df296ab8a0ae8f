"""The Decision rows of values that leave the device or come with extra state: offloaded, partitioned over ranks,
kept whole where partitioning cannot apply, and a replayed random op's generator state; each with its reason."""
from __future__ import annotations

from ..annotate import Action
from ..units import fmt_bytes
from .plan import Decision
from .transfer import eligible, shard_bytes


def transfer_decision(problem, resolved, name: str, reason: str):
    """(action, device bytes kept, reason) of a saved value, given where the plan keeps it."""
    v = problem.graph[name]
    if name in resolved.offloaded:
        why = problem.constraints.must_offload.get(name) or (
            "offload=True" if problem.transfer.offload is True else
            f"offload=\"auto\": {fmt_bytes(2 * v.nbytes)} of copies hide behind the forward compute after it")
        kept = v.nbytes if v.device == "cpu" else 0
        where = "; on CPU the host is the device, so no bytes leave" if v.device == "cpu" else ""
        ms = 2e3 * v.nbytes / problem.transfer.host_bandwidth
        return (Action.OFFLOAD, kept,
                f"offloaded to host ({why}): {fmt_bytes(2 * v.nbytes)} of copies, {ms:.2f} ms at host_bandwidth{where}")
    if problem.transfer.world > 1 and name in problem.rank_local and eligible(problem.graph, name):
        return Action.SAVE, None, f"{reason}; kept whole, not partitioned: {problem.rank_local[name]}"
    if name in resolved.partitioned:
        world = problem.transfer.world
        chunk = shard_bytes(v, world)
        return (Action.PARTITION, chunk,
                f"partitioned over {world} ranks: {fmt_bytes(chunk)} kept here; backward all-gathers "
                f"{fmt_bytes(chunk * world)}")
    return Action.SAVE, None, reason


def rng_state_decision(value, nbytes: int):
    """The generator state a replayed random op keeps, as a saved row of its own."""
    return Decision(f"{value.name}_rng_state", "rng state", value.module_path, (nbytes,), "uint8", nbytes, 0,
                    Action.SAVE, f"generator state before {value.op}: backward replays it with the same numbers")

"""The Decision rows of values that leave the device or come with extra state: offloaded, sharded over ranks, kept
whole where sharding cannot apply, and a replayed random op's generator state; each with its reason."""

from __future__ import annotations

from ..annotate import Action
from ..units import fmt_bytes
from .plan import Decision
from .transfer import eligible, kept_bytes, transfer_seconds


def transfer_decision(problem, resolved, name: str, reason: str):
    """(action, device bytes kept, reason) of a saved value, given where the plan keeps it."""
    v = problem.graph[name]
    move = resolved.moves.get(name)
    if move is None:
        if problem.transfer.world > 1 and name in problem.rank_local and eligible(problem.graph, name):
            return Action.SAVE, None, f"{reason}; kept whole, not partitioned: {problem.rank_local[name]}"
        return Action.SAVE, None, reason
    world = problem.transfer.world
    kept = kept_bytes(v, move, world)
    action = Action(move.action)
    if action is Action.OFFLOAD:
        copies = fmt_bytes(move.host_copies * v.nbytes)
        why = problem.constraints.must_offload.get(name) or (
            "offload=True"
            if problem.transfer.offload is True
            else f'offload="auto": {copies} of copies hide behind the forward compute after it'
        )
        where = "; on CPU the host is the device, so no bytes leave" if v.device == "cpu" else ""
        ms = 1e3 * transfer_seconds(v, move, problem.transfer)
        return (action, kept, f"offloaded to host ({why}): {copies} of copies, {ms:.2f} ms at host_bandwidth{where}")
    if action is Action.SHARD:
        return (
            action,
            kept,
            f"partitioned over {world} ranks: {fmt_bytes(kept)} kept here; backward all-gathers "
            f"{fmt_bytes(kept * world)}",
        )
    return action, kept, f"{move.participle}: {fmt_bytes(kept)} kept on the device"


def rng_state_decision(value, nbytes: int):
    """The generator state a replayed random op keeps, as a saved row of its own."""
    return Decision(
        f"{value.name}_rng_state",
        "rng state",
        value.module_path,
        (nbytes,),
        "uint8",
        nbytes,
        0,
        Action.SAVE,
        f"generator state before {value.op}: backward replays it with the same numbers",
    )

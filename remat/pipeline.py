"""capture → cost → annotate → plan for one joint graph: the part of the pipeline shared by the backend and explain."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import threading
from typing import Any, Callable, Iterator

import torch.fx as fx

from .annotate import annotate
from .capture import capture
from .config import RematConfig
from .cost import costs
from .plan.check import check_plan
from .plan.plan import Plan
from . import _torch
from .plan.problem import BaselineSpec, Problem, Resolved, build_problem
from .plan.transfer import Transfer
from .plan.evaluate import Evaluator
from .plan.solve import make_plan
from .regions import checkpoint_regions, region_count


Modules = tuple[fx.GraphModule, fx.GraphModule]


@dataclasses.dataclass(frozen=True)
class Planned:
    plan: Plan
    problem: Problem
    resolved: Resolved
    # What builds the forward and backward modules of the inner compiler's own partitioner (inductor, aot_eager:
    # min-cut), run as they are when the plan is that partition's; None where there is no such partitioner.
    inner_build: Callable[[], Modules] | None = None

    @functools.cached_property
    def inner_modules(self) -> Modules | None:
        """The inner compiler's own (forward, backward) modules, built on the first read (baseline_of)."""
        return self.inner_build() if self.inner_build is not None else None

    @property
    def is_baseline(self) -> bool:
        return (
            self.resolved == self.problem.resolve_saved(self.problem.baseline.saved)
            if self.problem.baseline.saved is not None
            else False
        )


def shard_group(config: RematConfig):
    """The process group saved values are sharded over (the partition= option), or None."""
    if config.partition is None:
        return None
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            f"partition={config.partition!r}: torch.distributed is not initialized in this process; call "
            "torch.distributed.init_process_group(...) before compiling, or leave partition=None"
        )
    return dist.group.WORLD if isinstance(config.partition, str) else config.partition


def transfer_of(config: RematConfig) -> Transfer:
    group = shard_group(config)
    world = rank = 0
    if group is not None:
        import torch.distributed as dist

        world, rank = dist.get_world_size(group), dist.get_rank(group)
    return Transfer(
        offload=config.offload,
        host_bandwidth=config.host_bandwidth_bytes(),
        world=max(world, 1),
        rank=rank,
        group=group.group_name if group is not None else "",
        contiguous=config.contiguous,
    )


def plan_joint(
    joint: fx.GraphModule,
    num_fwd_outputs: int,
    config: RematConfig,
    hooked: frozenset[str] = frozenset(),
    static_lifetime_input_indices=None,
    frugal: bool = False,
) -> Planned:
    """Plan one joint graph; `hooked` names the dynamo-graph nodes that carry tensor hooks (capture.hooked_nodes);
    `frugal`: a graph that later graphs of its step follow leaves room for them (solve.make_plan).

    Python's garbage collector is paused throughout (gc_paused); what torch's partition leaves behind is collected
    once planning is done (collect_leftovers)."""
    collects = gc.isenabled()
    with gc_paused():
        baseline = inner_partition(joint, num_fwd_outputs, config, static_lifetime_input_indices)
        planned = _plan_joint(joint, num_fwd_outputs, config, hooked, frugal, baseline)
        if collects:
            collect_leftovers()
        return planned


def inner_partition(joint: fx.GraphModule, num_fwd_outputs: int, config: RematConfig, static):
    """baseline_of: the inner compiler's own partition. It leaves its copies of the graph behind in reference cycles
    (fx nodes), collected after planning (collect_leftovers)."""
    return baseline_of(joint, num_fwd_outputs, config, static)


def collect_leftovers() -> None:
    """The youngest generation collected once planning is done: torch's partition (inner_partition) leaves its copies
    of the graph behind in reference cycles, and they are nearly all that generation holds besides what planning
    keeps (on the 50k-node chain, walking the latter takes about 0.2 s of the 2 s). Collected before planning, they
    left the allocator's pools full of holes, which planning's millions of small objects then filled, scattered over
    the heap: the same plans took a third more CPU time (the solvers' part on that chain: 5.3-6.3 s against 3.9-4.4
    s). Kept until then, the copies raise the process's peak memory during planning (there by about 220 MiB)."""
    gc.collect(0)


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for the duration, then as it was. Planning allocates millions of small
    containers and few cycles; every collection would walk the whole heap (the model's graphs, torch's state) for
    nothing: on the 10k-node chain a tenth or more of the planning time."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _plan_joint(
    joint: fx.GraphModule,
    num_fwd_outputs: int,
    config: RematConfig,
    hooked: frozenset[str],
    frugal: bool,
    baseline: tuple[BaselineSpec, Callable[[], Modules] | None],
) -> Planned:
    spec, inner_build = baseline
    # checkpoint regions marked in the model, counted where a budget decides instead (the plan notes them)
    regions = region_count(joint) if config.memory_budget is not None else 0
    graph = capture(joint, num_fwd_outputs, traced_backward=not min_cut_view(config))
    table = costs(joint, graph)
    # Checkpoint regions marked in the model are honoured without a budget; with one, the budget decides.
    constraints = annotate(
        joint,
        graph,
        table,
        config.save_op_targets(),
        config.policy,
        config.rng,
        regions=config.memory_budget is None,
        hooked=hooked,
    )
    if spec.saved is None:
        # The default partition computes gradient formulas in backward: under the min-cut view they are forward
        # values it recomputes.
        chosen = set(graph.formula_values)
        if regions:
            chosen |= checkpoint_regions(joint, graph).must_recompute.keys()
        spec = dataclasses.replace(spec, chosen=frozenset(chosen))
    fuses = config.inner == "inductor"
    problem = build_problem(
        graph,
        table,
        constraints,
        transfer_of(config),
        fuses=fuses,
        baseline=spec,
        hoists=fuses and not _torch.fusion_barrier_supported(),
    )
    budget = config.budget_bytes() if config.budget_kind() == "bytes" else config.budget_fraction()
    with Evaluator(problem, config.solver_time_limit, frugal) as evaluator:
        plan = on_own_thread(make_plan, problem, config.budget_kind(), budget, config.solver, config.strict, evaluator)
    if regions:
        plan = dataclasses.replace(
            plan,
            notes=plan.notes
            + (f"{regions} checkpoint region(s) marked in the model were not imposed: memory_budget decides",),
        )
    resolved = plan.resolved  # the sets the simulator scored are the sets the rewrite builds
    assert resolved is not None  # make_plan's plans carry them
    if config.debug:
        check_plan(plan)
    return Planned(plan, problem, resolved, inner_build)


def on_own_thread(fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args)` on a thread of its own, which this one waits for: its result, or its exception raised here.

    The solvers are pure Python over the Problem. Run on the thread that is compiling (inside aot_autograd's
    partition step), they took 2-3x the CPU time they take on any other thread (the benchmark's GPT-style graph under
    inductor: 7.7 s against 3.0 s, same plan, measured both ways in one process), so planning gets a fresh thread.
    """
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["value"] = fn(*args)
        except BaseException as error:  # noqa: BLE001 - passed back to the caller as it is
            result["error"] = error

    worker = threading.Thread(target=run, name="remat-plan", daemon=True)
    worker.start()
    worker.join()
    if "error" in result:
        raise result["error"]
    return result["value"]


# The inner compilers whose plain torch.compile backend partitions with torch's min-cut partitioner.
MIN_CUT_INNERS = ("inductor", "aot_eager")


def min_cut_view(config: RematConfig) -> bool:
    """Whether remat plans the joint graph as torch's min-cut partitioner sees it (its common subexpressions merged,
    gradient-formula factors computed from forward values alone free to run in the forward and be saved): under
    the inner compilers that partition with it, with or without a save list, so that a plan with `save_ops` and one
    without choose from the same graph. A policy keeps the graph as traced (it decides for forward ops only)."""
    return config.inner in MIN_CUT_INNERS and config.policy is None


def baseline_of(joint: fx.GraphModule, num_fwd_outputs: int, config: RematConfig, static_lifetime_input_indices=None):
    """The inner compiler's own partition of `joint`: (BaselineSpec, what builds its modules, or None). Under inductor
    and aot_eager that is torch's min-cut partitioner, run as plain `torch.compile` with that backend runs it (the
    user's functorch config applies); under eager (no partitioner: autograd saves what the backward reads) the
    default partition.

    Without a budget that partition is the plan, and its modules are built here. With one, planning needs only the
    set it saves (torch's partitioner stopped before it builds modules: on large graphs half its time); the modules
    are built from the joint graph if the plan turns out to be that partition."""
    if min_cut_view(config):
        _torch.min_cut_cse(joint, num_fwd_outputs)
    if not min_cut_view(config) or config.save_ops:
        # A policy or save list is remat's own: plain torch.compile has no such thing, so the baseline is then the
        # default partition under the user's rules.
        regions = region_count(joint)
        return BaselineSpec("default partition + checkpoint regions" if regions else "default partition"), None
    kind = f"{config.inner} min-cut partition"
    if config.memory_budget is None:
        fw, bw, saved = _torch.min_cut_partition(joint, num_fwd_outputs, static_lifetime_input_indices, merged=True)
        return BaselineSpec(kind, saved=frozenset(saved)), lambda: (fw, bw)
    saved = _torch.min_cut_saved(joint, num_fwd_outputs, static_lifetime_input_indices, merged=True)

    def build() -> Modules:
        fw, bw, _ = _torch.min_cut_partition(joint, num_fwd_outputs, static_lifetime_input_indices, merged=True)
        return fw, bw

    return BaselineSpec(kind, saved=frozenset(saved)), build

"""One byte budget for the whole step when a compiled model becomes several graphs.

Graph breaks, DDP's buckets (DDPOptimizer) and frames left to eager split one training step into several graphs, each
planned on its own. Their forwards run in order and each graph keeps what it saves until its backward, which runs
after the backwards of the graphs after it: while graph k runs, what graphs 0..k-1 keep for backward is live too. So
a byte `memory_budget` bounds the step: graph k is planned under the budget less the bytes the earlier graphs keep
(their saved values, and the inputs other than parameters that they keep for backward: activations of the graphs
before them) and less its own such inputs, which are live while it runs.

Earlier graphs are planned first, before the later ones exist, and a later graph cannot make them keep less. So a
graph that dynamo cut short (a graph break; every DDP bucket, as DDPOptimizer marks them all) does not spend the
budget on saving: of the plans meeting its budget it takes the one under which the step would peak lowest were
another graph like it to follow (plan/evaluate.pick_frugal), leaving the rest to the graphs after it; the step's
last graph (it ends at the model's return) takes the cheapest plan, as a model that is one graph does.

The graphs of one step are those one backend compiles (one `torch.compile(..., backend="remat", options=...)` or
`remat.compile` call), in the order dynamo compiles them, which is the order their forwards first run. A recompile
of a graph (new shapes) takes that graph's place, so recompiles never pile up; a new compile of the same code with
inputs of the same shapes is another module running that code in the step (FSDP2 compiles each block on its own) and
counts on its own. A graph that runs several times in one step (a compiled block called in a loop) is counted once.
Fraction budgets resolve per graph.
"""

from __future__ import annotations

import dataclasses
import threading
import uuid
from typing import Sequence

import torch
import torch.fx as fx

from .capture import tensor_bytes
from .config import RematConfig
from .pipeline import Planned, plan_joint
from .plan.problem import Resolved
from .plan.solve import BudgetError
from .units import fmt_bytes

Frame = tuple[int, int]  # (dynamo frame id, compile count within that frame): _torch.current_compile_frame()


@dataclasses.dataclass(frozen=True)
class Share:
    """How a step's byte budget was split for one graph."""

    step_budget: int  # bytes; the memory_budget the user gave, for the whole step
    held: int  # bytes the earlier graphs of the step keep for backward while this graph runs
    earlier: int  # how many graphs of the step come before this one
    inputs: int = 0  # bytes of this graph's activation inputs (outputs of earlier graphs), live while it runs
    followed: bool = False  # more graphs of the step run after this one: it leaves room for them (pick_frugal)

    @property
    def shared(self) -> bool:
        """Whether other graphs are known to share the step: earlier ones, or later ones to follow."""
        return bool(self.earlier) or self.followed

    @property
    def graph_budget(self) -> int:
        """Bytes this graph's own plan may peak at (its activation inputs are not in its simulation)."""
        return max(0, self.step_budget - self.held - self.inputs)

    def note(self) -> str:
        step = f"memory_budget {fmt_bytes(self.step_budget)} for the step"
        frugal = (
            "; later graphs of the step follow, so it keeps what leaves room for a graph like it"
            if self.followed
            else ""
        )
        if not self.earlier:
            return f"{step}: the first graph of the step, planned under all of it{frugal}"
        inputs = f", {fmt_bytes(self.inputs)} by this graph's activation inputs" if self.inputs else ""
        return (
            f"{step}: {fmt_bytes(self.held)} held by {self.earlier} earlier graph(s) of this step{inputs}, "
            f"{fmt_bytes(self.graph_budget)} for this graph{frugal}"
        )


@dataclasses.dataclass(frozen=True)
class Slot:
    """A graph's place in its step: its frame's compile and its position among that compile's graphs (DDP's
    buckets are one frame's graphs; a graph break resumes in another frame). `instance`: which run of the frame in
    the step — modules that run the same code with their own parameters (FSDP2's blocks) are compiled once each."""

    frame: int
    compile: int
    position: int
    instance: int = 0


class StepLedger:
    """What each graph of one step keeps for backward, in step order: frames in the order they were first compiled,
    within a frame its instances, within an instance its graphs in compile order. A new compile of a frame whose
    inputs have the shapes of one the step has is another instance (another module running the same code); with
    new shapes it is a recompile, which replaces the frame's graphs in place."""

    def __init__(self) -> None:
        self._held: dict[tuple[int, int], list[int]] = {}  # (frame, instance) -> held bytes of each of its graphs
        self._compile: dict[tuple[int, int], int] = {}  # (frame, instance) -> its compile count
        self._shapes: dict[tuple[int, int], str] = {}  # (frame, instance) -> its first graph's input shapes
        self._lock = threading.Lock()
        self._token = uuid.uuid4().hex  # this ledger's, for compile-cache keys

    def key(self) -> str:
        """This ledger and its state, for compile-cache keys: a graph planned in another step, or before the
        step's other graphs changed, is never reused, since a reused graph is not counted."""
        with self._lock:
            return f"{self._token}:{sorted(self._compile.items())}:{sorted(self._held.items())}"

    def slot(self, frame: Frame, shapes: str = "") -> Slot:
        """The place of the next graph the compile `frame` plans; `shapes`: its inputs' shapes (input_shapes)."""
        frame_id, count = frame
        with self._lock:
            mine = [k for k in self._compile if k[0] == frame_id]
            for key in mine:
                if self._compile[key] == count:  # the same compile's next graph (DDP's next bucket)
                    return Slot(frame_id, count, len(self._held[key]), key[1])
            if shapes and any(self._shapes[k] == shapes for k in mine):
                key = (frame_id, max(k[1] for k in mine) + 1)  # the same code run again by another module
            else:
                key = (frame_id, 0)  # first compile, or a recompile for new shapes: in the frame's place
                for k in mine:
                    if k != key:
                        del self._held[k], self._compile[k], self._shapes[k]
            self._held[key] = []  # an existing key keeps its place in the step
            self._compile[key], self._shapes[key] = count, shapes
            return Slot(frame_id, count, 0, key[1])

    def share(self, slot: Slot, step_budget: int, inputs: int, followed: bool = False) -> Share:
        """The split of `step_budget` for the graph at `slot`; `inputs`: bytes of its activation inputs (counted
        only when graphs come before it: the first graph's inputs are the step's, which exist before it)."""
        with self._lock:
            before: list[int] = []
            for key, held in self._held.items():
                if key == (slot.frame, slot.instance):
                    if self._compile[key] == slot.compile:
                        before += held[: slot.position]
                    break
                before += held
        return Share(step_budget, sum(before), len(before), inputs if before else 0, followed)

    def record(self, slot: Slot, held: int) -> None:
        """Note that the graph at `slot` keeps `held` bytes for backward."""
        with self._lock:
            key = (slot.frame, slot.instance)
            if self._compile.get(key) != slot.compile:
                return  # replaced by a later compile meanwhile
            graphs = self._held[key]
            if slot.position < len(graphs):
                graphs[slot.position] = held
            else:
                graphs.append(held)

    def graphs(self) -> int:
        """How many graphs the step has now."""
        with self._lock:
            return sum(len(held) for held in self._held.values())


def input_shapes(joint: fx.GraphModule) -> str:
    """The shapes and dtypes of the joint graph's tensor inputs: what tells another run of the same code with its
    own parameters from a recompile for new shapes."""
    parts = []
    for node in joint.graph.find_nodes(op="placeholder"):
        val = node.meta.get("val")
        parts.append(f"{val.dtype}{tuple(val.shape)}" if isinstance(val, torch.Tensor) else type(val).__name__)
    return ";".join(parts)


def activation_inputs(
    joint: fx.GraphModule, static_inputs: Sequence[int] | None, only: frozenset[str] | None = None
) -> int:
    """Bytes of the joint graph's tensor inputs that are not parameters or buffers (aot_autograd's static-lifetime
    inputs): in a step's later graph, activations of the graphs before it. With `only`, just the inputs named there
    (those its backward reads, kept until then)."""
    static = frozenset(static_inputs or ())
    primals = [n for n in joint.graph.find_nodes(op="placeholder") if not n.name.startswith("tangents")]
    total = 0
    for i, node in enumerate(primals):
        val = node.meta.get("val")
        if i in static or not isinstance(val, torch.Tensor) or (only is not None and node.name not in only):
            continue
        total += tensor_bytes(val)
    return total


def held_bytes(
    joint: fx.GraphModule, resolved: Resolved, saved_bytes: int, static_inputs: Sequence[int] | None, first: bool
) -> int:
    """What a graph keeps live for its backward while the later graphs of the step run: its saved bytes and, past
    the step's first graph, the activation inputs its backward reads."""
    return saved_bytes + (0 if first else activation_inputs(joint, static_inputs, resolved.inputs))


def plan_in_step(
    step: StepLedger,
    slot: Slot,
    joint: fx.GraphModule,
    num_fwd_outputs: int,
    config: RematConfig,
    hooked: frozenset[str] = frozenset(),
    static_inputs: Sequence[int] | None = None,
    followed: bool = False,
) -> Planned:
    """Plan the joint graph at `slot` of the step under config's byte budget less what the step's earlier graphs
    keep for backward, and note what this graph keeps. `followed`: later graphs of the step run after this one, so
    it leaves room for them (plan/evaluate.pick_frugal). The Plan's `step_share` and notes tell the split."""
    step_budget = config.budget_bytes()
    assert step_budget is not None  # a step's graphs share a byte budget only
    share = step.share(slot, step_budget, activation_inputs(joint, static_inputs), followed)
    alone = dataclasses.replace(config, memory_budget=share.graph_budget)
    try:
        planned = plan_joint(joint, num_fwd_outputs, alone, hooked, static_inputs, frugal=followed)
    except BudgetError as exc:
        if exc.least is None:
            raise
        least = exc.least + share.held + share.inputs
        raise BudgetError(
            f"{exc} for this graph ({share.note()}): that is, memory_budget={least} bytes for the step", least
        ) from exc
    plan = planned.plan
    step.record(slot, held_bytes(joint, planned.resolved, plan.saved_bytes, static_inputs, first=not share.earlier))
    notes = plan.notes + ((share.note(),) if share.shared else ())
    plan = dataclasses.replace(plan, notes=notes, step_share=share)
    return dataclasses.replace(planned, plan=plan)

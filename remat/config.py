"""RematConfig: the one frozen, validated configuration every stage of remat receives.

Parsing lives here too: op names (``resolve_op``) here, byte sizes with units through remat.units (``parse_bytes``,
``parse_bandwidth``), so every stage sees checked values and every user mistake is reported once, at construction,
naming the option and the accepted forms.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import math
import numbers
import re
from collections.abc import Callable, Mapping
from typing import Literal

import torch

from ._torch import OpOverload, OpOverloadPacket
from .units import parse_bandwidth, parse_bytes

from .plan.solvers import DEFAULT as DEFAULT_SOLVER
from .plan.solvers import SOLVERS, Solver

__all__ = ["RematConfig", "parse_bandwidth", "parse_bytes", "resolve_op"]

_BUDGET_FORMS = (
    'None (baseline), an int number of bytes >= 0, a string with a unit such as "512MiB" or "2GB", '
    "or a float fraction in [0, 1]"
)
_OP_HELP = "expected names like 'aten.mm' or 'aten.mm.default', or torch.ops.aten.mm"
_OP_NAME_RE = re.compile(r"[A-Za-z_]\w*")

_INNERS = ("inductor", "aot_eager", "eager")
_RNGS = ("replay", "save")


def resolve_op(entry: str | OpOverload | OpOverloadPacket) -> OpOverload | OpOverloadPacket:
    """Return the torch op ``entry`` names.

    Strings may be ``"aten.mm"`` (the overload packet), ``"aten.mm.default"`` (one overload), with an optional
    ``"torch.ops."`` prefix, or the qualified ``"aten::mm"``; ops pass through unchanged.
    """
    if isinstance(entry, (OpOverload, OpOverloadPacket)):
        return entry
    if not isinstance(entry, str):
        raise TypeError(f"save_ops entry {entry!r} ({type(entry).__name__}): {_OP_HELP}")
    name = entry.strip().replace("::", ".")
    name = name.removeprefix("torch.ops.")
    parts = name.split(".")
    if not 2 <= len(parts) <= 3 or not all(_OP_NAME_RE.fullmatch(p) for p in parts):
        raise ValueError(f"save_ops entry {entry!r} is not an op name; {_OP_HELP}")
    try:
        op = getattr(getattr(torch.ops, parts[0]), parts[1])
        if len(parts) == 3:
            op = getattr(op, parts[2])
    except (AttributeError, RuntimeError):
        op = None
    if not isinstance(op, (OpOverload, OpOverloadPacket)):
        raise ValueError(f"save_ops entry {entry!r} names no registered op; {_OP_HELP}")
    return op


def _check_bool(option: str, value: object) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{option}={value!r}: expected True or False")


def _check_choice(option: str, value: object, choices: tuple[str, ...]) -> None:
    listed = ", ".join(repr(c) for c in choices)
    if not isinstance(value, str):
        raise TypeError(f"{option}={value!r}: expected one of {listed}")
    if value not in choices:
        raise ValueError(f"{option}={value!r}: expected one of {listed}")


def _check_solver(value: object) -> None:
    listed = ", ".join(repr(c) for c in SOLVERS)
    forms = f"expected one of {listed}, or a callable (problem, budget, evaluator) -> Scored (remat/plan/solvers.py)"
    if isinstance(value, str):
        if value not in SOLVERS:
            raise ValueError(f"solver={value!r}: {forms}")
        return
    if not callable(value):
        raise TypeError(f"solver={value!r}: {forms}")
    try:
        inspect.signature(value).bind(None, None, None)
    except TypeError:
        raise TypeError(
            f"solver={value!r}: a callable solver is called as solver(problem, budget, evaluator) and "
            f"returns the Scored plan it picks (remat/plan/solvers.py)"
        ) from None
    except ValueError:
        pass  # no signature to inspect (some builtins): it is checked when called


def _check_budget(value: object) -> None:
    where = f"memory_budget={value!r}"
    if value is None or isinstance(value, str):
        if value is not None:
            parse_bytes(value)
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{where}: expected {_BUDGET_FORMS}")
    if isinstance(value, numbers.Integral):
        if value < 0:
            raise ValueError(f"{where}: a byte budget must be >= 0; expected {_BUDGET_FORMS}")
        return
    if not math.isfinite(value):
        raise ValueError(f"{where}: expected {_BUDGET_FORMS}")
    if not 0.0 <= float(value) <= 1.0:
        raise ValueError(
            f'{where}: a float budget is a fraction in [0, 1]; for bytes pass an int or a string such as "1.5GiB"'
        )


@dataclasses.dataclass(frozen=True, kw_only=True, eq=True)
class RematConfig:
    """How remat plans and compiles a training step. Every field is checked on construction (and by ``replace``).

    Attributes:
        memory_budget: bound on the step's peak activation memory. ``None``: no rematerialization beyond the
            inner compiler's own partition (the baseline: torch's min-cut partition under inductor and aot_eager,
            the default partition under eager). int: bytes, >= 0. str: bytes with a unit, ``"512MiB"``, ``"2GB"``,
            ``"1.5GiB"``, ``"4096"`` (see ``parse_bytes``). float in [0, 1]: fraction between the least peak the
            planner can reach (0.0) and the baseline peak (1.0); note ``1`` is one byte and ``1.0`` the baseline.
            Stored as given; read it through ``budget_kind``, ``budget_bytes`` and ``budget_fraction``.
        save_ops: ops whose outputs are always saved, never recomputed: names (``"aten.mm"``, ``"aten.mm.default"``,
            ``"torch.ops.aten.mm.default"``), ``OpOverload`` or ``OpOverloadPacket``; a list becomes a tuple.
            Empty: no save-list.
        policy: callable deciding per op what the user wants (saved, recomputed, offloaded); None: none.
        solver: a name in ``remat.plan.solvers.SOLVERS``: ``"mincut"`` (max-flow), ``"greedy"`` (cost per byte),
            ``"optimal"`` (MILP), ``"auto"`` (remat picks); or a callable ``(problem, budget, evaluator) -> Scored``
            with the registered solvers' signature (see ``remat/plan/solvers.py``).
        strict: True: an infeasible budget raises; False: the least-peak plan is used with a warning.
        inner: compiler for the rewritten forward/backward: ``"inductor"``, ``"aot_eager"`` or ``"eager"``.
        offload: False: never offload. True: every saved activation of at least 1 KiB is kept in host memory
            between forward and backward (pinned, copied on a side stream on CUDA). ``"auto"``: only those whose
            round trip at ``host_bandwidth`` hides behind the forward compute after them (CUDA only: on CPU the host
            is the device and nothing is offloaded). A policy may also answer ``Action.OFFLOAD`` per value.
        host_bandwidth: bytes per second of host<->device copies, >= 1; int, float (``12e9``) or a unit string
            with an optional ``/s`` (``"12GB/s"``, the PCIe 4 x16 order of magnitude; ``"12 GiB/s"``; ``"12GB"``).
            See ``parse_bandwidth``.
        partition: shard saved activations across ranks: None (no sharding), ``"world"`` (the default process
            group) or a ``torch.distributed.ProcessGroup``.
        contiguous: True: saved activations are copied into one preallocated arena per graph, reused across steps
            (learned on the first step, grown when shapes grow), each as it is computed (its own allocation is freed
            at once); False: each keeps its own allocation. The arena is held for the whole step and does not shrink
            as backward consumes it: the planner counts it so, and ``remat.peak_memory`` measures it.
        rng: random ops in recomputation: ``"replay"`` (backward re-runs them from the generator state saved before
            them: same numbers, a few bytes) or ``"save"`` (their outputs are always saved).
        profile: True: record per step the time and bytes of recomputation, offload/reload, shard, gather and packing,
            read from ``remat.last_plan().profile``; adds a device synchronization around each. False: off.
        synchronize: True: wait for the device before and after every checkpoint op (offload, reload, shard,
            pack), as DeepSpeed's ``synchronize`` does; for debugging and timing. False: off.
        solver_time_limit: seconds the optimal solver may run, finite and > 0.
        debug: True: every stage checks its invariants (slower).
    """

    memory_budget: None | int | str | float = None
    save_ops: tuple[str | OpOverload | OpOverloadPacket, ...] = ()
    policy: Callable | None = None
    solver: str | Solver = DEFAULT_SOLVER
    strict: bool = False
    inner: Literal["inductor", "aot_eager", "eager"] = "inductor"
    offload: bool | Literal["auto"] = False
    host_bandwidth: int | float | str = "12GB/s"
    partition: None | str | object = None
    contiguous: bool = False
    rng: Literal["replay", "save"] = "replay"
    profile: bool = False
    synchronize: bool = False
    solver_time_limit: float = 10.0
    debug: bool = False

    def __post_init__(self) -> None:
        _check_budget(self.memory_budget)
        self._check_save_ops()
        if self.policy is not None and not callable(self.policy):
            raise TypeError(f"policy={self.policy!r}: expected a callable or None")
        _check_solver(self.solver)
        _check_bool("strict", self.strict)
        _check_choice("inner", self.inner, _INNERS)
        if not isinstance(self.offload, bool) and self.offload != "auto":
            kind = ValueError if isinstance(self.offload, str) else TypeError
            raise kind(f'offload={self.offload!r}: expected True, False or "auto"')
        parse_bandwidth(self.host_bandwidth)
        self._check_partition()
        _check_bool("contiguous", self.contiguous)
        _check_choice("rng", self.rng, _RNGS)
        _check_bool("profile", self.profile)
        _check_bool("synchronize", self.synchronize)
        self._check_time_limit()
        _check_bool("debug", self.debug)

    def _check_save_ops(self) -> None:
        ops = self.save_ops
        if isinstance(ops, (str, OpOverload, OpOverloadPacket)):
            raise TypeError(f'save_ops={ops!r}: expected a list of ops, e.g. save_ops=["{ops}"]')
        if not isinstance(ops, (list, tuple)):
            raise TypeError(f'save_ops={ops!r}: expected a list or tuple, e.g. save_ops=["aten.mm"]')
        for entry in ops:
            resolve_op(entry)
        object.__setattr__(self, "save_ops", tuple(ops))

    def _check_partition(self) -> None:
        value = self.partition
        if value is None or (isinstance(value, str) and value == "world"):
            return
        forms = 'None, "world" or a torch.distributed.ProcessGroup'
        if isinstance(value, str):
            raise ValueError(f"partition={value!r}: expected {forms}")
        if torch.distributed.is_available() and isinstance(value, torch.distributed.ProcessGroup):
            return
        raise TypeError(f"partition={value!r}: expected {forms}")

    def _check_time_limit(self) -> None:
        value = self.solver_time_limit
        where = f"solver_time_limit={value!r}"
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(f"{where}: expected seconds as a finite float > 0")
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"{where}: expected seconds as a finite float > 0")
        object.__setattr__(self, "solver_time_limit", float(value))

    def budget_kind(self) -> Literal["none", "bytes", "fraction"]:
        """``"none"`` (baseline), ``"bytes"`` (int or unit string) or ``"fraction"`` (float in [0, 1])."""
        if self.memory_budget is None:
            return "none"
        if isinstance(self.memory_budget, (numbers.Integral, str)):
            return "bytes"
        return "fraction"

    def budget_bytes(self) -> int | None:
        """The budget in bytes, or None when it is unset or a fraction."""
        budget = self.memory_budget
        return parse_bytes(budget) if self.budget_kind() == "bytes" and isinstance(budget, (int, str)) else None

    def budget_fraction(self) -> float | None:
        """The budget as a fraction in [0, 1], or None when it is unset or in bytes."""
        budget = self.memory_budget
        return float(budget) if self.budget_kind() == "fraction" and isinstance(budget, (int, float)) else None

    def host_bandwidth_bytes(self) -> int:
        """Host<->device copy bandwidth in whole bytes per second."""
        return parse_bandwidth(self.host_bandwidth)

    def save_op_targets(self) -> tuple[frozenset[OpOverloadPacket], frozenset[OpOverload]]:
        """``(packets, overloads)``: a node is on the save-list if its overload or the overload's packet is listed."""
        ops = [resolve_op(entry) for entry in self.save_ops]
        packets = frozenset(op for op in ops if isinstance(op, OpOverloadPacket))
        overloads = frozenset(op for op in ops if isinstance(op, OpOverload))
        return packets, overloads

    @classmethod
    def fields(cls) -> tuple[str, ...]:
        """Option names, in declaration order."""
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def from_options(cls, options: Mapping[str, object] | None) -> RematConfig:
        """Build from a ``torch.compile(..., options={...})`` dict; None or empty gives the defaults."""
        if options is None:
            return cls()
        if not isinstance(options, Mapping):
            raise TypeError(f"options={options!r}: expected a dict of remat options or None")
        valid = sorted(cls.fields())
        for key in options:
            if key not in valid:
                close = difflib.get_close_matches(str(key), valid, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ValueError(f"unknown remat option {key!r}{hint}; valid options: {', '.join(valid)}")
        return cls(**dict(options))  # type: ignore[arg-type]  # each field's value is checked in __post_init__

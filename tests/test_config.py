import dataclasses
import math
import re

import pytest
import torch

from remat.config import RematConfig, parse_bandwidth, parse_bytes, resolve_op
from remat.plan.solvers import SOLVERS
from remat.units import MIB as MiB

ALL_FIELDS = (
    "memory_budget",
    "save_ops",
    "policy",
    "solver",
    "strict",
    "inner",
    "offload",
    "host_bandwidth",
    "partition",
    "contiguous",
    "rng",
    "profile",
    "synchronize",
    "solver_time_limit",
    "debug",
)


# ---- memory_budget / parse_bytes -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("512MiB", 512 * MiB),
        ("2GB", 2_000_000_000),
        ("1.5GiB", 1610612736),
        ("100 MB", 100_000_000),
        ("4096B", 4096),
        ("4096", 4096),
        ("0", 0),
        ("1KB", 1000),
        ("1kib", 1024),
        ("3 tib", 3 * 1024**4),
        ("2TB", 2 * 1000**4),
        ("0.1GB", 100_000_000),  # exact: no float rounding to 99999999
        ("1.5KiB", 1536),
        ("1.9B", 1),  # fractions round down to whole bytes
        (".5KiB", 512),
        ("  64 mib  ", 64 * MiB),
    ],
)
def test_parse_bytes_units(text, expected):
    assert parse_bytes(text) == expected
    config = RematConfig(memory_budget=text)
    assert config.memory_budget == text  # stored as given
    assert config.budget_kind() == "bytes"
    assert config.budget_bytes() == expected
    assert config.budget_fraction() is None


@pytest.mark.parametrize("value", [0, 1, 1024, 6 * 1024**3])
def test_int_budget_is_bytes(value):
    config = RematConfig(memory_budget=value)
    assert (config.budget_kind(), config.budget_bytes(), config.budget_fraction()) == ("bytes", value, None)


@pytest.mark.parametrize("value", [0.0, 0.5, 0.3, 1.0])
def test_float_budget_is_fraction(value):
    config = RematConfig(memory_budget=value)
    assert (config.budget_kind(), config.budget_bytes(), config.budget_fraction()) == ("fraction", None, value)


def test_none_budget_is_baseline():
    config = RematConfig()
    assert config.memory_budget is None
    assert (config.budget_kind(), config.budget_bytes(), config.budget_fraction()) == ("none", None, None)


def test_one_is_a_byte_and_one_point_zero_the_baseline():
    assert RematConfig(memory_budget=1).budget_bytes() == 1
    assert RematConfig(memory_budget=1.0).budget_fraction() == 1.0


@pytest.mark.parametrize(
    ("value", "error", "match"),
    [
        (True, TypeError, r"memory_budget=True: expected None \(baseline\), an int number of bytes"),
        (False, TypeError, r"memory_budget=False: expected None"),
        (-1, ValueError, r"memory_budget=-1: a byte budget must be >= 0"),
        (-0.5, ValueError, r"memory_budget=-0\.5: a float budget is a fraction in \[0, 1\]"),
        (float("nan"), ValueError, r"memory_budget=nan: expected None .* or a float fraction in \[0, 1\]"),
        (float("inf"), ValueError, r"memory_budget=inf: expected None"),
        (
            1.5,
            ValueError,
            r"memory_budget=1\.5: a float budget is a fraction in \[0, 1\]; "
            r'for bytes pass an int or a string such as "1\.5GiB"$',
        ),
        ("12 parsecs", ValueError, r"memory_budget='12 parsecs': unknown unit 'parsecs'; accepted units are B, KB"),
        ("", ValueError, r"memory_budget='': not a byte size; accepted units are .*KiB, MiB, GiB, TiB"),
        ("GiB", ValueError, r"memory_budget='GiB': not a byte size; accepted units"),
        ("-1GiB", ValueError, r"memory_budget='-1GiB': a byte count must be >= 0"),
        ("1.5", ValueError, r"memory_budget='1\.5': a fractional size needs a unit, e\.g\. \"1\.5GiB\""),
        ("1e9", ValueError, r"memory_budget='1e9': not a byte size"),
        ("2 G", ValueError, r"memory_budget='2 G': unknown unit 'G'"),
        ([1], TypeError, r"memory_budget=\[1\]: expected None \(baseline\)"),
        (b"1GiB", TypeError, r"memory_budget=b'1GiB': expected None"),
    ],
)
def test_rejected_budgets(value, error, match):
    with pytest.raises(error, match=match):
        RematConfig(memory_budget=value)


@pytest.mark.parametrize(("value", "error"), [(1.5, TypeError), (True, TypeError), (-3, ValueError), (None, TypeError)])
def test_parse_bytes_names_the_option(value, error):
    with pytest.raises(error, match=rf"^host_bandwidth={value!r}: "):
        parse_bytes(value, option="host_bandwidth")


# ---- save_ops ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        ("aten.mm", torch.ops.aten.mm),
        ("aten.mm.default", torch.ops.aten.mm.default),
        ("torch.ops.aten.mm.default", torch.ops.aten.mm.default),
        ("torch.ops.aten.mm", torch.ops.aten.mm),
        ("aten::mm", torch.ops.aten.mm),
        ("aten::mm.default", torch.ops.aten.mm.default),
        (torch.ops.aten.mm, torch.ops.aten.mm),
        (torch.ops.aten.mm.default, torch.ops.aten.mm.default),
        ("aten._scaled_dot_product_flash_attention", torch.ops.aten._scaled_dot_product_flash_attention),
    ],
)
def test_resolve_op(entry, expected):
    assert resolve_op(entry) is expected


def test_save_ops_list_becomes_tuple_and_targets_split():
    config = RematConfig(save_ops=["aten.mm", torch.ops.aten.addmm.default, "aten.bmm.default", torch.ops.aten.mm])
    assert config.save_ops == ("aten.mm", torch.ops.aten.addmm.default, "aten.bmm.default", torch.ops.aten.mm)
    packets, overloads = config.save_op_targets()
    assert packets == frozenset({torch.ops.aten.mm})
    assert overloads == frozenset({torch.ops.aten.addmm.default, torch.ops.aten.bmm.default})
    assert RematConfig().save_op_targets() == (frozenset(), frozenset())


@pytest.mark.parametrize(
    ("save_ops", "error", "match"),
    [
        (["aten.nosuchop"], ValueError, r"'aten\.nosuchop' names no registered op; expected names like 'aten\.mm'"),
        (["aten.mm.nosuch"], ValueError, r"'aten\.mm\.nosuch' names no registered op"),
        (["nosuchns.mm"], ValueError, r"'nosuchns\.mm' names no registered op"),
        (
            ["mm"],
            ValueError,
            r"'mm' is not an op name; expected names like 'aten\.mm' or 'aten\.mm\.default', or "
            r"torch\.ops\.aten\.mm",
        ),
        (["aten.mm.default.x"], ValueError, r"is not an op name"),
        (["aten.__class__"], ValueError, r"'aten\.__class__' names no registered op"),
        ([""], ValueError, r"'' is not an op name"),
        ([torch.mm], TypeError, r"save_ops entry <built-in method mm .*\(builtin_function_or_method\): expected names"),
        ([3], TypeError, r"save_ops entry 3 \(int\)"),
        ("aten.mm", TypeError, r"""save_ops='aten\.mm': expected a list of ops, e\.g\. save_ops=\["aten\.mm"\]"""),
        (torch.ops.aten.mm, TypeError, r"""expected a list of ops, e\.g\. save_ops=\["aten\.mm"\]"""),
        ({"aten.mm"}, TypeError, r"save_ops=\{'aten\.mm'\}: expected a list or tuple"),
        (None, TypeError, r"save_ops=None: expected a list or tuple"),
    ],
)
def test_rejected_save_ops(save_ops, error, match):
    with pytest.raises(error, match=match):
        RematConfig(save_ops=save_ops)


# ---- the other fields -------------------------------------------------------------------------------------------

ENUMS = {
    "inner": ("inductor", "aot_eager", "eager"),
    "rng": ("replay", "save"),
}


@pytest.mark.parametrize(("field", "value"), [(f, v) for f, values in ENUMS.items() for v in values])
def test_enum_accepts(field, value):
    assert getattr(RematConfig(**{field: value}), field) == value


@pytest.mark.parametrize("field", ENUMS)
def test_enum_rejects(field):
    listed = ", ".join(repr(v) for v in ENUMS[field])
    with pytest.raises(ValueError, match=rf"^{field}='bogus': expected one of {listed}$"):
        RematConfig(**{field: "bogus"})
    with pytest.raises(ValueError, match=rf"^{field}='{ENUMS[field][0].upper()}'"):  # case-sensitive
        RematConfig(**{field: ENUMS[field][0].upper()})
    with pytest.raises(TypeError, match=rf"^{field}=1: expected one of {listed}$"):
        RematConfig(**{field: 1})


def test_solver_names_come_from_the_registry():
    assert tuple(SOLVERS) == ("auto", "mincut", "greedy", "optimal") and RematConfig().solver == "auto"
    for name in SOLVERS:
        assert RematConfig(solver=name).solver == name


def test_solver_accepts_a_callable():
    def mine(problem, budget, evaluator):
        return SOLVERS["greedy"](problem, budget, evaluator)

    assert RematConfig(solver=mine).solver is mine


@pytest.mark.parametrize(
    ("value", "error"),
    [("bogus", ValueError), ("AUTO", ValueError), (1, TypeError), (None, TypeError), (["greedy"], TypeError)],
)
def test_solver_rejects(value, error):
    listed = ", ".join(repr(v) for v in SOLVERS)
    fix = rf"expected one of {listed}, or a callable \(problem, budget, evaluator\) -> Scored"
    with pytest.raises(error, match=rf"^solver={re.escape(repr(value))}: {fix}"):
        RematConfig(solver=value)


def test_solver_callable_of_another_signature_is_refused():
    with pytest.raises(
        TypeError,
        match=r"^solver=<function .*: a callable solver is called as "
        r"solver\(problem, budget, evaluator\)",
    ):
        RematConfig(solver=lambda problem: None)


@pytest.mark.parametrize("field", ["strict", "contiguous", "profile", "synchronize", "debug"])
def test_bool_fields(field):
    assert getattr(RematConfig(), field) is False
    assert getattr(RematConfig(**{field: True}), field) is True
    for bad in (1, 0, "True", None):
        with pytest.raises(TypeError, match=rf"^{field}={bad!r}: expected True or False$"):
            RematConfig(**{field: bad})


def test_offload():
    for value in (False, True, "auto"):
        assert RematConfig(offload=value).offload == value
    with pytest.raises(ValueError, match=r'^offload=\'always\': expected True, False or "auto"$'):
        RematConfig(offload="always")
    with pytest.raises(TypeError, match=r"^offload=1: "):
        RematConfig(offload=1)


def test_policy():
    def policy(ctx, op, *args, **kwargs):
        return None

    assert RematConfig(policy=policy).policy is policy
    with pytest.raises(TypeError, match=r"^policy='save_mm': expected a callable or None$"):
        RematConfig(policy="save_mm")


def test_host_bandwidth():
    assert RematConfig().host_bandwidth_bytes() == 12_000_000_000
    assert RematConfig(host_bandwidth="25GB").host_bandwidth_bytes() == 25_000_000_000
    assert RematConfig(host_bandwidth=1024).host_bandwidth_bytes() == 1024
    with pytest.raises(ValueError, match=r"^host_bandwidth=0: bytes per second must be > 0"):
        RematConfig(host_bandwidth=0)
    with pytest.raises(ValueError, match=r"^host_bandwidth='0GB': bytes per second must be > 0"):
        RematConfig(host_bandwidth="0GB")
    with pytest.raises(ValueError, match=r"^host_bandwidth='fast': not a byte size"):
        RematConfig(host_bandwidth="fast")
    with pytest.raises(
        ValueError,
        match=r"^host_bandwidth=0\.25: less than one byte per second; expected bytes "
        r"per second > 0: an int or float \(12e9\)",
    ):
        RematConfig(host_bandwidth=0.25)
    with pytest.raises(TypeError, match=r"^host_bandwidth=True: expected bytes per second > 0"):
        RematConfig(host_bandwidth=True)


@pytest.mark.parametrize(
    ("value", "rate"),
    [
        (12e9, 12_000_000_000),
        (12.5e9, 12_500_000_000),
        (1536.75, 1536),
        ("12GB/s", 12_000_000_000),
        ("12 GiB/s", 12 * 1024**3),
        ("12 gib / S", 12 * 1024**3),
        ("1.5GB/s", 1_500_000_000),
        ("12GB", 12_000_000_000),
        ("4096", 4096),
        ("4096/s", 4096),
        ("12e9", 12_000_000_000),
        (25_000_000_000, 25_000_000_000),
    ],
)
def test_host_bandwidth_floats_and_rates(value, rate):
    """A bandwidth is naturally a float (12e9) or a rate ("12GB/s"); both give whole bytes per second."""
    config = RematConfig(host_bandwidth=value)
    assert config.host_bandwidth_bytes() == rate and type(config.host_bandwidth_bytes()) is int
    assert parse_bandwidth(value) == rate


@pytest.mark.parametrize(
    ("value", "error", "match"),
    [
        (float("inf"), ValueError, r"^host_bandwidth=inf: expected bytes per second > 0"),
        (-1.0, ValueError, r'^host_bandwidth=-1\.0: bytes per second must be > 0, e\.g\. "12GB/s" or 12e9$'),
        ("0GB/s", ValueError, r"^host_bandwidth='0GB/s': bytes per second must be > 0"),
        (
            "12 parsecs/s",
            ValueError,
            r"^host_bandwidth='12 parsecs/s': unknown unit 'parsecs'; accepted units .*"
            r'a bandwidth may end in "/s", e\.g\. "12GB/s"$',
        ),
        (None, TypeError, r"^host_bandwidth=None: expected bytes per second > 0"),
    ],
)
def test_host_bandwidth_rejected(value, error, match):
    with pytest.raises(error, match=match):
        RematConfig(host_bandwidth=value)


def test_partition():
    assert RematConfig(partition=None).partition is None
    assert RematConfig(partition="world").partition == "world"
    with pytest.raises(ValueError, match=r"""^partition='node': expected None, "world" or a torch\.distributed"""):
        RematConfig(partition="node")
    with pytest.raises(TypeError, match=r"^partition=2: expected None"):
        RematConfig(partition=2)


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed not built")
def test_partition_process_group():
    # A bare single-rank group: no init_process_group, so no global state is touched.
    group = torch.distributed.ProcessGroup(torch.distributed.HashStore(), 0, 1)
    assert RematConfig(partition=group).partition is group


def test_solver_time_limit():
    assert RematConfig().solver_time_limit == 10.0
    config = RematConfig(solver_time_limit=3)
    assert config.solver_time_limit == 3.0 and isinstance(config.solver_time_limit, float)
    for bad in (0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match=rf"^solver_time_limit={bad!r}: expected seconds as a finite float > 0"):
            RematConfig(solver_time_limit=bad)
    for bad in (True, "10", None):
        with pytest.raises(TypeError, match=rf"^solver_time_limit={bad!r}: "):
            RematConfig(solver_time_limit=bad)


# ---- dataclass behaviour ----------------------------------------------------------------------------------------


def test_defaults_and_fields():
    assert RematConfig.fields() == ALL_FIELDS
    config = RematConfig()
    assert (config.solver, config.inner, config.offload, config.rng, config.save_ops) == (
        "auto",
        "inductor",
        False,
        "replay",
        (),
    )


def test_frozen():
    config = RematConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.memory_budget = "1GiB"


def test_kw_only():
    with pytest.raises(TypeError):
        RematConfig("1GiB")


def test_replace_revalidates():
    config = RematConfig(memory_budget="1GiB", save_ops=["aten.mm"])
    smaller = dataclasses.replace(config, memory_budget="512MiB")
    assert smaller.budget_bytes() == 512 * MiB and smaller.save_ops == ("aten.mm",)
    with pytest.raises(ValueError, match=r"^memory_budget=1\.5: a float budget is a fraction"):
        dataclasses.replace(config, memory_budget=1.5)
    with pytest.raises(ValueError, match=r"^solver='fast'"):
        dataclasses.replace(config, solver="fast")


def test_equality_and_hash():
    def policy(*args):
        return None

    a = RematConfig(memory_budget="2GB", save_ops=["aten.mm"], policy=policy)
    b = RematConfig(memory_budget="2GB", save_ops=("aten.mm",), policy=policy)
    assert a == b and hash(a) == hash(b)
    assert a != RematConfig(memory_budget="2GB")
    assert len({a, b, RematConfig()}) == 2


# ---- from_options -----------------------------------------------------------------------------------------------


def test_from_options():
    assert RematConfig.from_options(None) == RematConfig()
    assert RematConfig.from_options({}) == RematConfig()
    config = RematConfig.from_options({"memory_budget": "6GiB", "solver": "greedy", "save_ops": ["aten.mm"]})
    assert config == RematConfig(memory_budget="6GiB", solver="greedy", save_ops=("aten.mm",))
    assert config.budget_bytes() == 6 * 1024**3


def test_from_options_unknown_key_suggests_and_lists():
    valid = ", ".join(sorted(ALL_FIELDS))
    with pytest.raises(ValueError) as info:
        RematConfig.from_options({"memory_bugdet": "1GiB"})
    assert str(info.value) == (
        f"unknown remat option 'memory_bugdet' (did you mean 'memory_budget'?); valid options: {valid}"
    )
    with pytest.raises(ValueError, match=rf"^unknown remat option 'zzz'; valid options: {valid}$"):
        RematConfig.from_options({"zzz": 1})


def test_from_options_validates_values_and_type():
    with pytest.raises(ValueError, match=r"^memory_budget=1\.5: "):
        RematConfig.from_options({"memory_budget": 1.5})
    with pytest.raises(TypeError, match=r"^options=\[\('solver', 'greedy'\)\]: expected a dict"):
        RematConfig.from_options([("solver", "greedy")])


def test_float_host_bandwidth_reaches_the_plan():
    """A float bandwidth plans exactly as the same rate given as a string: each offloaded 1 MiB value's 2 MiB of
    copies take 2 * 1048576 / 12e9 s = 0.17 ms."""
    import remat

    w = torch.randn(512, 512, requires_grad=True)

    def step(x):
        return torch.cos(torch.cos(x @ w) @ w).sum()

    x = torch.randn(512, 512)
    plans = [remat.explain(step, x, inner="aot_eager", offload=True, host_bandwidth=rate) for rate in (12e9, "12GB/s")]
    reasons = [[d.reason for d in p.decisions if "offloaded to host" in d.reason] for p in plans]
    assert reasons[0] == reasons[1] and len(reasons[0]) >= 2
    assert all("0.17 ms at host_bandwidth" in r for r in reasons[0])

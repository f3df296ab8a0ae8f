"""Bad input, through every way a user reaches remat: each mistake is a TypeError/ValueError (RuntimeError for an
unavailable runtime) raised from remat's own code, naming the option, the value and the fix; a failure inside
planning leaves torch's global configs as they were."""

from __future__ import annotations

import re
import warnings

import pytest
import torch

import remat
from remat.config import RematConfig

W = torch.randn(64, 64, generator=torch.Generator().manual_seed(0)).requires_grad_()


def f(x):
    return torch.cos(torch.cos(x @ W) @ W).sum()


def x():
    return torch.randn(64, 64, generator=torch.Generator().manual_seed(1))


# (field, bad value, error type, the value as the message shows it, what the message says to do)
CASES = [
    ("memory_budget", True, TypeError, "True", "expected None \\(baseline\\), an int number of bytes"),
    ("memory_budget", 1.5, ValueError, "1.5", 'for bytes pass an int or a string such as "1.5GiB"'),
    ("memory_budget", -1, ValueError, "-1", "must be >= 0"),
    ("memory_budget", "12 parsecs", ValueError, "'12 parsecs'", "accepted units are B, KB"),
    ("memory_budget", "1.5", ValueError, "'1.5'", 'needs a unit, e.g. "1.5GiB"'),
    ("save_ops", ["aten.nosuchop"], ValueError, "'aten.nosuchop'", "expected names like 'aten.mm'"),
    ("save_ops", ["mm"], ValueError, "'mm'", "expected names like 'aten.mm'"),
    ("save_ops", [3], TypeError, "3", "expected names like 'aten.mm'"),
    ("save_ops", "aten.mm", TypeError, "'aten.mm'", 'expected a list of ops, e.g. save_ops=\\["aten.mm"\\]'),
    ("policy", "save_mm", TypeError, "'save_mm'", "expected a callable or None"),
    ("solver", "fast", ValueError, "'fast'", "expected one of 'auto', 'mincut', 'greedy', 'optimal'"),
    ("solver", 1, TypeError, "1", "expected one of 'auto'"),
    ("strict", "yes", TypeError, "'yes'", "expected True or False"),
    ("inner", "tvm", ValueError, "'tvm'", "expected one of 'inductor', 'aot_eager', 'eager'"),
    ("offload", "always", ValueError, "'always'", 'expected True, False or "auto"'),
    ("offload", 1, TypeError, "1", 'expected True, False or "auto"'),
    ("host_bandwidth", 0, ValueError, "0", 'bytes per second must be > 0, e.g. "12GB/s" or 12e9'),
    ("host_bandwidth", "12 GHz", ValueError, "'12 GHz'", "unknown unit 'GHz'; accepted units"),
    (
        "host_bandwidth",
        float("nan"),
        ValueError,
        "nan",
        'expected bytes per second > 0: an int or float \\(12e9\\) or a string such as "12GB/s"',
    ),
    ("host_bandwidth", "12GB/h", ValueError, "'12GB/h'", 'not a byte size; .*a bandwidth may end in "/s"'),
    ("host_bandwidth", [12e9], TypeError, "[12000000000.0]", "expected bytes per second > 0: an int or float"),
    ("partition", "node", ValueError, "'node'", 'expected None, "world" or a torch.distributed.ProcessGroup'),
    ("partition", 2, TypeError, "2", 'expected None, "world"'),
    ("contiguous", 1, TypeError, "1", "expected True or False"),
    ("rng", "fresh", ValueError, "'fresh'", "expected one of 'replay', 'save'"),
    ("solver_time_limit", 0, ValueError, "0", "expected seconds as a finite float > 0"),
    ("solver_time_limit", float("inf"), ValueError, "inf", "expected seconds as a finite float > 0"),
    ("solver_time_limit", "10", TypeError, "'10'", "expected seconds"),
    ("profile", "yes", TypeError, "'yes'", "expected True or False"),
    ("synchronize", 0, TypeError, "0", "expected True or False"),
    ("debug", "on", TypeError, "'on'", "expected True or False"),
]


def raised(entry: str, options: dict) -> BaseException:
    """What a user sees, through `entry`; for torch.compile the exception remat raised inside the backend (dynamo
    wraps it in BackendCompilerFailed, whose message repeats it)."""
    with pytest.raises(Exception) as info:
        if entry == "RematConfig":
            RematConfig(**options)
        elif entry == "remat.compile":
            remat.compile(f, **options)
        elif entry == "remat.explain":
            remat.explain(f, x(), **options)
        else:
            torch.compile(f, backend="remat", options=options)(x())
    exc = info.value
    if entry == "torch.compile":
        assert isinstance(exc, torch._dynamo.exc.BackendCompilerFailed)
        inner = exc.inner_exception
        assert str(inner) in str(exc)
        exc = inner
    return exc


def raised_in_remat(exc: BaseException) -> bool:
    tb = exc.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    return "/remat/" in tb.tb_frame.f_code.co_filename.replace("\\", "/")


def test_every_field_has_a_bad_value():
    assert {c[0] for c in CASES} == set(RematConfig.fields())


ENTRIES = ["RematConfig", "remat.compile", "remat.explain", "torch.compile"]


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("field,value,error,shown,fix", CASES, ids=[f"{c[0]}={c[1]!r}" for c in CASES])
def test_bad_value(entry, field, value, error, shown, fix):
    exc = raised(entry, {field: value})
    assert type(exc) is error, (type(exc), exc)
    message = str(exc)
    assert field in message and shown in message, message
    assert re.search(fix, message), message
    assert raised_in_remat(exc)


@pytest.mark.parametrize("entry", ["remat.compile", "remat.explain", "torch.compile"])
def test_unknown_option_names_the_closest_and_lists_the_valid(entry):
    exc = raised(entry, {"memory_bugdet": "1GiB"})
    assert type(exc) is ValueError
    assert str(exc).startswith("unknown remat option 'memory_bugdet' (did you mean 'memory_budget'?); valid options:")
    assert all(name in str(exc) for name in RematConfig.fields())


@pytest.mark.parametrize("entry", ["remat.compile", "remat.explain", "torch.compile"])
@pytest.mark.parametrize("option,value", [("partition", "world")])
def test_unavailable_runtime_options_are_refused_by_name(entry, option, value):
    """partition="world" without an initialized process group fails clearly, naming the option and the fix."""
    assert not (torch.distributed.is_available() and torch.distributed.is_initialized())
    exc = raised(entry, {option: value, "inner": "aot_eager"})
    assert isinstance(exc, RuntimeError), exc
    assert option in str(exc) and "init_process_group" in str(exc) and raised_in_remat(exc)


def test_remat_backend_rejects_mode_and_non_dict_options():
    exc = raised_through_dynamo(lambda: torch.compile(f, backend="remat", mode="max-autotune")(x()))
    assert type(exc) is ValueError and "mode='max-autotune': the remat backend takes no mode" in str(exc)
    exc = raised_through_dynamo(
        lambda: remat.remat_backend(torch.fx.symbolic_trace(f), [x()], options=[("solver", "greedy")])
    )
    assert type(exc) is TypeError and str(exc).startswith("options=[('solver', 'greedy')]: expected a dict")


def raised_through_dynamo(call) -> BaseException:
    with pytest.raises(Exception) as info:
        call()
    return getattr(info.value, "inner_exception", None) or info.value


def not_an_action(info):
    return "save" if info.op == "aten.mm.default" else None


@pytest.mark.parametrize("entry", ["remat.explain", "torch.compile"])
def test_policy_returning_a_non_action(entry):
    exc = raised(entry, {"policy": not_an_action, "inner": "aot_eager"})
    assert type(exc) is TypeError and raised_in_remat(exc)
    assert str(exc).startswith(
        "policy returned 'save' for node mm (aten.mm.default); a policy must return "
        "remat.Action.SAVE, RECOMPUTE, PREFER_SAVE, PREFER_RECOMPUTE, OFFLOAD or None"
    )


def torch_configs() -> tuple:
    return (
        torch._functorch.config.save_config(),
        torch._inductor.config.save_config(),
        torch._dynamo.config.save_config(),
    )


@pytest.mark.parametrize("inner", ["aot_eager", "eager"])
def test_strict_impossible_budget_raises_budget_error_and_leaves_configs(inner):
    before = torch_configs()
    exc = raised("torch.compile", {"memory_budget": 1, "strict": True, "inner": inner})
    assert isinstance(exc, remat.BudgetError) and isinstance(exc, ValueError) and raised_in_remat(exc)
    assert str(exc).startswith("memory_budget: 1 B cannot be met for this graph; the least peak")
    assert "strict=True: raise the budget to at least" in str(exc)
    assert torch_configs() == before
    with pytest.raises(remat.BudgetError, match="raise the budget to at least"):
        remat.explain(f, x(), memory_budget=1, strict=True)
    assert torch_configs() == before


def test_failure_inside_planning_leaves_configs():
    before = torch_configs()
    raised("torch.compile", {"policy": not_an_action, "inner": "aot_eager"})
    assert torch_configs() == before


@pytest.mark.inductor
@pytest.mark.parametrize(
    "options", [{"memory_budget": 1, "strict": True}, {"policy": not_an_action}], ids=["strict", "policy"]
)
def test_failure_inside_the_inductor_partitioner_leaves_configs(options):
    before = torch_configs()
    exc = raised("torch.compile", {**options, "inner": "inductor"})
    assert isinstance(exc, (remat.BudgetError, TypeError)) and raised_in_remat(exc)
    assert torch_configs() == before
    assert torch._inductor.config.custom_partitioner_fn is None


def test_infeasible_budget_without_strict_warns_with_the_least_peak():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plan = remat.explain(f, x(), memory_budget=1)
    (warning,) = [w for w in caught if "cannot be met" in str(w.message)]
    assert "the least peak solver='auto' can reach is" in str(warning.message)
    assert f"({plan.least_peak_bytes} bytes)" in str(warning.message)
    assert plan.peak_bytes == plan.least_peak_bytes and not plan.feasible

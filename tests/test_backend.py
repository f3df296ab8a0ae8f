"""The backend as users reach it: entry point, options, remat.compile, inner compilers, errors."""

import importlib.metadata
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest
import torch
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

import remat
from remat import _torch
from remat.backend import compile_graph

from graphs import MIB, CosMM, cosmm_input

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

ENTRY_POINT_SCRIPT = textwrap.dedent("""
    import sys, torch
    assert "remat" not in sys.modules
    weights = [torch.randn(256, 256, requires_grad=True) for _ in range(4)]
    def f(x):
        for w in weights:
            x = torch.cos(x @ w)
        return x.sum()
    compiled = torch.compile(f, backend="remat", options={"memory_budget": "1.5MiB", "inner": "aot_eager"})
    compiled(torch.randn(256, 256)).backward()
    import remat
    plan = remat.last_plan()
    assert plan.budget_bytes == 1536 * 1024, plan.budget_bytes
    assert plan.peak_bytes <= 1536 * 1024 < plan.baseline.peak_bytes, (plan.peak_bytes, plan.baseline.peak_bytes)
    print("OK", plan.peak_bytes)
""")


def link_dependencies(py: str) -> None:
    """Make remat's dependencies, as this interpreter has them installed, installed in the venv of `py` too: linked
    (each distribution's top-level files and dist-info) rather than unpacked from wheels again, torch's alone takes
    ~15 s. pip then finds every requirement met and installs remat alone."""
    venv_site = pathlib.Path(
        subprocess.run(
            [py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    todo, seen = list(importlib.metadata.requires("remat") or ()), set()
    while todo:
        requirement = Requirement(todo.pop())
        name = canonicalize_name(requirement.name)
        if name in seen or (requirement.marker is not None and not requirement.marker.evaluate({"extra": ""})):
            continue
        seen.add(name)
        dist = importlib.metadata.distribution(name)
        tops = {f.parts[0] for f in dist.files or () if f.parts[0] not in ("..", "__pycache__")}
        if any((venv_site / top).exists() for top in tops):
            continue  # the venv has its own (pip, setuptools)
        for top in tops:
            (venv_site / top).symlink_to(pathlib.Path(dist.locate_file(top)))
        todo += dist.requires or ()


@pytest.mark.slow
def test_entry_point_in_a_fresh_venv(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = str(venv / "bin" / "python")
    link_dependencies(py)  # the venv holds no remat: the entry point comes from pip installing the repository
    pip = [py, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run(pip + [REPO], check=True, cwd=tmp_path)
    out = subprocess.run([py, "-c", ENTRY_POINT_SCRIPT], check=True, capture_output=True, text=True, cwd=tmp_path)
    assert out.stdout.startswith("OK")


def test_options_reach_the_planner():
    model, x = CosMM(), cosmm_input()
    compiled = torch.compile(
        model,
        backend="remat",
        options={"memory_budget": 7 * MIB + 16, "save_ops": ["aten.mm"], "solver": "greedy", "inner": "aot_eager"},
    )
    compiled(x).backward()
    plan = remat.last_plan()
    assert plan.budget_bytes == 7 * MIB + 16 and plan.solver == "greedy"
    assert all(d.action is remat.Action.SAVE for d in plan.decisions if d.op == "aten.mm.default")


def test_unknown_option_is_a_clear_error():
    compiled = torch.compile(CosMM(), backend="remat", options={"memory_bugdet": "1GiB"})
    with pytest.raises(Exception, match="did you mean 'memory_budget'"):
        compiled(cosmm_input())


def test_remat_compile_checks_fields_up_front():
    with pytest.raises(ValueError, match="memory_budget=1.5"):
        remat.compile(CosMM(), memory_budget=1.5)
    with pytest.raises(TypeError):
        remat.compile(CosMM(), memory_budget=True)


@pytest.mark.parametrize("inner", ["aot_eager", "eager"])
def test_remat_compile_inner_compilers_match_eager(inner):
    model, x = CosMM(), cosmm_input()
    model(x).backward()
    expected = [w.grad.clone() for w in model.parameters()]
    model.zero_grad(set_to_none=True)
    remat.compile(model, memory_budget=0.0, inner=inner)(x).backward()
    assert all(torch.equal(w.grad, e) for w, e in zip(model.parameters(), expected))
    assert remat.last_plan().recompute_flops > 0


def test_last_plan_before_any_compile(monkeypatch):
    monkeypatch.setattr("remat.backend._plans", [])
    with pytest.raises(RuntimeError, match="nothing has been compiled"):
        remat.last_plan()


def test_no_global_torch_config_left_changed():
    before = (torch._inductor.config.custom_partitioner_fn, torch._functorch.config.activation_memory_budget)
    options = {"memory_budget": 0.0, "inner": "aot_eager"}
    torch.compile(CosMM(), backend="remat", options=options)(cosmm_input()).backward()
    after = (torch._inductor.config.custom_partitioner_fn, torch._functorch.config.activation_memory_budget)
    assert before == after


def test_private_api_guard_names_the_missing_piece(monkeypatch):
    import torch._functorch.partitioners as partitioners

    monkeypatch.delattr(partitioners, "_extract_fwd_bwd_modules")
    with pytest.raises(_torch.TorchAPIError, match="_extract_fwd_bwd_modules.*torch 2.11 to 2.14"):
        _torch.extract_fwd_bwd_modules()


def test_missing_inductor_hook_is_detected(monkeypatch):
    import torch._inductor.custom_graph_pass as cgp

    monkeypatch.delattr(cgp, "CustomPartitionerFn")
    assert _torch.custom_partitioner_base() is None


def test_boxed_fallback_frees_inputs():
    gm = torch.fx.symbolic_trace(lambda a, b: a + b)
    run = _torch.boxed_interpreter(gm, None)
    args = [torch.ones(2), torch.ones(2)]
    assert torch.equal(run(args), torch.full((2,), 2.0)) and args == []


@pytest.mark.inductor
def test_inductor_without_the_partitioner_hook_uses_the_fallback():
    model, x = CosMM(), cosmm_input()
    model(x).backward()
    expected = [w.grad.clone() for w in model.parameters()]
    model.zero_grad(set_to_none=True)
    config = remat.RematConfig(memory_budget=0.0)
    compiled = torch.compile(model, backend=lambda gm, ex: compile_graph(gm, ex, config, force_fallback=True))
    compiled(x).backward()
    assert remat.last_plan().recompute_flops > 0
    for w, e in zip(model.parameters(), expected):
        torch.testing.assert_close(w.grad, e, rtol=1e-4, atol=1e-5)  # inductor fuses cos/sin its own way


@pytest.mark.inductor
def test_a_second_compile_plans_again_and_takes_inductors_cached_modules():
    """aot_autograd's cache would skip remat's partitioner (no plan made or recorded): it stays off for remat's
    compile, while inductor's graph cache serves the planned forward and backward modules the second time."""
    from torch._dynamo.utils import counters
    from torch._inductor.utils import fresh_cache

    model, x = CosMM(), cosmm_input()
    plans = []
    counters.clear()
    caches = {"fx_graph_cache": True}
    with fresh_cache(), torch._inductor.config.patch(caches), torch._functorch.config.patch(enable_autograd_cache=True):
        for _ in range(2):
            torch._dynamo.reset()
            torch.compile(model, backend="remat", options={"memory_budget": 0.0})(x).backward()
            plans.append(remat.last_plan())
    torch._dynamo.reset()
    assert plans[0] is not plans[1] and plans[0].recompute_flops == plans[1].recompute_flops > 0
    assert counters["inductor"]["fxgraph_cache_miss"] == 2 and counters["inductor"]["fxgraph_cache_hit"] == 2
    assert counters["aot_autograd"]["autograd_cache_hit"] == 0


def test_the_inductor_hook_keys_inductors_cache_by_remats_code_and_a_copy_cannot_partition():
    """inductor caches compiled modules on disk under the hook's uuid: it names remat's source digest, so a module
    another remat version compiled is not served. A copy of the hook (inductor copies its config to key its caches)
    keeps the uuid and refuses to partition."""
    import copy

    from remat.backend import InductorPartitioner
    from remat.code_version import code_version

    hook = InductorPartitioner(remat.RematConfig(memory_budget=0.5))
    assert f"remat {code_version()}:" in hook.uuid() and len(code_version()) == 16
    duplicate = copy.deepcopy(hook)
    assert duplicate.uuid() == hook.uuid()
    with pytest.raises(RuntimeError, match="copied out of inductor's config"):
        duplicate(None, [])

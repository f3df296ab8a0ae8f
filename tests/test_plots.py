"""Figures (timeline, Pareto) checked on their Line2D data, and the budget sweep's rows checked against the planner."""

import dataclasses
import inspect
import io
import os
import subprocess
import sys
import warnings

import matplotlib

matplotlib.use("Agg")  # the tests' choice; remat itself never selects a backend

import matplotlib.pyplot as plt  # noqa: E402  (only to check that no pyplot figure is ever opened)
import pytest  # noqa: E402
import torch  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from remat.config import RematConfig  # noqa: E402
from remat.explain import capture_joints  # noqa: E402
from remat.pareto import ParetoResult, TorchPoint, pareto, torch_budget_points  # noqa: E402
from remat.pipeline import plan_joint  # noqa: E402
from remat.plan.plan import Baseline, Plan  # noqa: E402
from remat.plan.evaluate import Evaluator  # noqa: E402
from remat.plan.simulate import Timeline, simulate  # noqa: E402
from remat.plots import TORCH_LABEL, plot_pareto, plot_timeline  # noqa: E402
from remat.zoo import GPT, GPTConfig, gpt_loss, make_gpt_batch  # noqa: E402

from graphs import MIB, CosMM, cosmm_input  # noqa: E402

GPT_CONFIG = GPTConfig(vocab=128, n_layer=2, d_model=64, n_head=4, seq_len=32)
HAS_BASELINE_TIMELINE = "baseline_timeline" in {f.name for f in dataclasses.fields(Plan)}


@pytest.fixture(autouse=True)
def no_pyplot_figures():
    assert plt.get_fignums() == []
    yield
    assert plt.get_fignums() == []  # nothing remat drew went through pyplot


def lines(fig: Figure) -> dict:
    (ax,) = fig.axes
    return {line.get_label(): line for line in ax.get_lines()}


def workload(name):
    if name == "cosmm":
        return CosMM(), (cosmm_input(),), None
    return GPT(GPT_CONFIG), make_gpt_batch(GPT_CONFIG, batch=2), gpt_loss


def bound(model, loss_fn):
    return model if loss_fn is None else (lambda *xs: loss_fn(model, *xs))


@pytest.fixture(scope="module", params=["cosmm", "gpt"])
def joint(request):
    model, inputs, loss_fn = workload(request.param)
    (captured,) = capture_joints(bound(model, loss_fn), *inputs)
    return captured


def planned(joint, **fields):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return plan_joint(joint.joint, joint.num_fwd_outputs, RematConfig(**fields))


def baseline_timeline(p):
    """What `Plan.baseline_timeline` holds: the simulated baseline plan (under inductor, the min-cut partition's)."""
    return simulate(p.problem, Evaluator(p.problem).baseline().resolved)


# --- timeline -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("budget", [0.5, 0.0, "4MiB"])
def test_timeline_lines_are_the_plan_the_baseline_and_the_budget(joint, budget):
    p = planned(joint, memory_budget=budget)
    plan = p.plan
    fig = plot_timeline(plan, baseline=baseline_timeline(p))
    assert isinstance(fig, Figure)
    drawn = lines(fig)
    line = drawn["plan"]
    assert list(line.get_ydata()) == [b / MIB for b in plan.timeline.live]
    assert list(line.get_xdata()) == list(range(len(plan.timeline.live)))
    assert max(line.get_ydata()) == plan.peak_bytes / MIB
    assert max(drawn["baseline"].get_ydata()) == plan.baseline.peak_bytes / MIB
    assert list(drawn["budget"].get_ydata()) == [plan.budget_bytes / MIB] * 2
    assert list(drawn["backward starts"].get_xdata()) == [plan.timeline.num_forward - 0.5] * 2
    # baseline x positions follow the plan's schedule: increasing, inside the plan's steps
    xs = list(drawn["baseline"].get_xdata())
    assert xs == sorted(xs) and 0 <= xs[0] and xs[-1] <= len(plan.timeline.live) - 1


def test_timeline_shades_recomputation(joint):
    p = planned(joint, memory_budget=0.0)
    kinds = p.plan.timeline.kinds
    assert "recompute" in kinds
    runs = sum(1 for i, k in enumerate(kinds) if k == "recompute" and (i == 0 or kinds[i - 1] != "recompute"))
    (ax,) = plot_timeline(p.plan, baseline=baseline_timeline(p)).axes
    shaded = [patch for patch in ax.patches if patch.get_facecolor()[:3] == matplotlib.colors.to_rgb("tab:orange")]
    assert len(shaded) == runs
    assert [h.get_label() for h in ax.get_legend().legend_handles].count("recompute") == 1


def test_timeline_without_budget_has_no_budget_line(joint):
    p = planned(joint, memory_budget=None)
    drawn = lines(plot_timeline(p.plan, baseline=baseline_timeline(p)))
    assert "budget" not in drawn
    assert max(drawn["plan"].get_ydata()) == max(drawn["baseline"].get_ydata()) == p.plan.baseline.peak_bytes / MIB


@pytest.mark.skipif(not HAS_BASELINE_TIMELINE, reason="Plan.baseline_timeline not added yet (remat/plan/plan.py)")
def test_timeline_baseline_defaults_to_the_plans_field(joint):
    p = planned(joint, memory_budget=0.5)
    assert p.plan.baseline_timeline == baseline_timeline(p)
    drawn = lines(plot_timeline(p.plan))
    assert max(drawn["baseline"].get_ydata()) == p.plan.baseline.peak_bytes / MIB


def hand_plan(budget=None):
    """x, y forward; backward recomputes x, then runs gy, gx. Baseline: x, y forward; gy, gx backward."""
    names = ("x", "y", "gy", "gx")
    tl = Timeline(
        (0, 1, 0, 2, 3), names, frozenset({"x"}), (1 * MIB, 2 * MIB, 3 * MIB, 5 * MIB, 1 * MIB), 5 * MIB, 3, MIB, 2, {}
    )
    base = Timeline((0, 1, 2, 3), names, frozenset(), (1 * MIB, 2 * MIB, 6 * MIB, 2 * MIB), 6 * MIB, 2, 2 * MIB, 2, {})
    fields = dict(
        decisions=(),
        saved_bytes=MIB,
        peak_bytes=5 * MIB,
        recompute_flops=10,
        baseline=Baseline(2 * MIB, 6 * MIB),
        budget_bytes=budget,
        least_peak=None,
        feasible=True,
        solver="greedy",
        gap=None,
        timeline=tl,
    )
    if HAS_BASELINE_TIMELINE:
        fields["baseline_timeline"] = base
    return Plan(**fields), base


def test_timeline_on_a_hand_built_plan_aligns_the_baseline_by_node():
    plan, base = hand_plan(budget=5 * MIB)
    fig = plot_timeline(plan, baseline=base)
    drawn = lines(fig)
    assert list(drawn["plan"].get_ydata()) == [1, 2, 3, 5, 1]
    assert list(drawn["baseline"].get_ydata()) == [1, 2, 6, 2]
    assert list(drawn["baseline"].get_xdata()) == [0, 1, 3, 4]  # gy and gx at their steps in the plan
    assert list(drawn["budget"].get_ydata()) == [5, 5]
    (ax,) = fig.axes
    (span,) = [patch for patch in ax.patches if patch.get_label() == "recompute"]
    assert span.get_x() == 1.5 and span.get_width() == 1.0  # step 2, the recomputation of x


def test_timeline_draws_on_a_given_axes_and_saves_headless():
    plan, base = hand_plan()
    fig = Figure()
    ax, other = fig.subplots(1, 2)
    assert plot_timeline(plan, ax=other, baseline=base) is fig
    assert ax.get_lines() == [] and {line.get_label() for line in other.get_lines()} >= {"plan", "baseline"}
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    assert buffer.getvalue().startswith(b"\x89PNG")


def test_plots_leave_matplotlib_global_state_alone():
    # In a fresh interpreter that never imports pyplot (this module does): drawing and saving must not import it,
    # pick a backend or change an rcParam. dict.items reads the stored values without resolving the backend.
    script = "\n".join(
        [
            "import io, sys, matplotlib",
            "before = dict(dict.items(matplotlib.rcParams))",
            "from remat.plan.plan import Baseline, Plan",
            "from remat.plan.simulate import Timeline",
            "from remat.plots import plot_timeline",
            f"MIB, HAS_BASELINE_TIMELINE = {MIB}, {HAS_BASELINE_TIMELINE}",
            inspect.getsource(hand_plan),
            "plan, base = hand_plan(budget=4 * MIB)",
            "plot_timeline(plan, baseline=base).savefig(io.BytesIO(), format='png')",
            "assert dict(dict.items(matplotlib.rcParams)) == before",
            "print('matplotlib.pyplot' in sys.modules)",
        ]
    )
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", script], cwd=repo, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1] == "False"


# --- pareto ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["cosmm", "gpt"])
def test_pareto_rows_are_the_planner_s_numbers(name):
    model, inputs, loss_fn = workload(name)
    budgets, solvers = (1.0, 0.5, 0.0), ("greedy", "mincut")
    result = pareto(model, *inputs, budgets=budgets, solvers=solvers, loss_fn=loss_fn)
    assert isinstance(result, ParetoResult) and not result.measured
    assert [(r.solver, r.budget) for r in result.rows] == [(s, b) for s in solvers for b in budgets]
    (captured,) = capture_joints(bound(model, loss_fn), *inputs)
    for r in result.rows:
        plan = planned(captured, memory_budget=r.budget, solver=r.solver, inner=result.inner).plan
        assert (r.peak_bytes, r.saved_bytes, r.recompute_flops, r.budget_bytes, r.feasible) == (
            plan.peak_bytes,
            plan.saved_bytes,
            plan.recompute_flops,
            plan.budget_bytes,
            plan.feasible,
        )
        assert r.measured_peak_bytes is None and r.step_ms is None
    assert result.baseline_peak_bytes == result.rows[0].peak_bytes  # fraction 1.0 is the baseline
    table = result.table()
    assert len(table.splitlines()) == 1 + len(result.rows) + 1 and "mincut" in table
    assert result.to_records()[0]["solver"] == "greedy"

    drawn = lines(plot_pareto(result))
    assert set(drawn) == set(solvers)
    for solver in solvers:
        rows = [r for r in result.rows if r.solver == solver]
        assert list(drawn[solver].get_xdata()) == [r.peak_bytes / MIB for r in rows]
        assert list(drawn[solver].get_ydata()) == [r.recompute_flops / 1e6 for r in rows]


def test_pareto_cosmm_exact_points():
    result = pareto(CosMM(), cosmm_input(), budgets=(1.0, 0.0), solvers=("greedy",))
    loss = 4  # the fp32 scalar the forward returns stays alive through backward
    assert [r.peak_bytes for r in result.rows] == [11 * MIB + loss, 5 * MIB + loss]
    assert list(lines(plot_pareto(result))["greedy"].get_xdata()) == [11 + loss / MIB, 5 + loss / MIB]


def test_pareto_rejects_bad_options_before_tracing():
    with pytest.raises(TypeError, match="memory_budget is set per row"):
        pareto(CosMM(), cosmm_input(), memory_budget=0.5)
    with pytest.raises(ValueError, match="a float budget is a fraction"):
        pareto(CosMM(), cosmm_input(), budgets=(1.5,))
    with pytest.raises(ValueError, match="solver"):
        pareto(CosMM(), cosmm_input(), solvers=("fastest",))


def test_measured_pareto_and_torch_points_share_measured_axes():
    model, x = CosMM(), cosmm_input()
    rng = torch.get_rng_state()
    result = pareto(model, x, budgets=(1.0, 0.0), measure=True, repeat=1)
    points = torch_budget_points(model, x, budgets=(1.0, 0.5), repeat=1, reference_step_ms=result.reference_step_ms)
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(p.grad is None for p in model.parameters())  # the caller's model was never trained

    assert result.measured and result.reference_step_ms > 0 and result.reference_peak_bytes > 0
    for r in result.rows:
        assert r.step_ms > 0 and r.step_ratio == r.step_ms / result.reference_step_ms
        # the aot_eager step allocates what the simulator counts, plus a few small bookkeeping tensors
        assert r.peak_bytes <= r.measured_peak_bytes < r.peak_bytes + 64 * 1024
    assert "measured MiB" in result.table()
    assert [p.label for p in points] == ["torch 1.0", "torch 0.5"]
    assert all(isinstance(p, TorchPoint) and p.peak_bytes > 0 and p.overhead > 0 for p in points)
    assert points[1].peak_bytes < points[0].peak_bytes  # the patched budget reached torch's partitioner
    assert torch._functorch.config.activation_memory_budget == 1.0  # and was restored

    drawn = lines(plot_pareto(result, torch_points=points))
    assert list(drawn["auto"].get_xdata()) == [r.measured_peak_bytes / MIB for r in result.rows]
    assert list(drawn["auto"].get_ydata()) == [r.step_ratio for r in result.rows]
    assert list(drawn[TORCH_LABEL].get_xdata()) == [p.peak_bytes / MIB for p in points]
    assert list(drawn[TORCH_LABEL].get_ydata()) == [p.overhead for p in points]

    unmeasured = dataclasses.replace(result, reference_step_ms=None)
    with pytest.raises(ValueError, match="measure=True"):
        plot_pareto(unmeasured, torch_points=points)
    with pytest.raises(ValueError, match="cannot share axes"):
        plot_pareto(result, torch_points=points, measured=False)

import gc
import os
import sys
import warnings

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))

if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)  # one core per worker: scripts/test.sh runs as many workers as the machine has cores


# Tests left out of the fast subset (`-m "not slow"`, scripts/test.sh runs it first; ≤ 3 minutes on two cores):
# besides those marked slow or inductor where they are defined, the whole of a file, single tests (every case) and
# cases of parametrized tests (SLOW_CASES: the fast subset keeps the quickest case), each costing seconds or more.
SLOW_FILES = {
    "test_eager_distributed.py": "spawns gloo ranks",
    "test_fuzz.py": "plans and runs many seeded random graphs",
    "test_partition.py": "spawns gloo ranks",
    "test_tensor_parallel.py": "spawns gloo ranks and torchrun",
}
SLOW_TESTS = {
    "test_baseline.py::test_min_cut_partition_builds_modules_whose_code_is_generated_when_first_read": (
        "partitions a GPT twice"
    ),
    "test_budget.py::test_fractions_and_bytes_meet_the_budget_and_are_monotone": "plans a GPT at every budget",
    "test_budget.py::test_plans_do_not_depend_on_hash_seed": "a subprocess per hash seed, each planning a GPT",
    "test_check.py::test_check_plan_on_dropout_plans": "checks a GPT's plans at many budgets",
    "test_compare.py::test_fraction_budget_is_the_same_bytes_for_every_solver": "every solver, optimal's MILP included",
    "test_environ.py::test_trainer_run_planned_under_the_variable": "runs a trainer in a subprocess",
    "test_fusion.py::test_explain_plans_the_graph_an_inductor_compile_plans": "compiles with inductor",
    "test_logs.py::test_torch_trace_holds_the_remat_plan_artifact": "compiles in a subprocess under TORCH_TRACE",
    "test_maxflow.py::test_scipy_cuts_are_networkx_cuts_on_models_and_random_graphs": "every cut of models and graphs",
    "test_mincut.py::test_mincut_meets_every_budget_greedy_meets": "mincut and greedy at 11 budgets on 52 graphs",
    "test_models.py::test_bitwise_parity_aot_eager": "each model of tests/models.py at four budgets",
    "test_parity.py::test_gpt_budget_zero_replays_dropout_instead_of_saving_masks": "trains a GPT",
    "test_plots.py::test_plots_leave_matplotlib_global_state_alone": "draws every figure",
    "test_plots.py::test_timeline_lines_are_the_plan_the_baseline_and_the_budget": "plans a GPT per case",
    "test_recipes.py::test_an_empty_save_list_is_never_worse_than_a_one_kind_list_on_gpt": "many plans of a GPT",
    "test_recipes.py::test_dropout_scratch_is_counted_so_fraction_budgets_hold": "measured GPT steps",
    "test_recipes.py::test_least_peak_is_no_higher_than_per_block_checkpoint_measured": "measured GPT steps",
    "test_recipes.py::test_replay_is_never_worse_than_save_on_gpt": "many plans of a GPT",
    "test_recipes.py::test_under_inductor_every_proposal_recomputing_a_block_output_has_a_twin_saving_them": (
        "a GPT's families"
    ),
    "test_solvers.py::test_every_registered_solver_is_documented_and_plans": "every solver, optimal's MILP included",
    "test_solvers.py::test_lower_budget_never_raises_the_peak": "a sweep of budgets per solver",
    "test_solvers.py::test_optimal_is_cheapest_and_every_solver_meets_a_reachable_budget": "optimal's MILP per graph",
    "test_solvers.py::test_optimal_lower_budget_never_raises_the_peak": "optimal's MILP at several budgets",
    "test_step_budget.py::test_ddp_buckets_share_one_byte_budget": "spawns gloo ranks",
    "test_step_budget.py::test_ranks_split_the_step_budget_alike": "spawns gloo ranks",
    "test_step_budget.py::test_recompiles_take_their_graphs_place": "recompiles a model",
    "test_symbolic.py::test_peak_expr_is_the_static_plans_peak_at_each_batch": "traces a GPT at four shapes",
    "test_symbolic.py::test_reduced_max_equals_the_max_over_every_step": "shares that trace",
}
SLOW_CASES = {
    "test_budget.py::test_fraction_endpoints": ("gpt",),
    "test_budget.py::test_infeasible_budget_warns_with_least_peak": ("gpt",),
    "test_budget.py::test_plans_are_deterministic": ("gpt",),
    "test_budget.py::test_strict_raises": ("gpt",),
    "test_baseline.py::test_none_saves_exactly_what_min_cut_saves": ("hf-gpt2-aot_eager",),
    "test_eager_compile.py::test_regions_compile_without_graph_break_and_are_recomputed": (
        "deepspeed",
        "checkpoint_wrapper",
        "apply_activation_checkpointing",
        "set_activation_checkpointing",
    ),
    "test_instances.py::test_steps_are_the_step_by_step_walk": ("gpt-inductor",),
    "test_lazy_pick.py::test_lazy_pick_returns_what_simulating_every_member_returns": (
        "0-inductor",
        "1-inductor",
        "1-aot_eager",
    ),
    "test_parity.py::test_gpt_with_dropout_bitwise_aot_eager": (
        "None",
        "1.0",
        "0.75",
        "0.5",
        "0.25",
        "700KB",
        "400000",
        "10MB",
    ),
    "test_plots.py::test_pareto_rows_are_the_planner_s_numbers": ("gpt",),
    "test_reorder.py::test_least_peak_first_is_inductors_rule_and_stops_only_where_it_cannot_win": (
        "gpt",
        "random1",
        "random2",
        "random3",
    ),
}

# Seconds the slow tests of each file take on one worker (the --durations log of the slow tier on two cores, rounded;
# files not listed take a few seconds). The files run heaviest first: with --dist loadfile a file stays on the worker
# that starts it, so the files started last must be short for both workers to finish together.
SLOW_SECONDS = {
    "test_fuzz.py": 260,
    "test_compare_models_inductor.py": 210,
    "test_models.py": 185,
    "test_solvers.py": 180,
    "test_notebooks.py": 125,
    "test_tensor_parallel.py": 125,
    "test_parity.py": 102,
    "test_recipes.py": 98,
    "test_fusion.py": 95,
    "test_budget.py": 90,
    "test_backend.py": 80,
    "test_compare_models_aot_eager.py": 80,
    "test_partition.py": 70,
    "test_baseline.py": 65,
    "test_optimal_graphs_first_half.py": 65,
    "test_optimal_graphs_second_half.py": 65,
    "test_mincut.py": 50,
    "test_ranks.py": 50,
    "test_plots.py": 45,
    "test_compare.py": 40,
    "test_lazy_pick.py": 36,
    "test_step_budget.py": 31,
    "test_runtime.py": 30,
    "test_reorder.py": 20,
    "test_rng.py": 15,
    "test_symbolic.py": 15,
    "test_check.py": 13,
    "test_environ.py": 13,
    "test_maxflow.py": 12,
    "test_instances.py": 10,
    "test_logs.py": 10,
    "test_eager_compile.py": 7,
}


def pytest_configure(config):
    """xdist's loadfile schedule keeps the order of the collection (below: heaviest files first) rather than its
    default order, most tests per file first, which starts single-test files of a minute last."""
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items):
    """Mark slow: every inductor test (inductor's first compile costs ~20 s here) and the files, tests and cases
    above. Order the files by SLOW_SECONDS, heaviest first (a stable sort: each file's tests keep their order). A
    SLOW_CASES id that its test does not have fails the run, where the run collected whole tests (not single cases
    named by node id, nor only the last failures)."""
    seen: dict[str, set[str]] = {}  # per parametrized test, the case ids collected
    for item in items:
        file = item.path.name
        test = f"{file}::{item.originalname}"
        case = item.callspec.id if hasattr(item, "callspec") else None
        if case is not None:
            seen.setdefault(test, set()).add(case)
        if (
            item.get_closest_marker("inductor")
            or file in SLOW_FILES
            or test in SLOW_TESTS
            or case in SLOW_CASES.get(test, ())
        ):
            item.add_marker(pytest.mark.slow)
    items.sort(key=lambda item: -SLOW_SECONDS.get(item.path.name, 0))
    if any("[" in str(arg) for arg in config.args) or config.getoption("lf", False):
        return
    for test, cases in SLOW_CASES.items():
        unknown = set(cases) - seen.get(test, set(cases))
        if unknown:
            raise pytest.UsageError(f"tests/conftest.py SLOW_CASES: {test} has no case {sorted(unknown)}")


def pytest_collection_finish(session):
    """What collection imported (torch, transformers, every test module: some 400,000 objects) is never garbage:
    move it out of the garbage collector's sight, so the full collections the fixtures run before a test (a
    region or arena a traceback kept alive must not count in the next test) scan only what the tests made."""
    gc.collect()
    gc.freeze()


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test starts and ends with empty dynamo caches, so compiled graphs never leak between tests."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture(autouse=True)
def quiet_profiler_warnings():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning)
        yield

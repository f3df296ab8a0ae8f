import os
import sys
import warnings

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))

if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)  # one core per worker: scripts/test.sh runs as many workers as the machine has cores


# Tests left out of the fast subset (`-m "not slow"`, scripts/test.sh runs it first): besides those marked slow or
# inductor where they are defined, the whole of a file or single tests, each costing tens of seconds on two cores.
SLOW_FILES = {
    "test_eager_distributed.py": "spawns gloo ranks",
    "test_fuzz.py": "plans and runs many seeded random graphs",
    "test_partition.py": "spawns gloo ranks",
    "test_tensor_parallel.py": "spawns gloo ranks and torchrun",
}
SLOW_TESTS = {
    "test_budget.py::test_fractions_and_bytes_meet_the_budget_and_are_monotone": "plans a GPT at every budget",
    "test_budget.py::test_plans_do_not_depend_on_hash_seed": "a subprocess per hash seed, each planning a GPT",
    "test_compare.py::test_fraction_budget_is_the_same_bytes_for_every_solver": "every solver, optimal's MILP included",
    "test_fusion.py::test_explain_plans_the_graph_an_inductor_compile_plans": "compiles with inductor",
    "test_logs.py::test_torch_trace_holds_the_remat_plan_artifact": "compiles in a subprocess under TORCH_TRACE",
    "test_mincut.py::test_mincut_meets_every_budget_greedy_meets": "mincut and greedy at 11 budgets on 52 graphs",
    "test_models.py::test_bitwise_parity_aot_eager": "each model of tests/models.py at four budgets",
    "test_recipes.py::test_an_empty_save_list_is_never_worse_than_a_one_kind_list_on_gpt": "many plans of a GPT",
    "test_recipes.py::test_dropout_scratch_is_counted_so_fraction_budgets_hold": "measured GPT steps",
    "test_recipes.py::test_least_peak_is_no_higher_than_per_block_checkpoint_measured": "measured GPT steps",
    "test_recipes.py::test_replay_is_never_worse_than_save_on_gpt": "many plans of a GPT",
    "test_solvers.py::test_lower_budget_never_raises_the_peak": "a sweep of budgets per solver",
    "test_solvers.py::test_optimal_is_cheapest_and_every_solver_meets_a_reachable_budget": "optimal's MILP per graph",
    "test_step_budget.py::test_ddp_buckets_share_one_byte_budget": "spawns gloo ranks",
    "test_step_budget.py::test_ranks_split_the_step_budget_alike": "spawns gloo ranks",
    "test_symbolic.py::test_peak_expr_is_the_static_plans_peak_at_each_batch": "traces a GPT at four shapes",
    "test_symbolic.py::test_reduced_max_equals_the_max_over_every_step": "shares that trace",
}

# Seconds the slow tests of each file take on one worker (the --durations log of the slow tier on two cores, rounded;
# files not listed take a few seconds). The files run heaviest first: with --dist loadfile a file stays on the worker
# that starts it, so the files started last must be short for both workers to finish together.
SLOW_SECONDS = {
    "test_fuzz.py": 260,
    "test_compare_models_inductor.py": 210,
    "test_models.py": 185,
    "test_solvers.py": 160,
    "test_tensor_parallel.py": 125,
    "test_notebooks.py": 125,
    "test_fusion.py": 95,
    "test_recipes.py": 85,
    "test_compare_models_aot_eager.py": 80,
    "test_backend.py": 80,
    "test_partition.py": 70,
    "test_parity.py": 70,
    "test_optimal_graphs_first_half.py": 65,
    "test_optimal_graphs_second_half.py": 65,
    "test_budget.py": 65,
    "test_baseline.py": 50,
    "test_mincut.py": 50,
    "test_compare.py": 40,
    "test_runtime.py": 30,
    "test_lazy_pick.py": 25,
    "test_step_budget.py": 25,
    "test_symbolic.py": 15,
    "test_rng.py": 15,
    "test_logs.py": 10,
}


def pytest_configure(config):
    """xdist's loadfile schedule keeps the order of the collection (below: heaviest files first) rather than its
    default order, most tests per file first, which starts single-test files of a minute last."""
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items):
    """Mark slow: every inductor test (inductor's first compile costs ~20 s here) and the files and tests above. Order
    the files by SLOW_SECONDS, heaviest first (a stable sort: each file's tests keep their order)."""
    for item in items:
        file = item.path.name
        test = f"{file}::{item.originalname}"
        if item.get_closest_marker("inductor") or file in SLOW_FILES or test in SLOW_TESTS:
            item.add_marker(pytest.mark.slow)
    items.sort(key=lambda item: -SLOW_SECONDS.get(item.path.name, 0))


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

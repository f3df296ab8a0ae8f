"""The benchmark report's computed findings (benchmarks/checks.py, time_checks.py) on small synthetic rows: each
verdict passes and fails where it should and names the offending rows; the output paths of each inner compiler's run
(report.py)."""

import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import checks  # noqa: E402 (benchmarks/ is not a package: imported from its folder)
import findings  # noqa: E402
import report  # noqa: E402
import time_checks  # noqa: E402

MIB = 2**20


def row(name, kind, peak_mib, model="m", step_ms=100.0, spread=0.0, **fields):
    """One measured row: ``spread`` sets (slowest - fastest) / median of its timed steps."""
    times = [step_ms * (1 - spread / 2), step_ms, step_ms * (1 + spread / 2)]
    return {
        "model": model,
        "row": name,
        "kind": kind,
        "budget": None,
        "budget_kind": None,
        "options": {},
        "measured_peak_bytes": int(peak_mib * MIB),
        "step_ms": step_ms,
        "step_ms_all": times,
        "first_step_s": 1.0,
        "max_grad_diff": 0.0,
        "max_grad_rel_err": 0.0,
        **fields,
    }


def remat_row(name, peak_mib, sim_mib, budget_mib=None, fraction=None, **fields):
    budget = {}
    if fraction is not None:
        budget = {"budget": fraction, "budget_kind": "fraction", "plan_budget_bytes": int(budget_mib * MIB)}
    elif budget_mib is not None:
        budget = {"budget": int(budget_mib * MIB), "budget_kind": "bytes", "plan_budget_bytes": int(budget_mib * MIB)}
    plan = {
        "plan_peak_bytes": int(sim_mib * MIB),
        "plan_feasible": True,
        "plan_least_peak_bytes": int(10 * MIB),
        "plan_graphs": 1,
    }
    return row(name, "remat", peak_mib, **{**plan, **budget, **fields})


def test_sim_vs_measured_passes_within_five_percent_and_names_each_row_outside():
    rows = [remat_row("remat fraction 0.5", 104, 100, 110, fraction=0.5), remat_row("remat None", 96, 100)]
    assert checks.sim_vs_measured(rows).ok is True

    rows = [
        remat_row("remat fraction 0.5", 106, 100, 110, fraction=0.5),
        remat_row("remat None", 90, 100),
        remat_row("remat fraction 0.0", 50, 50, 50, fraction=0.0),
        remat_row("remat offload", 200, 100, options={"offload": True}),
    ]  # no budget, options: not compared
    found = checks.sim_vs_measured(rows)
    assert found.ok is False
    assert "2 of 3 rows outside" in found.text
    assert "`remat fraction 0.5` +6.0%" in found.text and "`remat None` -10.0%" in found.text
    assert "remat offload" not in found.text and "`remat fraction 0.0` +" not in found.text


def test_sim_vs_measured_leaves_out_rows_with_graph_breaks():
    rows = [
        remat_row("remat fraction 0.5", 100, 100, 110, fraction=0.5),
        remat_row("remat fraction 0.2", 200, 100, 110, fraction=0.2, plan_graphs=2),
    ]
    found = checks.sim_vs_measured(rows)
    assert found.ok is True and "Not compared (1 rows" in found.text


def test_none_vs_plain_peak_allows_two_percent():
    plain = row("inductor", "compiled", 100)
    assert checks.none_vs_plain([plain, remat_row("remat None", 102, 102)], "inductor").ok is True
    found = checks.none_vs_plain([plain, remat_row("remat None", 103, 103)], "inductor")
    assert found.ok is False and "Above on 1 of 1 models: m (3.0 MiB above, 1.030×)" in found.text


def test_none_vs_plain_time_allows_three_percent_and_reports_the_rows_spread():
    plain = row("aot_eager", "compiled", 100, step_ms=100.0, spread=0.02)
    assert time_checks.none_vs_plain_time([plain, remat_row("remat None", 100, 100, step_ms=103.0)], "aot_eager").ok
    found = time_checks.none_vs_plain_time(
        [plain, remat_row("remat None", 100, 100, step_ms=104.0, spread=0.10)], "aot_eager"
    )
    assert found.ok is False
    assert "Slower on 1 of 1 models: m 1.04×" in found.text and "up to 10%" in found.text and "within" in found.text
    found = time_checks.none_vs_plain_time([plain, remat_row("remat None", 100, 100, step_ms=120.0)], "aot_eager")
    assert found.ok is False and "beyond" in found.text


def paired(against, ratio, rounds=15):
    return {
        "against": against,
        "step_ms": 100.0 * ratio,
        "against_step_ms": 100.0,
        "ratio": ratio,
        "round_ratio_quartiles": (ratio - 0.02, ratio + 0.02),
        "rounds": rounds,
        "limit": 1.0,
    }


def test_step_time_checks_read_the_paired_timing_when_the_run_took_one():
    plain = row("inductor", "compiled", 100, step_ms=100.0)
    # separate stretches say 1.20x; timed in alternation the two are within 3%
    none = remat_row("remat None", 100, 100, step_ms=120.0, paired=paired("inductor", 1.01))
    found = time_checks.none_vs_plain_time([plain, none], "inductor")
    assert found.ok is True and "101.0 vs 100.0 ms, timed in alternation over 15 rounds (1.01×)" in found.text
    none["paired"] = paired("inductor", 1.05)
    found = time_checks.none_vs_plain_time([plain, none], "inductor")
    assert found.ok is False and "m 1.05× (per-round ratios' quartiles 1.03-1.07)" in found.text
    # a pairing against another row is not this comparison's: the stretches decide
    none["paired"] = paired("aot_eager", 1.0)
    assert time_checks.none_vs_plain_time([plain, none], "inductor").ok is False
    # a run that kept the medians' ratio beside the median per-round ratio, and the plain row's control: the
    # per-round ratio is the one held to the limit
    none["paired"] = dict(
        paired("inductor", 1.01, rounds=25),
        ratio_of_medians=1.07,
        plain_vs_itself={"ratio": 0.99, "round_ratio_quartiles": (0.95, 1.04)},
    )
    found = time_checks.none_vs_plain_time([plain, none], "inductor")
    expected = (
        "m: 101.0 vs 100.0 ms (medians; their ratio 1.07×), timed in alternation over 25 rounds; `inductor` "
        "against a second build of itself 0.99× (quartiles 0.95-1.04); median per-round ratio (1.01×)"
    )
    assert found.ok is True and expected in found.text, found.text
    none["paired"]["ratio"] = 1.04
    assert time_checks.none_vs_plain_time([plain, none], "inductor").ok is False

    rows = recipe_rows(**{"per-block": {"step_ms": 250.0, "paired": paired("eager+checkpoint", 0.9)}})
    found = time_checks.recipe_step_time(rows)
    assert found.ok is True and "m @ per-block: 0.90× in alternation" in found.text
    rows = recipe_rows(**{"op-SAC": {"paired": paired("op-SAC", 1.02)}})
    found = time_checks.recipe_step_time(rows)
    assert found.ok is False and "Slower on 1 of 3: m `remat bytes = op-SAC` 1.02× (per-round" in found.text


def test_least_vs_per_block_on_every_model():
    rows = [
        row("eager+checkpoint", "checkpoint", 80),
        remat_row("remat fraction 0.0", 80, 80, 80, fraction=0.0),
        row("eager+checkpoint", "checkpoint", 60, model="n"),
        remat_row("remat fraction 0.0", 50, 50, 50, fraction=0.0, model="n"),
    ]
    assert checks.least_vs_per_block(rows).ok is True
    rows[3] = remat_row("remat fraction 0.0", 70, 70, 70, fraction=0.0, model="n")
    found = checks.least_vs_per_block(rows)
    assert found.ok is False and "Above on 1 of 2 models: n (10.0 MiB above, 1.17×)" in found.text


def recipe_rows(**remat_fields):
    """The three hand recipes and remat at each one's measured peak, remat meeting every budget."""
    out = []
    for (name, recipe), peak in zip(findings.RECIPE_ROWS, (60, 90, 120), strict=True):
        out.append(row(name, "checkpoint", peak, step_ms=200.0))
        fields = {"step_ms": 150.0, **remat_fields.get(recipe, {})}
        out.append(remat_row(f"remat bytes = {recipe}", fields.pop("peak", peak - 5), peak - 5, peak, **fields))
    return out


def test_at_recipe_peaks_passes_when_every_budget_is_met():
    found = checks.at_recipe_peaks(recipe_rows())
    assert found.ok is True and "m @ per-block" in found.text and "m @ op-SAC" in found.text


def test_at_recipe_peaks_fails_over_the_budget_or_on_an_infeasible_plan():
    rows = recipe_rows(**{"per-block": {"peak": 64}, "op-SAC": {"plan_feasible": False}})
    found = checks.at_recipe_peaks(rows)
    assert found.ok is False and "Failing 2 of 3" in found.text
    assert "`remat bytes = per-block`: 1.067 × budget" in found.text
    assert "`remat bytes = op-SAC`: plan infeasible (warned; least reachable peak 10.0 MiB)" in found.text
    assert "`remat bytes = per-2-blocks`:" not in found.text


def test_recipe_step_time_fails_when_remat_is_slower_than_the_recipe():
    assert time_checks.recipe_step_time(recipe_rows()).ok is True
    found = time_checks.recipe_step_time(recipe_rows(**{"per-2-blocks": {"step_ms": 210.0}}))
    assert found.ok is False and "Slower on 1 of 3: m `remat bytes = per-2-blocks` 1.05×" in found.text


def test_compile_time_names_the_slowest_remat_row_per_model():
    plain = row("inductor", "compiled", 100, first_step_s=10.0)
    rows = [
        plain,
        remat_row("remat None", 100, 100, first_step_s=12.0),
        remat_row("remat fraction 0.5", 80, 80, 90, fraction=0.5, first_step_s=15.0),
    ]
    found = time_checks.compile_time(rows, "inductor", fresh_cache=True)
    assert found.ok is True and "`remat fraction 0.5` 15.0 s vs 10.0 s (1.50×)" in found.text
    assert "empty inductor cache" in found.text

    rows[2] = remat_row("remat fraction 0.5", 80, 80, 90, fraction=0.5, first_step_s=16.0)
    found = time_checks.compile_time(rows, "inductor", fresh_cache=True)
    assert found.ok is False and "Over on m (1 of 2 remat rows)" in found.text


def test_compile_time_says_when_the_rows_shared_the_kernel_caches():
    rows = [row("inductor", "compiled", 100, first_step_s=10.0), remat_row("remat None", 100, 100, first_step_s=4.0)]
    found = time_checks.compile_time(rows, "inductor", fresh_cache=False)
    assert found.ok is True
    assert "shared inductor's kernel caches" in found.text and "m 4.0 s vs 10.0 s" in found.text
    assert "shared inductor's kernel caches" not in time_checks.compile_time(rows, "inductor", fresh_cache=True).text


def test_every_finding_is_computed_from_an_empty_or_partial_run():
    rows = [row("eager", "eager", 100), row("inductor", "compiled", 90)]
    names = [f.name for f in checks.all_findings(rows, "inductor")]
    assert {
        "sim_vs_measured",
        "none_vs_plain_time",
        "least_vs_per_block",
        "at_recipe_peaks",
        "recipe_step_time",
        "compile_time",
    } <= set(names)


@pytest.mark.parametrize(("inner", "stem"), [("inductor", "latest"), ("aot_eager", "aot_eager")])
def test_each_inner_compiler_has_its_own_outputs(inner, stem):
    json_path = report.default_json(inner)
    assert json_path == BENCHMARKS / "results" / f"{stem}.json"
    if inner == "inductor":
        assert report.default_report_path(json_path) == BENCHMARKS / "REPORT.md"
        assert report.derived(json_path, "pareto.png") == BENCHMARKS / "results" / "pareto.png"
    else:
        assert report.default_report_path(json_path) == BENCHMARKS / "REPORT-aot_eager.md"
        assert report.derived(json_path, "pareto.png") == BENCHMARKS / "results" / "aot_eager-pareto.png"
        assert report.derived(json_path, "headline.md") == BENCHMARKS / "results" / "aot_eager-headline.md"


def test_scratch_runs_name_their_outputs_by_stem(tmp_path):
    assert report.default_report_path(tmp_path / "latest.json") == tmp_path / "REPORT.md"
    assert report.default_report_path(tmp_path / "quick.json") == tmp_path / "REPORT-quick.md"


def test_compile_time_says_when_the_plain_row_paid_the_compiler_start_up():
    rows = [row("inductor", "compiled", 100, first_step_s=10.0), remat_row("remat None", 100, 100, first_step_s=12.0)]
    assert "one-time compiler start-up" in time_checks.compile_time(rows, "inductor", True, warmed_up=False).text
    assert "one-time compiler start-up" not in time_checks.compile_time(rows, "inductor", True, warmed_up=True).text


def test_compile_time_holds_the_re_timed_ratio_where_the_run_took_one():
    plain = row("inductor", "compiled", 100, first_step_s=10.0)
    slow = remat_row("remat contiguous 0.5", 100, 100, first_step_s=17.0)
    other = remat_row("remat None", 100, 100, first_step_s=11.0)
    assert time_checks.compile_time([plain, slow, other], "inductor", True, True).ok is False
    slow["compile_recheck"] = {"seconds": 13.0, "plain_seconds": 10.0, "ratio": 1.3, "rounds": 2}
    found = time_checks.compile_time([plain, slow, other], "inductor", True, True)
    assert found.ok is True, found.text
    assert "m: `remat contiguous 0.5` 13.0 s vs 10.0 s re-timed (1.30×; its single first step 17.0 vs 10.0 s)" in (
        found.text
    )
    assert "2 rounds in turn" in found.text
    slow["compile_recheck"]["ratio"] = 1.6
    assert time_checks.compile_time([plain, slow, other], "inductor", True, True).ok is False


def test_compile_recheck_re_times_the_slowest_row_and_those_over_the_limit_in_turn():
    import compile_time

    rows = [
        row("inductor", "compiled", 100, first_step_s=10.0),
        remat_row("remat fraction 0.5", 100, 100, 50, fraction=0.5, first_step_s=16.0),
        remat_row("remat bytes = per-block", 100, 100, 60, first_step_s=17.0, options={"contiguous": True}),
        remat_row("remat None", 100, 100, first_step_s=12.0),
        remat_row("remat fraction 0.0", 100, 100, 40, fraction=0.0, first_step_s=12.0, error="broken"),
    ]
    calls = []
    seconds = {"inductor": [10.0, 12.0, 11.0]}

    def run(model, key, fallback_random, one_thread):
        assert fallback_random and not one_thread  # the report's rows' settings
        calls.append(key)
        if key == "inductor":
            return {"wall_seconds": seconds["inductor"][len([c for c in calls if c == "inductor"]) - 1]}
        return {"wall_seconds": 14.0 if "contiguous" in key else 15.0}

    found = compile_time.recheck("m", rows, 1.5, 3, run=run)
    per_block = compile_time.remat_key(rows[2])
    fraction = compile_time.remat_key(rows[1])
    assert per_block == '{"contiguous": true, "memory_budget": 62914560}' and fraction == '{"memory_budget": 0.5}'
    # round by round, the order reversed every other round
    assert calls == ["inductor", fraction, per_block, per_block, fraction, "inductor", "inductor", fraction, per_block]
    assert sorted(found) == ["remat bytes = per-block", "remat fraction 0.5"]
    assert found["remat bytes = per-block"]["ratio"] == pytest.approx(14.0 / 11.0)
    assert found["remat fraction 0.5"]["plain_seconds_all"] == [10.0, 12.0, 11.0]
    assert compile_time.backend_of(per_block) == (
        "remat",
        {"inner": "inductor", "contiguous": True, "memory_budget": 62914560},
    )
    assert compile_time.backend_of("None") == ("remat", {"memory_budget": None, "inner": "inductor"})
    assert compile_time.recheck("m", rows[1:], 1.5, 3, run=run) == {}  # no plain row to hold them to


class _Timed:
    """A row whose steps take the given milliseconds, in order; records when each step ran."""

    def __init__(self, name, times, log):
        self.spec = type("Spec", (), {"name": name, "budget": None})()
        self.times, self.log = list(times), log

    def step(self):
        self.log.append(self.spec.name)
        return self.times.pop(0)


def test_paired_time_alternates_the_rows_and_holds_the_median_per_round_ratio():
    import paired_time
    import pairs

    log = []
    a = _Timed("remat None", [10.0, 12.0, 11.0, 30.0, 10.0], log)
    b = _Timed("inductor", [10.0, 10.0, 10.0, 10.0, 50.0], log)
    result = pairs.pair("m", a, b, rounds=5, limit=1.03)
    # one step of each per round, the order flipped every round
    assert log == ["remat None", "inductor", "inductor", "remat None"] * 2 + ["remat None", "inductor"]
    assert result["ratio"] == pytest.approx(11.0 / 10.0) and result["step_ms"] == 11.0
    low, high = result["round_ratio_quartiles"]
    assert low <= 1.1 <= high
    (line,) = paired_time.verdicts([result])
    assert line.startswith("FAIL: m `remat None` vs `inductor`: 1.100x (limit 1.03x")
    # the machine slows down for the last rounds, one round earlier for `inductor`'s step than for remat's: the
    # medians fall on either side of the change (ratio 0.5), the rounds compare like with like (4 of 5 equal)
    a = _Timed("remat None", [10.0, 10.0, 10.0, 20.0, 20.0], [])
    b = _Timed("inductor", [10.0, 10.0, 20.0, 20.0, 20.0], [])
    result = pairs.pair("m", a, b, rounds=5, limit=1.03)
    assert result["ratio"] == 1.0 and result["ratio_of_medians"] == 0.5


def test_stand_alone_benchmarks_write_json_and_a_page(tmp_path, capsys):
    import json

    import outputs

    meta = outputs.machine(["--models", "m"])
    assert outputs.setup("paired_time.py", meta).startswith("`python benchmarks/paired_time.py --models m` on ")
    out, md = tmp_path / "results" / "r.json", tmp_path / "R.md"
    outputs.write(out, md, {"meta": meta, "rows": [1]}, "Title", "How.", "| a |\n|---|", ["PASS: x", "FAIL: y"])
    assert json.loads(out.read_text())["rows"] == [1]
    assert md.read_text() == "# Title\n\nHow.\n\n| a |\n|---|\n\n- PASS: x\n- FAIL: y\n"
    assert "FAIL: y" in capsys.readouterr().out


def test_cuda_peak_check_measures_each_figure_of_one_row_on_cpu():
    """benchmarks/cuda_peak_check.py runs where CUDA is; on CPU its row has the same fields, the allocator's figure
    left out, and peak_memory's figure is the profiler replay (both read the profiler's events on CPU)."""
    import cuda_peak_check

    row = cuda_peak_check.check("gpt", "per-block", 1, "cpu")
    assert row["row"] == "eager+per-block" and row["allocator_mib"] is None
    assert row["replay_all_mib"] == row["profiler_replay_all_mib"]
    assert 0 < row["replay_mib"] < row["replay_all_mib"] <= row["replay_mib"] + row["grad_mib"]
    assert row["allocations"] >= row["frees"] > 0


def test_runner_re_times_compiles_only_under_inductor_on_cpu(monkeypatch):
    import compile_time
    import run

    args = run.parse_args([])
    assert (args.compile_rounds, args.paired_rounds) == (2, 25)
    assert run.parse_args(["--quick"]).compile_rounds == 0
    assert run.parse_args(["--inner", "aot_eager"]).compile_rounds == 0
    assert run.parse_args(["--loss-outside"]).compile_rounds == 0  # the re-timing compiles the loss with the model
    with pytest.raises(SystemExit):
        run.parse_args(["--loss-outside", "--compile-rounds", "2"])
    with pytest.raises(SystemExit):
        run.parse_args(["--inner", "aot_eager", "--compile-rounds", "2"])

    def fails(model, row, fallback_random=True, one_thread=True):
        raise RuntimeError(f"{model} {row}: exit 1")

    monkeypatch.setattr(compile_time, "run_row", fails)
    measured = [row("inductor", "compiled", 100), remat_row("remat None", 100, 100)]
    run.retime_compiles(run.parse_args(["--compile-rounds", "1"]), "m", measured)
    # a failing re-timing leaves the rows as they were measured, each remat row saying why
    assert "compile_recheck" not in measured[1] and "compile_recheck_error" not in measured[0]
    assert measured[1]["compile_recheck_error"] == "RuntimeError: m inductor: exit 1"

"""Plan reports: table totals equal the Plan's integers, reasons, records, summary, decisions by module."""

import functools
import json
import re

import pytest

import remat
from remat.capture import _clean_path
from remat.config import RematConfig
from remat.explain import capture_joints
from remat.pipeline import plan_joint
from remat.report import totals
from remat.units import fmt_bytes, fmt_flops
from remat.zoo import GPT, GPTConfig, gpt_loss, make_gpt_batch

from graphs import MIB, CosMM, cosmm_input

COS = 2 * MIB * 10  # a 1 MiB pointwise op moves 2 MiB, at cost.FLOPS_PER_BYTE = 10
MM = 2 * 512**3
SUM = (MIB + 4) * 10  # the loss: reads 1 MiB, writes an fp32 scalar
FORWARD = 6 * COS + 5 * MM + SUM  # cos, 5 × (mm, cos), sum
GPT_CONFIG = GPTConfig(vocab=128, n_layer=2, d_model=64, n_head=4, seq_len=32)


@pytest.fixture(scope="module")
def cosmm():
    (captured,) = capture_joints(CosMM(), cosmm_input())
    return captured


@pytest.fixture(scope="module")
def gpt_joints():
    model = GPT(GPT_CONFIG)
    idx, targets = make_gpt_batch(GPT_CONFIG, 2)
    (plain,) = capture_joints(model, idx)
    (loss,) = capture_joints(functools.partial(gpt_loss, model), idx, targets)
    return {"model": plain, "loss": loss}


def plan(captured, **fields):
    """The joints here are captured as aot_eager traces them, so they are planned for that inner compiler."""
    fields.setdefault("inner", "aot_eager")
    return plan_joint(captured.joint, captured.num_fwd_outputs, RematConfig(**fields)).plan


# budget MiB (plus slack for the loss scalar) → saved MiB, recomputed cos, recomputed mm (tests/test_plan_exact.py)
SWEEP = [(None, 10, 0, 0), (11, 10, 0, 0), (9, 8, 2, 0), (6, 5, 5, 0), (5, 4, 5, 1)]


@pytest.mark.parametrize("budget,saved,cos,mm", SWEEP)
def test_table_totals_are_the_plans_integers(cosmm, budget, saved, cos, mm):
    p = plan(cosmm, memory_budget=None if budget is None else budget * MIB + 16)
    t = totals(p.decisions)
    assert t.saved_bytes == p.saved_bytes == saved * MIB
    assert t.recompute_flops == p.recompute_flops == cos * COS + mm * MM
    assert (t.saved, t.recomputed_ops) == (saved, cos + mm)
    text = p.table()
    assert len(text.splitlines()) == 1 + len(p.decisions) + 2  # header, one row per decision, two totals lines
    assert f"save {saved} values, {saved}.0 MiB ({saved * MIB} bytes; baseline 10.0 MiB)" in text
    assert f"recompute {cos + mm} ops, {fmt_flops(p.recompute_flops)} ({p.recompute_flops} flops" in text
    assert f"peak {fmt_bytes(p.peak_bytes)} ({p.peak_bytes} bytes;" in text
    assert "note:" not in text


def test_table_max_rows_keeps_the_totals(cosmm):
    p = plan(cosmm, memory_budget=5 * MIB + 16)
    full, short = p.table().splitlines(), p.table(max_rows=3).splitlines()
    assert short[:4] == full[:4]
    assert short[4] == f"... {len(p.decisions) - 3} more rows (totals below count them)"
    assert short[-2:] == full[-2:]


def test_table_columns(cosmm):
    p = plan(cosmm, memory_budget=5 * MIB + 16)
    head, first = p.table().splitlines()[:2]
    assert head.split() == ["node", "op", "module", "shape", "dtype", "bytes", "recompute", "cost", "action", "reason"]
    assert first.split()[:10] == [
        "cos",
        "aten.cos.default",
        "(top",
        "level)",
        "512x512",
        "float32",
        "1.0",
        "MiB",
        "21.0",
        "MFLOP",
    ]


def test_table_module_column_is_each_decisions_module_path(gpt_joints):
    """The module column holds the path module_table groups by, row by row, aligned under its header."""
    p = plan(gpt_joints["loss"], memory_budget=0.3)
    lines = p.table().splitlines()
    head, rows = lines[0], lines[1 : 1 + len(p.decisions)]
    start = head.index("module")
    end = head.index("shape")
    column = [row[start:end].strip() for row in rows]
    assert column == [d.module_path or "(top level)" for d in p.decisions]
    assert "blocks.0.attn" in column and "blocks.1.mlp.1" in column and "(top level)" in column
    softmax = [c for c, d in zip(column, p.decisions) if d.op == "aten._softmax.default"]
    assert softmax == ["blocks.0.attn", "blocks.1.attn"]


@pytest.mark.parametrize(
    "fields",
    [
        {"memory_budget": None},
        {"memory_budget": 0.3},
        {"memory_budget": 0.0, "solver": "greedy"},
        {"memory_budget": 0.5, "save_ops": ["aten.addmm"]},
    ],
)
@pytest.mark.parametrize("kind", ["model", "loss"])
def test_gpt_totals_and_reasons(gpt_joints, kind, fields):
    p = plan(gpt_joints[kind], **fields)
    t = totals(p.decisions)
    assert (t.saved_bytes, t.recompute_flops) == (p.saved_bytes, p.recompute_flops)
    assert p.decisions and all(d.reason.strip() for d in p.decisions)


@pytest.mark.parametrize("budget", [None, 11, 8, 5])
def test_every_decision_has_a_reason(cosmm, budget):
    p = plan(cosmm, memory_budget=None if budget is None else budget * MIB + 16)
    assert p.decisions and all(d.reason.strip() for d in p.decisions)


def test_records_are_plain_and_match_the_decisions(cosmm):
    p = plan(cosmm, memory_budget=5 * MIB + 16)
    records = p.to_records()
    assert len(records) == len(p.decisions)
    assert json.loads(json.dumps(records)) == records  # plain python values only
    first, d = records[0], p.decisions[0]
    assert first == {
        "node": d.name,
        "op": "aten.cos.default",
        "module_path": "",
        "shape": [512, 512],
        "dtype": "float32",
        "bytes": MIB,
        "kept_bytes": 0,
        "recompute_flops": COS,
        "action": "recompute",
        "reason": d.reason,
    }
    assert sum(r["bytes"] for r in records if r["action"] == "save") == p.saved_bytes
    assert sum(r["kept_bytes"] for r in records) == p.saved_bytes


def test_forward_flops_is_the_forward_module(cosmm):
    assert plan(cosmm, memory_budget=None).forward_flops == FORWARD
    assert plan(cosmm, memory_budget=5 * MIB + 16).forward_flops == FORWARD


def test_summary_in_words(cosmm):
    p = plan(cosmm, memory_budget=5 * MIB + 16)
    text = p.summary()
    assert text.startswith("saves 4.0 MiB of 10.0 MiB; recomputes 5 pointwise ops and 1 mm ")
    assert f"({fmt_flops(5 * COS + MM)}, +{100 * (5 * COS + MM) / FORWARD:.1f}% of forward flops)" in text
    assert "peak 5.0 MiB of budget 5.0 MiB (baseline peak 11.0 MiB)" in text
    none = plan(cosmm, memory_budget=None).summary()
    assert none.startswith("no memory_budget: the aot_eager min-cut partition: saves 10.0 MiB of 10.0 MiB")
    assert "recomputes nothing" in none


def test_summary_says_when_the_budget_cannot_be_met(cosmm):
    with pytest.warns(UserWarning, match="cannot be met"):
        p = plan(cosmm, memory_budget=MIB)
    assert not p.feasible
    assert p.summary().endswith(f"the least reachable peak is {fmt_bytes(p.least_peak_bytes)}")


def test_clean_path_strips_dynamo_sources():
    assert _clean_path("L['self'].blocks.0.attn") == "blocks.0.attn"
    assert _clean_path("L['fn'].args[0].blocks.1.mlp.0") == "blocks.1.mlp.0"  # functools.partial(loss, model)
    assert _clean_path("L['fn'].args[0]") == ""  # the model itself
    assert _clean_path("L['model'].head") == "head"  # model passed as an argument
    assert _clean_path("G['model'].ln_f") == "ln_f"  # a global
    assert _clean_path("L['s'].model.blocks.0") == "model.blocks.0"  # a wrapper module whose self is named s
    assert _clean_path("L['self']._modules['blocks']._modules['0']") == "blocks.0"


@pytest.mark.parametrize("kind", ["model", "loss"])
def test_decisions_grouped_by_layer(gpt_joints, kind):
    p = plan(gpt_joints[kind], memory_budget=0.3)
    groups = p.by_module(depth=3)
    layers = [f"blocks.{i}.{part}" for i in range(2) for part in ("attn", "mlp")]
    assert all(layer in groups for layer in layers)
    keys = list(groups)
    assert keys.index("blocks.0.attn") < keys.index("blocks.0.mlp") < keys.index("blocks.1.attn")
    assert keys.index("blocks.1.attn") < keys.index("blocks.1.mlp")
    for i in range(2):
        attn, mlp = groups[f"blocks.{i}.attn"], groups[f"blocks.{i}.mlp"]
        assert [d.op for d in attn].count("aten._softmax.default") == 1
        assert [d.op for d in attn].count("aten.bmm.default") in (0, 1, 2)
        addmm = [d.module_path for d in attn if d.op == "aten.addmm.default"]
        assert addmm and set(addmm) <= {f"blocks.{i}.attn.qkv", f"blocks.{i}.attn.proj"}
        assert [d.module_path for d in mlp if d.op == "aten.gelu.default"] == [f"blocks.{i}.mlp.1"]
        assert all(d.module_path.startswith(f"blocks.{i}.attn") for d in attn)
    # every softmax and gelu of the graph is under its block, nothing is left ungrouped or under a dynamo source
    softmax = [d.module_path for d in p.decisions if d.op == "aten._softmax.default"]
    assert softmax == ["blocks.0.attn", "blocks.1.attn"]
    assert not any("[" in d.module_path or d.module_path.startswith(("L.", "G.")) for d in p.decisions)
    grouped = [d.name for ds in p.by_module().values() for d in ds]
    assert sorted(grouped) == sorted(d.name for d in p.decisions) and len(grouped) == len(set(grouped))


def test_module_table_lines(gpt_joints):
    p = plan(gpt_joints["loss"], memory_budget=0.3)
    lines = p.module_table(depth=3).splitlines()
    for layer in ("blocks.0.attn", "blocks.1.attn", "blocks.0.mlp", "blocks.1.mlp"):
        (line,) = [ln for ln in lines if ln.startswith(layer + ": ")]
        group = p.by_module(depth=3)[layer]
        if any(d.action is remat.Action.RECOMPUTE and d.cost > 0 for d in group):
            assert ": recompute " in line
        if any(d.action is remat.Action.SAVE and d.nbytes > 0 for d in group):
            assert "save " in line
    assert any(ln.startswith("(top level): ") for ln in lines)  # the loss runs outside any module
    softmax = [ln.split(":")[0] for ln in lines if re.search(r"[ ,]softmax(,|;| x|$)", ln)]
    assert softmax == ["blocks.0.attn", "blocks.1.attn"]  # saved or recomputed, softmax is named under its layer


def test_module_table_on_the_exact_graph(cosmm):
    assert plan(cosmm, memory_budget=5 * MIB + 16).module_table() == "(top level): recompute cos x5, mm; save mm x4"


def test_formatting_units():
    assert [fmt_bytes(b) for b in (0, 512, 4096, 41 * MIB, 5 * 2**30 // 2)] == [
        "0 B",
        "512 B",
        "4.0 KiB",
        "41.0 MiB",
        "2.5 GiB",
    ]
    assert [fmt_flops(f) for f in (12, 2560, 14_276_608, 1.5e9)] == ["12 FLOP", "2.6 KFLOP", "14.3 MFLOP", "1.5 GFLOP"]

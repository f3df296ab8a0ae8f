"""What remat decided, told without code: the summary on the `remat` logger, the plan in torch's structured trace."""

import json
import logging
import os
import subprocess
import sys
import textwrap

import torch

import remat
from remat import _torch, logs

from graphs import MIB, CosMM, cosmm_input

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def compile_and_step(**options):
    compiled = torch.compile(CosMM(), backend="remat", options={"inner": "aot_eager", **options})
    compiled(cosmm_input()).backward()
    return remat.last_plan()


def test_each_plan_summary_is_logged_at_info(caplog):
    with caplog.at_level(logging.INFO, logger="remat"):
        plan = compile_and_step(memory_budget=7 * MIB + 16)
    lines = [r for r in caplog.records if r.name == "remat" and r.levelno == logging.INFO]
    assert len(lines) == 1
    message = lines[0].getMessage()
    assert message.endswith(plan.summary()) and "\n" not in message
    assert message.startswith("plan [0/0]: ")  # the compile id torch's logs and tlparse use


def test_nothing_is_logged_below_the_level_set(caplog):
    with caplog.at_level(logging.WARNING, logger="remat"):
        compile_and_step(memory_budget=7 * MIB + 16)
    assert not [r for r in caplog.records if r.name == "remat"]


def test_the_full_plan_goes_to_the_structured_trace(monkeypatch):
    emitted = []
    monkeypatch.setattr(_torch, "trace_artifact", lambda name, payload_fn: emitted.append((name, payload_fn())))
    plan = compile_and_step(memory_budget=7 * MIB + 16)
    [(name, payload)] = emitted
    assert name == "remat_plan"
    payload = json.loads(payload)
    assert payload["decisions"] == plan.to_records()
    assert payload["summary"] == plan.summary() and payload["compile_id"] == "0/0"
    assert (payload["budget_bytes"], payload["peak_bytes"], payload["saved_bytes"]) == (
        plan.budget_bytes,
        plan.peak_bytes,
        plan.saved_bytes,
    )
    assert payload["baseline"]["peak_bytes"] == plan.baseline.peak_bytes


def test_the_payload_is_left_to_torch_to_build(monkeypatch):
    """The plan's JSON is built by the callable handed to torch, which calls it only while a trace is being written
    (TORCH_TRACE): logging costs nothing for a large plan otherwise."""
    built, handed = [], []
    real = logs.plan_payload
    monkeypatch.setattr(logs, "plan_payload", lambda *a: built.append(1) or real(*a))
    monkeypatch.setattr(_torch, "trace_artifact", lambda name, payload_fn: handed.append(payload_fn))
    compile_and_step(memory_budget=7 * MIB + 16)
    assert len(handed) == 1 and built == []
    assert json.loads(handed[0]())["summary"] == remat.last_plan().summary() and built == [1]


TRACE_SCRIPT = textwrap.dedent("""
    import torch
    weights = [torch.randn(64, 64, requires_grad=True) for _ in range(3)]
    def f(x):
        for w in weights:
            x = torch.cos(x @ w)
        return x.sum()
    compiled = torch.compile(f, backend="remat", options={"memory_budget": 0.0, "inner": "aot_eager"})
    compiled(torch.randn(64, 64)).backward()
""")


def test_torch_trace_holds_the_remat_plan_artifact(tmp_path):
    env = {**os.environ, "TORCH_TRACE": str(tmp_path), "PYTHONPATH": REPO}
    subprocess.run([sys.executable, "-c", TRACE_SCRIPT], check=True, env=env, cwd=tmp_path)
    lines = [line for path in tmp_path.glob("*.log") for line in path.read_text().splitlines()]
    heads = [i for i, line in enumerate(lines) if '"name": "remat_plan"' in line]
    assert len(heads) == 1, "one graph compiled: one remat_plan artifact"
    head = json.loads(lines[heads[0]][lines[heads[0]].index("{") :])
    assert head["artifact"] == {"name": "remat_plan", "encoding": "json"}
    assert (head["frame_id"], head["frame_compile_id"]) == (0, 0)
    # The payload follows its header, one tab-indented line each (tlparse's format).
    payload = []
    for line in lines[heads[0] + 1 :]:
        if not line.startswith("\t"):
            break
        payload.append(line[1:])
    plan = json.loads("\n".join(payload))
    assert plan["decisions"] and plan["summary"].startswith("saves ")
    assert plan["peak_bytes"] <= plan["baseline"]["peak_bytes"]

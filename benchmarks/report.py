"""Benchmark results as JSON (rows + metadata) and as a markdown table."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

MiB = 2**20

COLUMNS = ("model", "row", "budget MiB", "saved MiB", "sim peak MiB", "measured peak MiB", "step ms",
           "step time vs eager", "max grad diff")

LEGEND = """\
- **budget MiB**: the row's memory budget; torch rows and remat fraction rows show the fraction they were given.
  `remat bytes = torch b` uses the measured peak of `torch budget b` (same run) as its budget in bytes.
- **saved MiB**: unique storages autograd saves for backward in one forward (saved_tensors_hooks), parameters,
  buffers and inputs left out; the same method for every row. Checkpoint wrappers keep their block inputs outside
  autograd, so those are not counted. For remat rows `(plan ...)` is the plan's own `saved_bytes`.
- **sim peak MiB**: the remat plan's simulated peak activation memory (`plan.peak_bytes`).
- **measured peak MiB**: `remat.peak_memory` of one forward+loss+backward, parameter gradients excluded.
- **step ms**: median forward+loss+backward time after warm-up; **vs eager**: ratio to the eager row of the model.
- **max grad diff**: max abs difference of any parameter gradient to eager with the same seed;
  `rel` is the worst per-parameter `||g - g_eager|| / ||g_eager||`."""


def with_ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """New row dicts with ``step_vs_eager``: step_ms over the eager row of the same model (None without one)."""
    eager_ms = {r["model"]: r["step_ms"] for r in rows if r["row"] == "eager" and "step_ms" in r}
    out = []
    for r in rows:
        base = eager_ms.get(r["model"])
        ratio = r["step_ms"] / base if base and "step_ms" in r else None
        out.append({**r, "step_vs_eager": ratio})
    return out


def write(json_path: Path, rows: list[dict[str, Any]], meta: dict[str, Any]) -> Path:
    """Write ``json_path`` and the markdown table next to it (same name, ``.md``); returns the markdown path."""
    json_path.parent.mkdir(parents=True, exist_ok=True)
    document = _finite({"meta": meta, "rows": rows})
    json_path.write_text(json.dumps(document, indent=2, default=str, allow_nan=False) + "\n")
    md_path = json_path.with_suffix(".md")
    md_path.write_text(markdown(rows, meta))
    return md_path


def _finite(value: Any) -> Any:
    """A copy with non-finite floats as strings ("inf"), which strict JSON cannot hold."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def markdown(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    """The results table with a short header (date, torch, machine, workloads) and a legend."""
    lines = [
        f"# remat benchmark ({meta['date']})",
        "",
        f"torch {meta['torch']}, {meta['machine']['cpu']} ({meta['machine']['torch_threads']} threads), "
        f"inner compiler `{meta['inner']}`, {meta['steps']} timed steps after {meta['warmup']} warm-up"
        f"{', quick' if meta['quick'] else ''}{', inductor fallback_random' if meta['fallback_random'] else ''}.",
        "",
        *[f"- {name}: {shape}" for name, shape in meta["workloads"].items()],
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "|".join("---" if c in ("model", "row") else "---:" for c in COLUMNS) + "|",
    ]
    lines += ["| " + " | ".join(_cells(r)) + " |" for r in rows]
    lines += ["", LEGEND, ""]
    return "\n".join(lines)


def _cells(r: dict[str, Any]) -> list[str]:
    if "error" in r:
        return [r["model"], r["row"], _budget(r), f"error: {r['error'][:120]}", "", "", "", "", ""]
    saved = _mib(r.get("saved_bytes"))
    if r.get("plan_saved_bytes") is not None:
        saved += f" (plan {_mib(r['plan_saved_bytes'])})"
    ratio = r.get("step_vs_eager")
    return [
        r["model"],
        r["row"],
        _budget(r),
        saved,
        _mib(r.get("plan_peak_bytes")),
        _mib(r.get("measured_peak_bytes")),
        f"{r['step_ms']:.1f}",
        f"{ratio:.2f}x" if ratio is not None else "-",
        _grad(r["max_grad_diff"], r["max_grad_rel_err"]),
    ]


def _budget(r: dict[str, Any]) -> str:
    budget, kind = r.get("budget"), r.get("budget_kind")
    if budget is None:
        return "-"
    if kind == "bytes":
        return _mib(budget)
    return f"{budget} (fraction)"


def _mib(nbytes: int | None) -> str:
    return "-" if nbytes is None else f"{nbytes / MiB:.1f}"


def _grad(abs_diff: float, rel_err: float) -> str:
    if abs_diff == 0.0:
        return "0"
    return f"{abs_diff:.1e} (rel {rel_err:.2f})"

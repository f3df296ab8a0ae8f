"""Benchmark results as JSON, markdown tables, the Pareto figure and ``benchmarks/REPORT.md``.

``benchmarks/run.py`` calls ``write`` after measuring. Everything but the JSON can be rebuilt from a saved JSON:

    python benchmarks/report.py                                   # every committed run: both inner compilers
    python benchmarks/report.py benchmarks/results/latest.json    # inductor: benchmarks/REPORT.md
    python benchmarks/report.py benchmarks/results/aot_eager.json # aot_eager: benchmarks/REPORT-aot_eager.md
    python benchmarks/report.py RESULTS.json [--report PATH] [--headline]

Each inner compiler's run has its own JSON (``default_json``), so one never overwrites the other. The files derived
from ``<stem>.json`` carry its stem, except for ``latest.json`` (the inductor run), whose files keep their plain
names: ``<stem>.md`` (the flat table), ``<stem>-headline.md``, ``<stem>-pareto.png`` next to the JSON, and the full
report ``REPORT-<stem>.md`` (``derived``, ``default_report_path``).
``--headline`` also prints the headline table (the snippet README.md shows) to stdout.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]  # the checkout's remat, and the sibling modules, when run as a script

import checks  # noqa: E402
import figure  # noqa: E402
import tables  # noqa: E402

LEGEND = """\
- **budget**: torch rows: the `activation_memory_budget` fraction they were given; remat fraction rows: the fraction
  and the budget in bytes the plan resolved it to; `remat bytes = torch b` uses the measured peak of
  `torch budget b` (same run) as its budget in bytes.
- **saved MiB**: unique storages autograd saves for backward in one forward + loss (saved_tensors_hooks),
  parameters, buffers and inputs left out; the same method for every row. Checkpoint wrappers keep their block
  inputs outside autograd, so those are not counted. For remat rows `(plan ...)` is the plan's own `saved_bytes`,
  which covers the compiled graph only: model + loss by default, the model alone with `--loss-outside`.
- **sim peak MiB**: the remat plan's simulated peak activation memory (`plan.peak_bytes`).
- **measured peak MiB**: `remat.peak_memory` of one forward+loss+backward, parameter gradients excluded;
  **peak / budget**: measured peak over the remat row's budget in bytes.
- **step ms**: median forward+loss+backward time after warm-up; **vs eager** / **vs compiled**: ratio to the eager
  row / the plain compiled row of the model. **compile s**: the first step, compilation included. Each row is
  timed in a stretch of its own; the step-time checks below read, where the run took them, the pairs' timings in
  alternation instead (`remat None` with the plain compiled row, `remat bytes = <recipe>` with that recipe's row:
  rebuilt after the model's rows and stepped by turns, so load drifting on the machine slows both alike; the
  ratio held is the median of the per-round ratios; pairs.py).
- **max grad diff**: max abs difference of any parameter gradient to eager with the same seed;
  `rel` is the worst per-parameter `||g - g_eager|| / ||g_eager||`."""


def with_ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """New row dicts with ``step_vs_eager`` and ``step_vs_compiled``: step_ms over the eager row / the plain compiled
    row of the same model (None without one)."""
    eager_ms = {r["model"]: r["step_ms"] for r in rows if r["row"] == "eager" and "step_ms" in r}
    compiled_ms = {r["model"]: r["step_ms"] for r in rows if r["kind"] == "compiled" and "step_ms" in r}
    out = []
    for r in rows:
        ratios = {}
        for key, base in (("step_vs_eager", eager_ms), ("step_vs_compiled", compiled_ms)):
            ref = base.get(r["model"])
            ratios[key] = r["step_ms"] / ref if ref and "step_ms" in r else None
        out.append({**r, **ratios})
    return out


def write(json_path: Path, rows: list[dict[str, Any]], meta: dict[str, Any], report_path: Path | None = None) -> Path:
    """Write ``json_path``, then everything derived from it (``render``); returns the markdown table's path."""
    json_path.parent.mkdir(parents=True, exist_ok=True)
    document = _finite({"meta": meta, "rows": rows})
    json_path.write_text(json.dumps(document, indent=2, default=str, allow_nan=False) + "\n")
    return render(json_path, rows, meta, report_path)


def render(json_path: Path, rows: list[dict[str, Any]], meta: dict[str, Any], report_path: Path | None = None) -> Path:
    """Next to ``json_path``: the flat table (same name, ``.md``), the headline snippet and the figure (named by
    ``derived``); and the full report at ``report_path`` (default: ``default_report_path``). Returns the flat
    table's path."""
    md_path = json_path.with_suffix(".md")
    md_path.write_text(markdown(rows, meta))
    report_path = report_path or default_report_path(json_path)
    derived(json_path, "headline.md").write_text(headline(rows, meta, _link(report_path)))
    png = figure.write_pareto(derived(json_path, "pareto.png"), rows, meta)
    report_path.write_text(
        full_report(rows, meta, _relative(json_path, report_path), png and _relative(png, report_path))
    )
    return md_path


def _relative(path: Path, report_path: Path) -> Path:
    return Path(os.path.relpath(path.resolve(), report_path.resolve().parent))


def _finite(value: Any) -> Any:
    """A copy with non-finite floats as strings ("inf"), which strict JSON cannot hold."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _number(value: Any) -> Any:
    """Inverse of ``_finite`` for the fields that hold floats."""
    return float(value) if isinstance(value, str) and value in ("inf", "-inf", "nan") else value


def load(json_path: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    document = json.loads(json_path.read_text())
    rows = [{k: _number(v) for k, v in r.items()} for r in document["rows"]]
    return rows, document["meta"]


def _setup(meta: dict[str, Any]) -> str:
    machine = meta["machine"]
    return (
        f"torch {meta['torch']}, Python {meta.get('python', '?')}, {machine['cpu']} ({machine['cpu_count']} cores"
        f"{', ' + machine['cuda'] if machine.get('cuda') else ''}), {machine['torch_threads']} torch threads, "
        f"models on {meta.get('device', 'cpu')}, inner compiler `{meta['inner']}`, "
        f"{meta['steps']} timed steps after {meta['warmup']} warm-up"
        f"{', quick' if meta['quick'] else ''}{', inductor fallback_random' if meta['fallback_random'] else ''}, "
        f"loss {'compiled with the model' if meta['loss_compiled'] else 'computed eagerly outside the graph'}."
    )


def markdown(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    """The flat results table with a short header (date, torch, machine, workloads) and a legend."""
    lines = [
        f"# remat benchmark ({meta['date']})",
        "",
        _setup(meta),
        "",
        *[f"- {name}: {shape}" for name, shape in meta["workloads"].items()],
        "",
        *tables.table(tables.COLUMNS, [tables.cells(r) for r in rows]),
        "",
        LEGEND,
        "",
    ]
    return "\n".join(lines)


def headline(rows: list[dict[str, Any]], meta: dict[str, Any], report_link: str = "benchmarks/REPORT.md") -> str:
    """The snippet README.md shows: the headline table and one line saying where and how it was measured;
    ``report_link``: the full report's path from the repository root."""
    return "\n".join(
        [
            *tables.headline_table(rows),
            "",
            f"Measured with `{_command(meta)}`: {_setup(meta)} "
            f"Full tables, checks and the Pareto figure: [{report_link}]({report_link}).",
            "",
        ]
    )


def full_report(rows: list[dict[str, Any]], meta: dict[str, Any], json_path: Path, png: Path | None) -> str:
    """benchmarks/REPORT.md: set-up and command, headline table, computed findings, Pareto figure, full tables."""
    findings = checks.all_findings(
        rows, meta["inner"], meta.get("fresh_compile_cache", False), meta.get("compiler_warmed_up", False)
    )
    mark = {True: "✅ ", False: "❌ ", None: ""}
    lines = [
        f"# remat benchmark report: inner compiler `{meta['inner']}`",
        "",
        f"Generated by `benchmarks/run.py` on {meta['date']}"
        f"{' at commit ' + meta['git_commit'][:12] if meta.get('git_commit') else ''}; do not edit by hand — every "
        f"number and every statement below is computed from [{json_path.as_posix()}]({json_path.as_posix()}).",
        "",
        f"- command: `{_command(meta)}`",
        f"- set-up: {_setup(meta)}",
        f"- platform: {meta['machine']['platform']}",
        *[f"- {name}: {shape}" for name, shape in meta["workloads"].items()],
        "",
        "remat is compared, in one process and on the same inputs, with eager PyTorch, eager with per-block "
        "`torch.utils.checkpoint`, the plain compile and torch's own `activation_memory_budget` sweep.",
        "",
        "## Headline",
        "",
        *tables.headline_table(rows),
        "",
        "## What this shows",
        "",
        *[f"- {mark[f.ok]}{f.text}" for f in findings],
        "",
    ]
    if png is not None:
        lines += [
            "## Peak memory vs step time",
            "",
            f"![measured peak vs step time]({png.as_posix()})",
            "",
            f"Per model: measured peak (MiB) against step time divided by the plain `{meta['inner']}` row's. remat's "
            "fraction rows form the line (annotated with their fraction); torch's `activation_memory_budget` rows "
            "are the black squares; the other rows are the markers named in each legend.",
            "",
        ]
    lines += tables.solver_section(meta.get("solvers") or {})
    lines += ["## Full tables", ""]
    for model, shape in meta["workloads"].items():
        lines += [
            f"### {model}",
            "",
            shape,
            "",
            *tables.table(tables.FULL_COLUMNS, [tables.full_cells(r) for r in rows if r["model"] == model]),
            "",
        ]
    lines += [LEGEND, ""]
    return "\n".join(lines)


def _command(meta: dict[str, Any]) -> str:
    return meta.get("command") or "python benchmarks/run.py"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Rebuild the tables, the figure and REPORT.md from saved JSON.")
    parser.add_argument(
        "json",
        nargs="*",
        type=Path,
        help="results to rebuild from (default: every one of "
        + ", ".join(str(default_json(inner).relative_to(HERE.parent)) for inner in INNERS)
        + " that exists)",
    )
    parser.add_argument(
        "--report",
        type=Path,
        default=None,
        help="where the full report goes, with one JSON only (default: default_report_path: "
        "benchmarks/REPORT.md for results/latest.json, benchmarks/REPORT-<stem>.md for "
        "results/<stem>.json, else next to the JSON)",
    )
    parser.add_argument("--headline", action="store_true", help="print the headline snippet to stdout")
    args = parser.parse_args(argv)
    paths = args.json or [p for p in map(default_json, INNERS) if p.exists()]
    if not paths:
        parser.error("no results to rebuild from")
    if args.report is not None and len(paths) > 1:
        parser.error("--report takes one JSON")
    for path in paths:
        rows, meta = load(path)
        rows = with_ratios(rows)
        render(path, rows, meta, args.report or default_report_path(path))
        if args.headline:
            print(headline(rows, meta, _link(args.report or default_report_path(path))))
    return 0


INNERS = ("inductor", "aot_eager")


def default_json(inner: str) -> Path:
    """Where a run with this inner compiler writes by default: benchmarks/results/latest.json for inductor,
    benchmarks/results/<inner>.json for any other."""
    return HERE / "results" / ("latest.json" if inner == "inductor" else f"{inner}.json")


def derived(json_path: Path, name: str) -> Path:
    """A file derived from ``json_path``, next to it: ``name`` for ``latest.json``, ``<stem>-<name>`` otherwise."""
    return json_path.parent / (name if json_path.stem == "latest" else f"{json_path.stem}-{name}")


def default_report_path(json_path: Path) -> Path:
    """For results in benchmarks/results/: benchmarks/REPORT.md (``latest.json``) or benchmarks/REPORT-<stem>.md;
    for results elsewhere (a scratch run), the same name next to the JSON."""
    name = "REPORT.md" if json_path.stem == "latest" else f"REPORT-{json_path.stem}.md"
    if json_path.resolve().parent == (HERE / "results").resolve():
        return HERE / name
    return json_path.parent / name


def _link(report_path: Path) -> str:
    """The report's path from the repository root (README.md's links), or as given when outside it."""
    try:
        return report_path.resolve().relative_to(HERE.parent.resolve()).as_posix()
    except ValueError:
        return report_path.as_posix()


if __name__ == "__main__":
    sys.exit(main())

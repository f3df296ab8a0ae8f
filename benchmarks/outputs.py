"""What the stand-alone timing benchmarks (compile_time.py, paired_time.py) write: a JSON of the run and a markdown
page — a title, a sentence on how the figures were taken, the table, one verdict line per check."""

from __future__ import annotations

import datetime
import json
import os
import platform
from pathlib import Path
from typing import Any


def machine(argv: list[str]) -> dict[str, Any]:
    """When and where the run was taken: date, torch and Python versions, CPUs, load average at the end."""
    import torch

    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "load_average": os.getloadavg()[0],
        "argv": argv,
    }


def setup(script: str, meta: dict[str, Any]) -> str:
    """`python benchmarks/<script> <argv>` on <date> (versions, CPUs, load average): the page's opening words."""
    return (
        f"`python benchmarks/{script} {' '.join(meta['argv'])}` on {meta['date']} (torch {meta['torch']}, "
        f"Python {meta['python']}, {meta['cpus']} CPUs, load average {meta['load_average']:.1f} at the end)."
    )


def write(out: Path, md: Path, payload: dict[str, Any], title: str, intro: str, table: str, lines: list[str]) -> None:
    """`payload` (meta, results and verdicts) as JSON to `out`; the page to `md`; the table and verdicts printed."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=2) + "\n")
    md.write_text("\n".join([f"# {title}", "", intro, "", table, "", *[f"- {line}" for line in lines], ""]))
    print(table)
    print("\n".join(lines))

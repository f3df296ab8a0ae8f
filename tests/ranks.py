"""Two (or more) gloo ranks for a test: spawned processes that meet through a file store, each writing its results
as JSON into the test's folder."""

from __future__ import annotations

import contextlib
import datetime
import faulthandler
import json
import os
import pathlib
import re
import shutil
import signal
import sys
import tempfile
import time
import uuid

import pytest
import torch.multiprocessing as mp

# Every test process group waits this long for its peers, then fails with a traceback (a rank stuck in a collective
# would otherwise hang the suite). Minutes: a compile on two busy cores can keep one rank from a collective its peer
# is already in for a while.
TIMEOUT = datetime.timedelta(minutes=6)
# The most a spawn of ranks may take, set-up and every scenario included (the slowest, test_tensor_parallel's, takes
# about 2.5 minutes on two busy cores). A rank still running then is stuck outside any collective (at exit, in a
# compile): its threads' tracebacks are printed, every rank is killed and the test fails, instead of the test
# waiting on it for ever.
DEADLINE_S = 8 * 60
# Ranks still running this long print their tracebacks once and go on: where a slow or stuck rank was, shown with
# the failure if the spawn then fails.
REPORT_S = 3 * 60


def _rank(rank: int, stacks: str, worker, *args) -> None:
    # the parent asks for tracebacks (at the report and the deadline); they go to a file of this rank's, which the
    # parent prints and condenses into the failure message (CI logs keep a test's message, not always its stderr)
    global _stacks
    _stacks = open(os.path.join(stacks, f"rank{rank}.txt"), "w")  # noqa: SIM115 - open for the process's life
    faulthandler.register(signal.SIGUSR1, file=_stacks, all_threads=True)
    worker(rank, *args)
    # A rank that returned has written its results; it leaves without the interpreter's teardown. There, a gloo group
    # still referenced (by a compiled module's caches, say) is freed while Python shuts down, and a worker thread of
    # the group refused the interpreter lock ends the process with std::terminate (SIGABRT): now and then, and
    # nothing to do with what the test checks. The marker lets a failure say whether a dead rank had returned.
    faulthandler.unregister(signal.SIGUSR1)
    _stacks.close()
    open(os.path.join(stacks, f"rank{rank}.returned"), "w").close()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


_stacks = None  # a rank's open tracebacks file
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository


def run(worker, *args, world: int = 2, deadline_s: float = DEADLINE_S, report_s: float = REPORT_S) -> list[str]:
    """`worker(rank, *args)` on `world` spawned processes; returns once every one has exited cleanly. A rank that
    raises or dies fails the test with torch's message (the exception's traceback, or the signal) and the ranks that
    had returned from `worker` (a rank that returned leaves at once, without the interpreter's teardown); ranks
    still running after `report_s` print their tracebacks and go on; ranks still running after `deadline_s` have
    their tracebacks printed and are killed, and the test fails naming them. Returns the report's condensed
    tracebacks (empty when every rank ended before `report_s`), for a caller's own assertion messages; a failure
    here carries them."""
    stacks = tempfile.mkdtemp(prefix="ranks-")
    context = mp.start_processes(_rank, args=(stacks, worker, *args), nprocs=world, join=False, start_method="spawn")
    start = time.monotonic()
    end = start + deadline_s
    report = start + report_s if report_s < deadline_s else None  # None once reported, or when the deadline is first
    reported: list[str] = []
    try:
        while not context.join(timeout=max(1.0, min(report or end, end) - time.monotonic())):
            now = time.monotonic()
            if report is not None and now >= report:
                reported = _dump(context, world, stacks, f"still running after {report_s:.0f} s (going on)")[1]
                report = None
            if now < end:
                continue
            stuck, condensed = _dump(context, world, stacks, f"still running after {deadline_s:.0f} s")
            for process in context.processes:
                if process.is_alive():
                    process.kill()
                process.join(10)
            pytest.fail(
                "\n".join(
                    [f"ranks {stuck} of {world} still running after {deadline_s:.0f} s; killed", *reported, *condensed]
                ),
                pytrace=False,
            )
    except (mp.ProcessRaisedException, mp.ProcessExitedException) as error:
        returned = [r for r in range(world) if os.path.exists(os.path.join(stacks, f"rank{r}.returned"))]
        pytest.fail(
            "\n".join([f"{error} (ranks that had returned from the worker: {returned})", *reported]), pytrace=False
        )
    finally:
        shutil.rmtree(stacks, ignore_errors=True)
    return reported


def _dump(context, world: int, stacks: str, what: str) -> tuple[list[int], list[str]]:
    """(the live ranks, their tracebacks condensed), each rank having printed its threads' tracebacks after a line
    naming it and `what`: one at a time, as ranks dumping together would interleave their lines."""
    live = [rank for rank, process in enumerate(context.processes) if process.is_alive()]
    condensed = []
    for rank in live:
        path = os.path.join(stacks, f"rank{rank}.txt")
        before = os.path.getsize(path) if os.path.exists(path) else 0
        with contextlib.suppress(ProcessLookupError):
            os.kill(context.processes[rank].pid, signal.SIGUSR1)
        time.sleep(2)  # it writes its tracebacks
        text = ""
        if os.path.exists(path):
            with open(path) as f:
                f.seek(before)
                text = f.read()
        print(f"rank {rank} of {world}, {what}:\n{text}", file=sys.stderr, flush=True)
        condensed.append(f"rank {rank}, {what}:\n{_condense(text)}")
    return live, condensed


def _condense(text: str, frames: int = 10) -> str:
    """faulthandler's tracebacks, each thread's innermost `frames` frames, paths from the package folder on."""
    lines, kept = [], 0
    for line in text.splitlines():
        if not line.startswith("  File "):
            lines.append(line)
            kept = 0
        elif kept < frames:
            line = line.replace(f'File "{_ROOT}{os.sep}', 'File "')
            lines.append(re.sub(r'File "[^"]*?(?:site-packages|python3\.\d+)/', 'File "', line))
            kept += 1
    return "\n".join(lines) if lines else "  (no traceback written)"


def spawn(worker, out, *args, world: int = 2, deadline_s: float = DEADLINE_S) -> list:
    """Run `worker(rank, world, init_method, out, *args)` on `world` processes and return what each rank wrote to
    `out/rank<r>.json`. The ranks meet through a file store of their own in `out` (no port to race for)."""
    out = pathlib.Path(out)
    init = f"file://{out}/store-{uuid.uuid4().hex}"
    run(worker, world, init, str(out), *args, world=world, deadline_s=deadline_s)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]


def report(out, rank: int, compute) -> None:
    """Write `compute()`'s result (a JSON-able dict), or the error it raised, to `out/rank<rank>.json` for the parent
    to assert on, after destroying this rank's process group."""
    import torch.distributed as dist

    try:
        result = compute()
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which asserts on it
        result = {"error": f"{type(exc).__name__}: {exc}"}
    finally:
        dist.destroy_process_group()
    with open(f"{out}/rank{rank}.json", "w") as f:
        json.dump(result, f)

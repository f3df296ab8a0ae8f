"""Two (or more) gloo ranks for a test: spawned processes that meet through a file store, each writing its results
as JSON into the test's folder."""

from __future__ import annotations

import datetime
import json
import pathlib
import uuid

import torch.multiprocessing as mp

# Every test process group waits this long for its peers, then fails with a traceback (a rank stuck in a collective
# would otherwise hang the suite).
TIMEOUT = datetime.timedelta(minutes=3)


def spawn(worker, out, *args, world: int = 2) -> list:
    """Run `worker(rank, world, init_method, out, *args)` on `world` processes and return what each rank wrote to
    `out/rank<r>.json`. The ranks meet through a file store of their own in `out` (no port to race for)."""
    out = pathlib.Path(out)
    init = f"file://{out}/store-{uuid.uuid4().hex}"
    mp.spawn(worker, args=(world, init, str(out), *args), nprocs=world)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]

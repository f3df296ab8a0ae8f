import os
import sys
import warnings

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))

if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)  # one core per worker: scripts/test.sh runs as many workers as the machine has cores


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

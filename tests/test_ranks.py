"""The launcher of the gloo tests (tests/ranks.py): a rank that never returns fails its test at the deadline with
its traceback, instead of holding the suite until CI's limit; a rank that returned leaves without the interpreter's
teardown; a rank that dies fails its test saying which ranks had returned."""

import atexit
import os
import time

import pytest

from ranks import run


def _stuck(rank: int) -> None:
    time.sleep(600)


@pytest.mark.slow
def test_a_stuck_rank_is_killed_at_the_deadline_with_its_traceback(capfd):
    start = time.monotonic()
    # 30 s: both ranks are in the worker by then (a spawned rank imports torch first), so both print a traceback
    with pytest.raises(pytest.fail.Exception, match=r"ranks \[0, 1\] of 2 still running after 45 s") as failed:
        run(_stuck, deadline_s=45, report_s=30)
    assert time.monotonic() - start < 105
    # the message itself names where each rank was, at the report and at the deadline (a CI log may keep only it)
    message = str(failed.value)
    for rank in (0, 1):
        for when in ("30 s (going on)", "45 s"):
            part = message.split(f"rank {rank}, still running after {when}:")[1]
            assert "tests/test_ranks.py" in part.split("still running after")[0] and "in _stuck" in part, message
    err = capfd.readouterr().err
    # at the report, each rank's traceback follows the line naming it (the ranks dump one after the other) and the
    # ranks go on; at the deadline, again, and they are killed
    reports = err.split("still running after 30 s (going on):")[1:]
    assert len(reports) == 2 and all("in _stuck" in dump.split("still running after")[0] for dump in reports), err
    dumps = err.split("still running after 45 s:")[1:]
    assert len(dumps) == 2 and all("in _stuck" in dump for dump in dumps), dumps
    assert err.index("(going on)") < err.index("still running after 45 s:")


def _returns_then_teardown_aborts(rank: int) -> None:
    atexit.register(os.abort)  # the interpreter's teardown would end the process with SIGABRT


def _dies(rank: int) -> None:
    if rank == 1:
        os.abort()
    time.sleep(60)  # rank 0 outlives its peer: the launcher ends it


@pytest.mark.slow
def test_a_rank_that_returned_leaves_without_the_interpreters_teardown():
    assert run(_returns_then_teardown_aborts) == []


@pytest.mark.slow
def test_a_dead_rank_fails_the_test_saying_whether_it_had_returned():
    with pytest.raises(
        pytest.fail.Exception, match=r"process 1 terminated with signal SIGABRT .*returned from the worker: \[\]"
    ):
        run(_dies)

"""The warm kernel pool (``execution/pool.py``) over a fake kernel manager: taking, refilling, a pooled
kernel that died, descriptor pressure and shutdown, one quick test per case of the real-kernel tests in
tests/test_pool.py (each names its counterpart). Waits are for the pool's background work, never timed.
"""

from __future__ import annotations

import asyncio
import errno

import pytest
from fake_stack import until
from tornado.web import HTTPError

from jupyter_agent_tools.execution.kernel_session import KernelSession

pytestmark = pytest.mark.quick  # no server, no kernel


async def filled(stack, ready: int = 1) -> list[str]:
    """The pooled kernels' ids once the pool holds ``ready`` and starts no more."""
    pool = stack.pool
    await until(lambda: pool.ready_count == ready and pool.starting_count == 0, f"a pool of {ready}")
    return list(pool.kernel_ids)


async def test_per_call_takes_a_pooled_kernel_which_is_replaced_and_never_reused(stacks):
    """test_pool.py::test_per_call_takes_a_pooled_kernel_which_is_replaced_and_never_reused"""
    stack = stacks(pool_size=1)
    await stack.eval("1", session="starter")  # the first eval starts the filling
    (pooled,) = await filled(stack)
    first = await stack.eval("x = 1", mode="per-call")
    assert first["kernel_id"] == pooled and first["cells"][0]["status"] == "complete"
    await until(lambda: pooled in stack.manager.shut_down, "the per-call kernel's shutdown")
    (refill,) = await filled(stack)
    assert refill != pooled and stack.pool.describe()["taken"] == 1
    second = await stack.eval("x", mode="per-call")
    assert second["kernel_id"] == refill  # a fresh kernel, never the one used before
    assert [s["name"] for s in stack.service.list_sessions()] == ["starter"]  # pooled ones are not sessions


async def test_init_step_runs_on_the_pooled_kernel_when_taken(stacks, tmp_path):
    """test_pool.py::test_init_step_runs_on_the_pooled_kernel_when_taken"""
    (tmp_path / "sub").mkdir()
    stack = stacks(pool_size=1)
    stack.pool.start()
    await filled(stack)
    ((_, _, connection),) = stack.pool.ready
    assert connection.executed == []  # nothing runs on a kernel while it waits in the pool
    await stack.eval("work", mode="per-call", cwd="sub", env={"POOL_TEST": "yes"})
    init, cell = connection.executed
    assert str(tmp_path / "sub") in init and "'POOL_TEST': 'yes'" in init and cell == "work"


async def test_a_new_session_draws_from_the_pool(stacks):
    """test_pool.py::test_a_new_session_draws_from_the_pool"""
    stack = stacks(pool_size=1)
    await stack.eval("1", mode="per-call")  # starts the filling (nothing ready yet: a cold start)
    (pooled,) = await filled(stack)
    session = await stack.eval("y = 2", session="warm")
    again = await stack.eval("y", session="warm")
    assert session["kernel_id"] == again["kernel_id"] == pooled
    assert await filled(stack) != [pooled]  # refilled


async def test_dead_pooled_kernel_is_not_handed_out(stacks):
    """test_pool.py::test_dead_pooled_kernel_is_not_handed_out"""
    stack = stacks(pool_size=1)
    stack.pool.start()
    (dead,) = await filled(stack)
    stack.manager.kill(dead)  # dies while it waits, idle
    result = await stack.eval("fresh", mode="per-call")
    assert result["kernel_id"] != dead and result["cells"][0]["status"] == "complete"
    assert dead in stack.manager.shut_down  # what was left of it was cleaned up


async def test_pooled_kernels_are_shut_down_first_when_descriptors_run_short(stacks):
    """test_pool.py::test_pooled_kernels_are_shut_down_first_when_descriptors_run_short"""
    stack = stacks(pool_size=1)
    await stack.eval("1", session="keep")
    (pooled,) = await filled(stack)
    stack.manager.start_faults.append(OSError(errno.EMFILE, "Too many open files"))
    probe = KernelSession("probe", stack.service.kernels)
    kernel_id, _ = await stack.recovery.launch(probe, "python3", "")
    assert kernel_id != pooled and pooled in stack.manager.shut_down
    assert probe.recoveries["emfile_recoveries"] == 1
    assert [s["name"] for s in stack.service.list_sessions()] == ["keep"]  # the idle session was spared
    assert stack.pool.ready_count == 0 and stack.pool.starting_count == 0  # no refill under pressure
    await stack.service.kernels.shutdown(kernel_id)


async def test_server_stop_shuts_down_pooled_kernels_including_one_being_started(stacks):
    """test_pool.py::test_server_stop_shuts_down_pooled_kernels_including_one_being_started"""
    stack = stacks(pool_size=1)
    one = await stack.eval("1", session="one")
    await filled(stack)
    stack.manager.hold_starts = asyncio.Event()  # the replacement's start will be under way
    await stack.eval("1", mode="per-call")
    await until(lambda: stack.pool.starting_count == 1, "the replacement's start")
    stopping = asyncio.ensure_future(stack.service.shutdown())
    await until(lambda: one["kernel_id"] in stack.manager.shut_down, "the stop")
    stack.manager.hold_starts.set()  # the start ends during the stop
    await stopping
    session, pooled, replacement = stack.manager.started
    assert {session, pooled, replacement} == set(stack.manager.shut_down)
    assert stack.manager.list_kernel_ids() == []


async def test_a_failed_refill_is_tried_again(stacks):
    """No real-kernel counterpart (a refill that fails is logged and retried after ``retry_delay``)."""
    stack = stacks(pool_size=1)
    stack.manager.start_faults.append(HTTPError(503, "gateway trouble"))
    stack.pool.start()
    await filled(stack)
    assert stack.manager.starts == 2


async def test_size_zero_starts_a_kernel_per_call_and_keeps_none(stacks):
    """test_pool.py::TestPoolDisabled::test_size_zero_starts_a_kernel_per_call_and_keeps_none"""
    stack = stacks(pool_size=0)
    first = await stack.eval("z = 3", mode="per-call")
    second = await stack.eval("z", mode="per-call")
    assert first["kernel_id"] != second["kernel_id"]
    await until(lambda: stack.sessions.per_call_ending == 0, "the per-call kernels' shutdown")
    assert stack.manager.list_kernel_ids() == [] and stack.manager.starts == 2
    assert stack.pool.describe() == {"size": 0, "ready": 0, "starting": 0, "kernel_name": None, "taken": 0}

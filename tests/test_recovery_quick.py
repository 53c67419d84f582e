"""The recovery policy (``execution/recovery.py``) through the eval service, over a fake kernel manager:
one quick test per fault, each named after the real-kernel test that meets the same fault for real
(tests/test_recovery.py, test_emfile.py, test_gateway_eval.py, test_session_safety.py). What only a real
kernel, ZMQ or a real gateway can show (signals, descriptor counts, the gateway's own answers) stays there.
"""

from __future__ import annotations

import asyncio
import errno
from typing import Any

import pytest
import zmq
from tornado.web import HTTPError

from jupyter_agent_tools.errors import AgentToolsError, Unavailable
from jupyter_agent_tools.execution.faults import KernelPortTaken
from jupyter_agent_tools.execution.recovery import (
    DEAD_BEFORE_RUN_NOTICE,
    EMFILE_RETRY_AFTER,
    RESTART_LIMIT_MESSAGE,
    RESTARTED_BY_MANAGER_NOTICE,
    WEDGED_NOTICE,
)
from jupyter_agent_tools.testing.fake_kernel import dies, hangs, replies

pytestmark = pytest.mark.quick  # no server, no kernel

STATE_LOST = "Kernel died during this call while running cell"
DIED_BEFORE_REPLYING = "Kernel died before replying to kernel_info"


def echo(code: str) -> list[tuple[str, str, dict[str, Any]]]:
    """A script that prints ``ran <code>`` for each cell (nothing for the silent init step)."""
    return replies(stdout="" if code.startswith("def __agent_tools_init") else f"ran {code}\n")


def dies_on(fatal: str, *, times: int = 1) -> Any:
    """A script whose kernel dies running ``fatal`` (the first ``times`` times); else :func:`echo`."""
    left = [times]

    def script(code: str) -> list[tuple[str, str, dict[str, Any]]]:
        if code == fatal and left[0] > 0:
            left[0] -= 1
            return dies()
        return echo(code)

    return script


# -- a kernel that dies during a call (test_recovery.py) -------------------------------------------


async def test_kernel_death_during_run_restarts_and_reruns(stacks):
    """test_recovery.py::test_kernel_death_during_run_restarts_and_reruns"""
    stack = stacks(dies_on("boom"))
    first = await stack.eval("before")
    result = await stack.eval("before", "boom")
    assert result["restarted"] is True and result["kernel_id"] != first["kernel_id"]
    assert [c["status"] for c in result["cells"]] == ["complete", "complete"]  # the re-run, in full
    assert result["output"].startswith(f"[{STATE_LOST} 2 and was restarted;")
    (entry,) = stack.service.list_sessions()
    assert entry["restarts"] == 1 and entry["recoveries"] == {"restarts": 1}
    assert first["kernel_id"] in stack.manager.shut_down  # the dead kernel's remains were shut down
    new = stack.manager.get_kernel(result["kernel_id"])
    assert new.restarter_stopped  # replaced by the session's recovery only, never also by its manager
    init, *cells = new.connections[0].executed
    assert init.startswith("def __agent_tools_init") and cells == ["before", "boom"]


async def test_second_death_in_one_call_gives_up_and_next_call_starts_clean(stacks):
    """test_recovery.py::test_second_death_in_one_call_gives_up_and_next_call_starts_clean and
    ::test_a_cell_that_kills_the_kernel_is_told_as_one_story"""
    stack = stacks(dies_on("boom", times=2))
    first = await stack.eval("x")
    result = await stack.eval("x", "boom")
    assert result["error"].startswith(f"{RESTART_LIMIT_MESSAGE}: the kernel died while running cell 2")
    assert result["output"].endswith(result["error"]) and result["restarted"] is True
    assert [c["status"] for c in result["cells"]] == ["complete", "error"]
    assert stack.manager.running == [] and first["kernel_id"] in stack.manager.shut_down
    after = await stack.eval("fresh")
    assert after["output"] == "ran fresh\n" and after["restarted"] is False  # told once, in the answer
    assert stack.sessions.get("s").recoveries == {"restarts": 1, "restart_limit": 1}


# -- a kernel that died between calls (test_recovery.py) -------------------------------------------


async def test_kernel_found_dead_before_run_is_restarted(stacks):
    """test_recovery.py::TestDeadBeforeRun::test_kernel_found_dead_before_run_is_restarted"""
    stack = stacks(echo)
    first = await stack.eval("x = 1", env={"K": "v"})
    stack.manager.kill(first["kernel_id"])
    result = await stack.eval("after", env={"K": "v"})
    assert result["restarted"] is True and result["output"] == f"{DEAD_BEFORE_RUN_NOTICE}\nran after\n"
    assert result["kernel_id"] != first["kernel_id"] and first["kernel_id"] in stack.manager.shut_down
    init = stack.connection().executed[0]
    assert "'K': 'v'" in init  # the new kernel got the call's environment
    assert stack.sessions.get("s").recoveries == {"restarts": 1}


async def test_heartbeat_detects_dead_idle_kernel(stacks):
    """test_recovery.py::TestHeartbeat::test_heartbeat_detects_dead_idle_kernel"""
    stack = stacks(echo)
    first = await stack.eval("1")
    await stack.sessions.heartbeat()
    assert stack.sessions.get("s").recoveries == {}  # alive: nothing done
    stack.manager.kill(first["kernel_id"])
    await stack.sessions.heartbeat()
    (entry,) = stack.service.list_sessions()
    assert entry["recoveries"] == {"deaths": 1} and entry["kernel_id"] is None and entry["state"] == "dead"
    assert first["kernel_id"] not in stack.manager.list_kernel_ids()
    result = await stack.eval("back")
    assert result["restarted"] is True and DEAD_BEFORE_RUN_NOTICE in result["output"]


async def test_a_restart_through_the_kernel_manager_reruns_init(stacks, tmp_path):
    """test_recovery.py::TestManagerRestart::test_a_restart_through_the_kernel_manager_reruns_init"""
    (tmp_path / "here").mkdir()
    stack = stacks(echo)
    first = await stack.eval("1", cwd="here", env={"E": "1"})
    old = stack.connection()
    await stack.manager.restart_kernel(first["kernel_id"])
    result = await stack.eval("2", cwd="here", env={"E": "1"})
    assert result["restarted"] is True and RESTARTED_BY_MANAGER_NOTICE in result["output"]
    assert result["kernel_id"] == first["kernel_id"]  # the manager restarted the same kernel
    new = stack.connection()
    assert new is not old and old.closed  # reconnected: a new connection, the old one closed
    init, cell = new.executed
    assert init.startswith("def __agent_tools_init") and "'E': '1'" in init and cell == "2"
    assert stack.sessions.get("s").recoveries == {"manager_restarts": 1}


async def test_failed_execute_counts_as_kernel_loss(stacks):
    """test_recovery.py::test_failed_execute_counts_as_kernel_loss"""
    stack = stacks(echo)
    first = await stack.eval("y = 2")
    await stack.connection().close()  # it can no longer send
    result = await stack.eval("after")
    assert result["restarted"] is True and result["kernel_id"] != first["kernel_id"]
    assert result["cells"][0]["status"] == "complete"
    assert stack.sessions.get("s").recoveries == {"restarts": 1}


# -- kernel starts that fail (test_recovery.py, test_gateway_eval.py, test_session_safety.py) ------


async def test_a_kernel_that_dies_before_answering_is_started_again_once(stacks):
    """test_recovery.py::test_a_kernel_that_dies_before_answering_is_started_again_once"""
    stack = stacks(echo)
    stack.manager.connect_faults.append(RuntimeError(DIED_BEFORE_REPLYING))
    result = await stack.eval("up")
    assert result["output"] == "ran up\n"
    lost, used = stack.manager.started
    assert lost in stack.manager.shut_down and result["kernel_id"] == used
    assert stack.sessions.totals["create_retries"] == 1
    assert stack.audit.recoveries == [("create_retries", "retrying"), ("create_retries", "recovered")]


async def test_a_kernel_that_lost_a_port_twice_answers_503_saying_so(stacks):
    """test_recovery.py::TestPortTakenBeforeTheKernelBoundIt (there: once, and retried)"""
    stack = stacks(echo)
    taken = "another process took the kernel's iopub port 37475 before the kernel bound it"
    stack.manager.connect_faults += [KernelPortTaken(taken), KernelPortTaken(taken)]
    with pytest.raises(AgentToolsError) as failed:
        await stack.eval("1")
    assert failed.value.status == 503 and failed.value.retry_after is not None
    assert f"failed to start (tried twice): KernelPortTaken: {taken}" in failed.value.message
    assert set(stack.manager.started) <= set(stack.manager.shut_down)
    assert stack.audit.recoveries == [("create_retries", "retrying"), ("create_retries", "failed")]


@pytest.mark.parametrize("status", [500, 503])
async def test_one_5xx_on_kernel_creation_is_retried(stacks, status):
    """test_gateway_eval.py::test_one_5xx_on_kernel_creation_is_retried"""
    stack = stacks(echo)
    stack.manager.start_faults.append(HTTPError(status, "gateway trouble"))
    result = await stack.eval("ok")
    assert result["output"] == "ran ok\n"
    assert stack.manager.starts == 2 and stack.sessions.totals["create_retries"] == 1
    assert stack.audit.recoveries == [("create_retries", "retrying"), ("create_retries", "recovered")]


@pytest.mark.parametrize(("status", "answer"), [(500, 502), (503, 503), (599, 503)])
async def test_two_5xx_fail_after_exactly_one_retry(stacks, status, answer):
    """test_gateway_eval.py::test_two_5xx_fail_after_exactly_one_retry and
    ::test_creation_timeout_599_is_retried_then_503"""
    stack = stacks(echo)
    stack.manager.start_faults += [HTTPError(status, "gateway trouble"), HTTPError(status, "again")]
    with pytest.raises(AgentToolsError) as failed:
        await stack.eval("1", session="broken")
    assert failed.value.status == answer
    assert f"HTTP {status}" in failed.value.message and "tried twice" in failed.value.message
    assert (failed.value.retry_after is not None) == (answer == 503)
    assert stack.manager.starts == 2 and stack.manager.list_kernel_ids() == []
    assert stack.audit.recoveries == [("create_retries", "retrying"), ("create_retries", "failed")]
    assert stack.service.list_sessions() == []  # the failed start holds no session
    again = await stack.eval("3", session="broken")
    assert again["output"] == "ran 3\n"  # the failed start left nothing stuck


async def test_4xx_on_kernel_creation_is_not_retried(stacks):
    """test_gateway_eval.py::test_4xx_on_kernel_creation_is_not_retried and test_session_safety.py::
    test_failed_first_start_leaves_no_session_holding_a_slot"""
    stack = stacks(echo, max_sessions=2)
    stack.manager.start_faults.append(HTTPError(403, "refused by policy"))
    with pytest.raises(AgentToolsError) as failed:
        await stack.eval("1", session="ghost")
    assert failed.value.status == 400 and "HTTP 403" in failed.value.message
    assert stack.manager.starts == 1 and stack.audit.recoveries == []
    assert stack.service.list_sessions() == []
    await stack.eval("1", session="a")
    await stack.eval("1", session="b")  # both slots free: nothing evicted for a ghost
    assert sorted(s["name"] for s in stack.service.list_sessions()) == ["a", "b"]


async def test_gateway_killed_mid_session(stacks):
    """test_gateway_eval.py::test_gateway_killed_mid_session: the kernel goes, and so do new starts."""
    stack = stacks(echo)
    first = await stack.eval("x = 1")
    stack.manager.kill(first["kernel_id"])
    stack.manager.start_faults += [HTTPError(503, "unreachable"), HTTPError(503, "unreachable")]
    with pytest.raises(AgentToolsError) as failed:
        await stack.eval("print(x)")
    assert failed.value.status == 503 and failed.value.message
    (entry,) = stack.service.list_sessions()
    assert entry["busy"] is False and entry["queue_depth"] == 0  # not stuck
    assert (await stack.eval("y"))["output"].endswith("ran y\n")  # once the kernels come back


# -- out of file descriptors (test_emfile.py, test_pool.py) ---------------------------------------


def out_of_descriptors_at_start(stack: Any) -> None:
    stack.manager.start_faults.append(OSError(errno.EMFILE, "Too many open files"))


def out_of_descriptors_at_connect(stack: Any) -> None:
    stack.manager.connect_faults.append(zmq.ZMQError(errno.EMFILE, "Too many open files"))


@pytest.mark.parametrize("fault", [out_of_descriptors_at_start, out_of_descriptors_at_connect])
async def test_emfile_recovery_frees_idle_sessions_and_the_next_eval_succeeds(stacks, fault):
    """test_emfile.py::test_emfile_recovery_frees_idle_sessions_and_the_next_eval_succeeds"""
    stack = stacks(echo)
    a = await stack.eval("1", session="a")
    b = await stack.eval("1", session="b")
    fault(stack)
    result = await stack.eval("c ran", session="c")
    assert result["output"] == "ran c ran\n"
    (entry,) = stack.service.list_sessions()
    assert entry["name"] == "c" and entry["recoveries"] == {"emfile_recoveries": 1}
    assert {a["kernel_id"], b["kernel_id"]} <= set(stack.manager.shut_down)  # a and b were shut down
    assert stack.manager.list_kernel_ids() == [result["kernel_id"]]  # nothing left of the failed start
    assert stack.audit.recoveries == [("emfile_recoveries", "retrying"), ("emfile_recoveries", "recovered")]
    assert stack.sessions.get("a") is None
    again = await stack.eval("1", session="a")
    assert again["session_lost"]["reason"] == "released"  # a's next call is told why its state went


async def test_emfile_without_recovery_room_answers_503_with_retry_after(stacks):
    """test_emfile.py::test_emfile_without_recovery_room_answers_503_with_retry_after"""
    stack = stacks(echo)
    stack.manager.start_faults += [OSError(errno.EMFILE, "Too many open files")] * 2
    with pytest.raises(Unavailable) as failed:
        await stack.eval("1", session="z")
    assert failed.value.status == 503 and failed.value.retry_after == EMFILE_RETRY_AFTER
    assert "out of file descriptors" in failed.value.message
    assert stack.audit.recoveries == [("emfile_recoveries", "retrying"), ("emfile_recoveries", "failed")]
    assert (await stack.eval("recovered", session="z"))["output"] == "ran recovered\n"


# -- a kernel that does not stop after an interrupt (test_session_safety.py) -----------------------


def wedges_on(code: str, running: asyncio.Event) -> Any:
    """A script that never ends ``code`` (and sets ``running`` when it starts); others run."""

    def script(sent: str) -> list[tuple[str, str, dict[str, Any]]]:
        if sent == code:
            running.set()
            return hangs(sent)
        return replies()

    return script


async def test_kernel_replaced_after_an_ignored_interrupt_is_reported(stacks):
    """test_session_safety.py::test_kernel_replaced_after_an_ignored_interrupt_is_reported (there the
    call's timeout interrupts; here the session's interrupt, as the timeout is 1 s at least)"""
    running = asyncio.Event()
    stack = stacks(wedges_on("spin", running))
    first = await stack.eval("x = 41")
    stack.connection().interrupt_settles = False
    events: list[dict[str, Any]] = []
    call = asyncio.ensure_future(stack.eval("spin", events=events))
    await running.wait()
    await stack.service.interrupt_session("s")
    result = await call
    (restart,) = [e for e in events if e["type"] == "restart"]
    assert restart["message"] == WEDGED_NOTICE
    assert result["cancelled"] is True and result["restarted"] is True and WEDGED_NOTICE in result["output"]
    assert result["kernel_id"] != first["kernel_id"] and first["kernel_id"] in stack.manager.shut_down
    assert stack.sessions.get("s").recoveries == {"wedged_restarts": 1}


async def test_a_replacement_after_the_caller_left_is_told_to_the_next_call(stacks):
    """test_session_safety.py::test_a_replacement_after_the_caller_left_is_told_to_the_next_call"""
    running = asyncio.Event()
    stack = stacks(wedges_on("spin", running))
    await stack.eval("x = 5")
    stack.connection().interrupt_settles = False
    gone = asyncio.Event()  # set: the caller went (its stream closed)
    call = asyncio.ensure_future(stack.eval("spin", cancel=gone))
    await running.wait()
    gone.set()
    await call
    after = await stack.eval("after")
    assert after["restarted"] is True and WEDGED_NOTICE in after["output"]
    again = await stack.eval("again")
    assert again["restarted"] is False and WEDGED_NOTICE not in again["output"]  # told once

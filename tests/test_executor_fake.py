"""The executor (``execution/executor.py`` ``run_cell``) against a fake kernel connection: every way
an execution ends (complete, error, timeout, cancel, a dead or restarted kernel, a lost idle, stdin), in
milliseconds.

The fake (:mod:`jupyter_agent_tools.testing.fake_kernel`) delivers the messages a kernel would; what needs
a real kernel's behaviour (signals, ZMQ, ipykernel's own messages) is tested with real kernels elsewhere
(tests/test_eval.py, test_recovery.py, test_session_safety.py).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from jupyter_agent_tools.execution.executor import STDIN_EMPTY, CellExecution, ExecutionLimits, run_cell
from jupyter_agent_tools.execution.messages import OutputLimits
from jupyter_agent_tools.execution.sink import OutputSink
from jupyter_agent_tools.testing.fake_kernel import FakeKernelConnection, hangs, replies

pytestmark = pytest.mark.quick  # no server, no kernel


async def run(
    conn: FakeKernelConnection,
    code: str = "x",
    *,
    timeout: float = 5.0,
    interrupt_grace: float = 1.0,
    idle_grace: float = 2.0,
    cancel: asyncio.Event | None = None,
) -> tuple[CellExecution, list[dict[str, Any]]]:
    events: list[dict[str, Any]] = []
    loop = asyncio.get_running_loop()
    limits = ExecutionLimits(
        deadline=loop.time() + timeout,
        timeout_seconds=timeout,
        interrupt_grace=interrupt_grace,
        liveness_interval=0.05,
        idle_grace=idle_grace,
    )
    result = await run_cell(
        conn,
        code,
        index=0,
        sink=OutputSink(1024),
        limits=limits,
        cancel=cancel or asyncio.Event(),
        interrupt=conn.interrupt,
        emit=events.append,
        output_limits=OutputLimits(display_bytes=2 * 1024 * 1024, html_convert_bytes=128 * 1024),
    )
    return result, events


async def test_output_and_result_complete_the_cell():
    conn = FakeKernelConnection(lambda code: replies(stdout="hi\n", result="2"))
    result, events = await run(conn, "print('hi'); 1+1")
    assert (result.status, result.exit_code, result.settled) == ("complete", 0, True)
    assert result.summary is not None and result.summary.output == "hi\n2\n"
    assert conn.executed == ["print('hi'); 1+1"] and conn.interrupts == 0
    assert [e["text"] for e in events if e["type"] == "chunk"] == ["hi\n", "2\n"]


async def test_an_error_fails_the_cell_with_its_name():
    conn = FakeKernelConnection(lambda code: replies(error=("ZeroDivisionError", "division by zero")))
    result, _ = await run(conn, "1/0")
    assert (result.status, result.exit_code) == ("error", 1)
    assert result.error is not None and result.error["ename"] == "ZeroDivisionError"


async def test_messages_of_another_execution_are_ignored():
    conn = FakeKernelConnection(lambda code: [])
    conn.send("iopub", "stream", {"name": "stdout", "text": "stale\n"}, parent="an-old-request")

    async def answer() -> None:
        await asyncio.sleep(0.01)
        conn.send("iopub", "stream", {"name": "stdout", "text": "old\n"}, parent="another")
        for channel, msg_type, content in replies(stdout="mine\n"):
            conn.send(channel, msg_type, content)

    task = asyncio.create_task(answer())
    result, _ = await run(conn)
    await task
    assert result.status == "complete"
    assert result.summary is not None and result.summary.output == "mine\n"


async def test_a_timeout_interrupts_the_kernel_and_says_so():
    conn = FakeKernelConnection(hangs)
    result, _ = await run(conn, "while True: pass", timeout=0.1)
    assert conn.interrupts == 1
    assert (result.status, result.exit_code, result.timed_out, result.settled) == (
        "cancelled",
        130,
        True,
        True,
    )
    assert result.summary is not None and "Command timed out after 0.1 seconds" in result.summary.output
    assert "KeyboardInterrupt" not in result.summary.output  # our interrupt is not shown as the code's error


async def test_an_interrupt_that_does_not_settle_ends_the_wait_after_the_grace():
    conn = FakeKernelConnection(hangs)
    conn.interrupt_settles = False
    started = asyncio.get_running_loop().time()
    result, _ = await run(conn, timeout=0.05, interrupt_grace=0.2)
    waited = asyncio.get_running_loop().time() - started
    assert conn.interrupts == 1 and result.cancelled and not result.settled
    assert 0.2 <= waited < 2.0


async def test_cancel_interrupts_at_once():
    conn = FakeKernelConnection(hangs)
    cancel = asyncio.Event()
    asyncio.get_running_loop().call_later(0.05, cancel.set)
    result, _ = await run(conn, cancel=cancel)
    assert conn.interrupts == 1
    assert (result.status, result.cancelled, result.timed_out) == ("cancelled", True, False)


async def test_a_kernel_that_dies_ends_the_execution():
    conn = FakeKernelConnection(hangs)
    asyncio.get_running_loop().call_later(0.05, conn.die)
    result, _ = await run(conn)
    assert result.kernel_died and (result.status, result.exit_code) == ("error", 1)
    assert result.error is not None and result.error["ename"] == "KernelDied"


async def test_a_kernel_gone_without_notice_is_found_by_the_liveness_check():
    conn = FakeKernelConnection(hangs)

    def vanish() -> None:
        conn.alive = False  # no "dead" event: only is_alive() says so

    asyncio.get_running_loop().call_later(0.05, vanish)
    result, _ = await run(conn)
    assert result.kernel_died and result.status == "error"


async def test_a_restart_status_without_parent_counts_as_a_death():
    conn = FakeKernelConnection(hangs)
    loop = asyncio.get_running_loop()
    loop.call_later(0.02, lambda: conn.send("iopub", "status", {"execution_state": "restarting"}, parent=""))
    result, _ = await run(conn)
    assert result.kernel_died


async def test_a_lost_idle_is_assumed_after_the_idle_grace():
    conn = FakeKernelConnection(lambda code: replies(stdout="done\n", idle=False))
    result, _ = await run(conn, idle_grace=0.1)
    assert (result.status, result.idle_missing) == ("complete", True)
    assert result.summary is not None and result.summary.output == "done\n"


async def test_an_iopub_that_is_only_slow_after_the_reply_loses_nothing():
    """The reply came and iopub went quiet past the grace (the kernel's iopub thread starved on a loaded
    machine): the empty probe's idle comes after ours on the ordered iopub, so ours is waited for."""
    loop = asyncio.get_running_loop()

    def script(code: str) -> list[tuple[str, str, dict[str, Any]]]:
        if code == "":  # probed, the kernel's iopub catches up
            loop.call_soon(late)
            return []
        return replies(stdout="a\n", idle=False)

    conn = FakeKernelConnection(script)

    def late() -> None:  # iopub delivers what it held, in order: our output and idle, then the probe's
        ours, probe = conn.msg_ids
        conn.send("iopub", "stream", {"name": "stdout", "text": "b\n"}, parent=ours)
        conn.send("iopub", "status", {"execution_state": "idle"}, parent=ours)
        conn.send("iopub", "status", {"execution_state": "idle"}, parent=probe)

    result, _ = await run(conn, idle_grace=0.1)
    assert conn.executed == ["x", ""]  # the probe was sent
    assert (result.status, result.idle_missing) == ("complete", False)
    assert result.summary is not None and result.summary.output == "a\nb\n"


async def test_the_probes_idle_before_ours_means_ours_was_lost():
    conn = FakeKernelConnection(lambda code: replies(stdout="done\n", idle=code == ""))
    result, _ = await run(conn, idle_grace=0.1)
    assert conn.executed == ["x", ""]
    assert (result.status, result.idle_missing) == ("complete", True)
    assert result.summary is not None and result.summary.output == "done\n"


async def test_the_connection_failing_to_send_is_a_dead_kernel():
    conn = FakeKernelConnection()
    await conn.close()
    result, _ = await run(conn)
    assert result.kernel_died and result.status == "error"


async def test_input_requests_are_answered_empty_and_reported():
    def asks(code: str) -> list[tuple[str, str, dict[str, Any]]]:
        return [("stdin", "input_request", {"prompt": "name? ", "password": False}), *replies()]

    conn = FakeKernelConnection(asks)
    result, _ = await run(conn, "input('name? ')")
    assert conn.input_replies == [""]
    assert result.stdin_requested and result.status == "error"
    assert result.summary is not None and STDIN_EMPTY in result.summary.output


async def test_output_past_the_sink_limit_keeps_the_tail():
    text = "".join(f"line {i}\n" for i in range(500))
    conn = FakeKernelConnection(lambda code: replies(stdout=text))
    result, _ = await run(conn)
    summary = result.summary
    assert summary is not None and summary.truncated and summary.total_bytes == len(text)
    assert summary.output.endswith("line 499\n") and "line 0\n" not in summary.output

"""A kernel's activity in jupyter_server (``last_activity``, ``execution_state``: ``/api/kernels``, the idle
culler) while an eval connection holds it in place of jupyter_server's own iopub watcher.

Real in-process jupyter_server (pytest-jupyter) and its ipykernel kernels.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from jupyter_agent_tools.eval.connection import ACTIVITY_HANDBACK_AFTER, LocalKernelConnection

pytestmark = pytest.mark.timeout(120)


def _watched(kernel: Any) -> bool:
    """Whether jupyter_server's own activity watcher reads the kernel's iopub."""
    return kernel._activity_stream is not None


async def _until_idle(conn: LocalKernelConnection, msg_id: str, kernel: Any) -> tuple[str, list[str]]:
    """The stream text of ``msg_id`` until its idle status, and the kernel's state as each stream came."""
    text: list[str] = []
    states: list[str] = []
    while True:
        msg = await asyncio.wait_for(conn.messages.get(), 60)
        if (msg.get("parent_header") or {}).get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "stream":
            text.append(msg["content"]["text"])
            states.append(kernel.execution_state)
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            return "".join(text), states


async def _eventually(check: Any, what: str, timeout: float = 20) -> None:
    for _ in range(int(timeout / 0.05)):
        if check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"not within {timeout} s: {what}")


async def test_a_connection_records_activity_as_jupyter_servers_watcher_and_hands_it_back(jp_serverapp):
    km = jp_serverapp.kernel_manager
    kernel_id = await km.start_kernel()
    kernel = km.get_kernel(kernel_id)
    conn = LocalKernelConnection(km, kernel_id, iopub_buffer_bytes=16_000_000)
    try:
        assert _watched(kernel)
        await conn.start(60)
        assert not _watched(kernel), "the server still reads every iopub message twice"
        before = kernel.last_activity
        msg_id = conn.execute("import time\nprint('working', flush=True)\ntime.sleep(0.5)\nprint('done')")
        text, states = await _until_idle(conn, msg_id, kernel)
        assert text == "working\ndone\n"
        assert states[0] == "busy"  # recorded from the connection's own messages, as the watcher does
        assert kernel.execution_state == "idle"
        assert kernel.last_activity > before and km.last_kernel_activity >= kernel.last_activity
        model = km.kernel_model(kernel_id)  # what /api/kernels says
        assert model["execution_state"] == "idle"
    finally:
        await conn.close()
    assert _watched(kernel), "jupyter_server does not watch the kernel again after the connection closed"
    # ...and its watcher works again: activity from another client is recorded
    closed_at = kernel.last_activity
    client = kernel.client()
    client.start_channels()
    try:
        for _ in range(100):  # a new ZMQ subscriber misses what is sent before it has joined: ask again
            client.execute("1")
            await asyncio.sleep(0.2)
            if kernel.last_activity > closed_at:
                break
        assert kernel.last_activity > closed_at, "jupyter_server's watcher records nothing"
    finally:
        client.stop_channels()
        await km.shutdown_kernel(kernel_id, now=True)


async def test_the_watcher_comes_back_only_when_the_last_connection_closes(jp_serverapp):
    km = jp_serverapp.kernel_manager
    kernel_id = await km.start_kernel()
    kernel = km.get_kernel(kernel_id)
    first, second = (LocalKernelConnection(km, kernel_id) for _ in range(2))
    try:
        await first.start(60)
        await second.start(60)
        assert not _watched(kernel)
        await first.close()
        assert not _watched(kernel)  # the second connection still holds it
        msg_id = second.execute("print('still here')")
        text, states = await _until_idle(second, msg_id, kernel)
        assert text == "still here\n" and states == ["busy"] and kernel.execution_state == "idle"
        await second.close()
        assert _watched(kernel)
    finally:
        await first.close()
        await second.close()
        await km.shutdown_kernel(kernel_id, now=True)


async def test_a_connection_that_waits_for_room_hands_activity_back_meanwhile(jp_serverapp):
    """Nobody takes the queue's messages (as between calls while another client floods the kernel):
    jupyter_server watches again after ACTIVITY_HANDBACK_AFTER; once read, the connection holds it again."""
    km = jp_serverapp.kernel_manager
    kernel_id = await km.start_kernel()
    kernel = km.get_kernel(kernel_id)
    conn = LocalKernelConnection(km, kernel_id, iopub_buffer_bytes=200_000)
    try:
        await conn.start(60)
        assert not _watched(kernel)
        block = "z" * 99 + "\n"
        msg_id = conn.execute(f"for _ in range(100):\n    print({block!r} * 1000, end='', flush=True)")
        await _eventually(lambda: _watched(kernel), "watched again", timeout=ACTIVITY_HANDBACK_AFTER + 10)
        text, _ = await _until_idle(conn, msg_id, kernel)
        assert text == block * 1000 * 100  # nothing lost on the way
        assert not _watched(kernel) and kernel.execution_state == "idle"
    finally:
        await conn.close()
        await km.shutdown_kernel(kernel_id, now=True)

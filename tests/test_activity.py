"""A kernel's activity in jupyter_server (``last_activity``, ``execution_state``: ``/api/kernels``, the idle
culler) while an eval connection holds it in place of jupyter_server's own iopub watcher.

Real in-process jupyter_server (pytest-jupyter) and its ipykernel kernels.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from jupyter_client.session import Session

from jupyter_agent_tools.compat import activity_watched
from jupyter_agent_tools.execution.activity import KernelActivity
from jupyter_agent_tools.execution.connection import ACTIVITY_HANDBACK_AFTER, LocalKernelConnection, _decode

pytestmark = pytest.mark.timeout(120)


_watched = activity_watched  # whether jupyter_server's own activity watcher reads the kernel's iopub


@contextlib.asynccontextmanager
async def _kernel(km: Any) -> AsyncIterator[tuple[str, Any]]:
    """A new kernel of jupyter_server's manager (its id and jupyter_client manager), shut down after."""
    kernel_id = await km.start_kernel()
    try:
        yield kernel_id, km.get_kernel(kernel_id)
    finally:
        await km.shutdown_kernel(kernel_id, now=True)


def _print_and_hold(text: str, release: Path) -> str:
    """Code that prints ``text``, then stays busy until ``release`` exists: the kernel's state seen with
    the stream is the state while it runs, however late the test reads the stream."""
    return (
        f"import os, time\nprint({text!r}, flush=True)\n"
        f"while not os.path.exists({str(release)!r}):\n    time.sleep(0.01)"
    )


async def _until_idle(
    conn: LocalKernelConnection, msg_id: str, kernel: Any, release: Path | None = None
) -> tuple[str, list[str]]:
    """The stream text of ``msg_id`` until its idle status, and the kernel's state as each stream came
    (then ``release`` is created, for a cell of :func:`_print_and_hold`)."""
    text: list[str] = []
    states: list[str] = []
    while True:
        msg = await asyncio.wait_for(conn.messages.get(), 60)
        if (msg.get("parent_header") or {}).get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "stream":
            text.append(msg["content"]["text"])
            states.append(kernel.execution_state)
            if release is not None:
                release.touch()
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            return "".join(text), states


async def _eventually(check: Any, what: str, timeout: float = 20) -> None:
    for _ in range(int(timeout / 0.05)):
        if check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"not within {timeout} s: {what}")


async def test_a_connection_records_activity_as_jupyter_servers_watcher_and_hands_it_back(
    jp_serverapp, tmp_path
):
    km = jp_serverapp.kernel_manager
    async with _kernel(km) as (kernel_id, kernel):
        conn = LocalKernelConnection(km, kernel_id, iopub_buffer_bytes=16_000_000)
        try:
            assert _watched(kernel)
            await conn.start(60)
            assert not _watched(kernel), "the server still reads every iopub message twice"
            before = kernel.last_activity
            msg_id = conn.execute(_print_and_hold("working", tmp_path / "release") + "\nprint('done')")
            text, states = await _until_idle(conn, msg_id, kernel, tmp_path / "release")
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


class TestHoldKernelActivityOff:
    @pytest.fixture
    def jp_server_config(self) -> dict[str, Any]:
        return {
            "ServerApp": {"jpserver_extensions": {"jupyter_agent_tools": True}},
            "KernelService": {"hold_activity": False},
        }

    async def test_jupyter_servers_watcher_keeps_running(self, jp_serverapp):
        (app,) = jp_serverapp.extension_manager.extension_apps["jupyter_agent_tools"]
        km = jp_serverapp.kernel_manager
        async with _kernel(km) as (kernel_id, kernel):
            conn = await app.eval_service.kernels.connect(kernel_id)
            try:
                assert _watched(kernel)
                msg_id = conn.execute("print('ok')")
                assert (await _until_idle(conn, msg_id, kernel))[0] == "ok\n"
            finally:
                await conn.close()


async def test_the_watcher_comes_back_only_when_the_last_connection_closes(jp_serverapp, tmp_path):
    km = jp_serverapp.kernel_manager
    async with _kernel(km) as (kernel_id, kernel):
        first, second = (LocalKernelConnection(km, kernel_id) for _ in range(2))
        try:
            await first.start(60)
            await second.start(60)
            assert not _watched(kernel)
            await first.close()
            assert not _watched(kernel)  # the second connection still holds it
            msg_id = second.execute(_print_and_hold("still here", tmp_path / "release"))
            text, states = await _until_idle(second, msg_id, kernel, tmp_path / "release")
            assert text == "still here\n" and states == ["busy"] and kernel.execution_state == "idle"
            await second.close()
            assert _watched(kernel)
        finally:
            await first.close()
            await second.close()


async def test_a_watcher_jupyter_server_had_not_started_is_not_started_at_close(jp_serverapp, tmp_path):
    km = jp_serverapp.kernel_manager
    async with _kernel(km) as (kernel_id, kernel):
        km.stop_watching_activity(kernel_id)  # whoever did: the connection hands back only what it took
        conn = LocalKernelConnection(km, kernel_id)
        try:
            await conn.start(60)
            msg_id = conn.execute(_print_and_hold("x", tmp_path / "release"))
            states = (await _until_idle(conn, msg_id, kernel, tmp_path / "release"))[1]
            assert states == ["busy"]  # recorded while open
        finally:
            await conn.close()
        assert not _watched(kernel)


async def test_a_connection_that_waits_for_room_hands_activity_back_meanwhile(jp_serverapp):
    """Nobody takes the queue's messages (as between calls while another client floods the kernel):
    jupyter_server watches again after ACTIVITY_HANDBACK_AFTER; once read, the connection holds it again."""
    km = jp_serverapp.kernel_manager
    async with _kernel(km) as (kernel_id, kernel):
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


def _message(session: Session, msg_type: str, content: dict[str, Any], parent_type: str | None) -> Any:
    parent = session.msg_header(parent_type) if parent_type else {}
    return session.msg(msg_type, content, parent=parent)


_CASES = [  # (message type, content, parent's type)
    ("status", {"execution_state": "busy"}, "execute_request"),
    ("status", {"execution_state": "idle"}, "execute_request"),
    ("status", {"execution_state": "starting"}, None),
    ("status", {"execution_state": "idle"}, None),
    ("status", {"execution_state": "busy"}, "kernel_info_request"),  # untracked by default
    ("status", {"execution_state": "idle"}, "comm_info_request"),
    ("stream", {"name": "stdout", "text": "x"}, "execute_request"),
    ("stream", {"name": "stdout", "text": "x"}, "kernel_info_request"),
    ("kernel_info_reply", {}, "kernel_info_request"),
    ("comm_msg", {"comm_id": "c", "data": {}}, None),
]


async def test_recording_does_what_jupyter_servers_record_activity_does(jp_serverapp):
    """The same message, the same kernel state before: jupyter_server's own ``record_activity`` (the
    watcher's receive callback) and ``KernelActivity.record`` leave the same state and activity."""
    km = jp_serverapp.kernel_manager
    async with _kernel(km) as (kernel_id, kernel):
        record_activity = kernel._activity_stream._recv_callback  # jupyter_server's, as it watches
        sender = Session(key=kernel.session.key)
        activity = KernelActivity(km, kernel_id, kernel)
        activity.held = True  # recording only: jupyter_server's watcher keeps running in this test
        for before in ("starting", "idle", "busy"):
            for msg_type, content, parent_type in _CASES:
                outcomes = []
                for record in (record_activity, activity.record):
                    kernel.execution_state = before
                    kernel.last_activity = km.last_kernel_activity = datetime(2000, 1, 1, tzinfo=timezone.utc)
                    msg = _message(sender, msg_type, content, parent_type)
                    frames = [bytes(f) for f in sender.serialize(msg)]
                    if record is record_activity:
                        record(frames)
                    else:
                        record(_decode(Session(key=kernel.session.key), frames, "iopub"))
                    recent = (kernel.last_activity.year > 2000, km.last_kernel_activity.year > 2000)
                    outcomes.append((kernel.execution_state, recent))
                assert outcomes[0] == outcomes[1], (before, msg_type, parent_type, outcomes)

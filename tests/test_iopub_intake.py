"""How a kernel connection takes in iopub: bounded in bytes, in order, nothing lost.

The pure part tests :class:`MessageQueue`'s byte accounting; the rest runs a real ipykernel started by
jupyter_client's ``AsyncKernelManager`` (the connection only needs ``get_kernel`` and restart callbacks
from the server's kernel manager, so a one-kernel adapter stands in for it).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from jupyter_client.manager import AsyncKernelManager
from jupyter_client.session import Session

from jupyter_agent_tools.execution.connection import LocalKernelConnection, MessageQueue, _decode, event

pytestmark = pytest.mark.timeout(120)

KB = 1000
LINE = "y" * 99 + "\n"


def test_queue_counts_bytes_and_a_message_fits_within_the_budget_or_an_empty_queue():
    queue = MessageQueue(budget=250)
    assert queue.fits(10**9)  # an empty queue takes any message
    queue.put_sized({"n": 1}, 100)
    queue.put_nowait(event("dead"))  # a notice counts nothing
    assert queue.bytes == 100 and queue.fits(150) and not queue.fits(151)
    queue.put_sized({"n": 2}, 150)
    assert not queue.taken.is_set()
    assert queue.get_nowait() == {"n": 1}
    assert queue.bytes == 150 and queue.taken.is_set() and queue.fits(100) and not queue.fits(101)
    assert [queue.get_nowait() for _ in range(2)] == [event("dead"), {"n": 2}]
    assert queue.bytes == 0 and queue.fits(10**9)


def test_queue_without_budget_takes_everything():
    queue = MessageQueue()
    queue.put_sized({}, 10**9)
    assert queue.fits(10**9) and queue.bytes == 10**9


class _OneKernel:
    """The part of the server's kernel manager a connection uses, for one jupyter_client kernel."""

    def __init__(self, km: AsyncKernelManager):
        self.km = km

    def get_kernel(self, kernel_id: str) -> AsyncKernelManager:
        return self.km

    def add_restart_callback(self, *args: Any) -> None:
        pass

    def remove_restart_callback(self, *args: Any) -> None:
        pass


async def _collect(conn: LocalKernelConnection, msg_id: str) -> tuple[str, list[str]]:
    """Every stream text of ``msg_id`` until its idle status, and the message types in order."""
    text: list[str] = []
    types: list[str] = []
    while True:
        msg = await asyncio.wait_for(conn.messages.get(), 60)
        if (msg.get("parent_header") or {}).get("msg_id") != msg_id:
            continue
        types.append(msg["msg_type"])
        if msg["msg_type"] == "stream":
            text.append(msg["content"]["text"])
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            return "".join(text), types


async def test_a_connection_holds_about_its_budget_while_nobody_reads_and_loses_nothing():
    km = AsyncKernelManager()
    await km.start_kernel()
    budget = 2_000 * KB
    conn = LocalKernelConnection(_OneKernel(km), "k", iopub_hwm=2, iopub_buffer_bytes=budget)
    try:
        await conn.start(60)
        flushes = 300  # of 100 KB: 30 MB, 15 times the budget; the kernel keeps up to 1000 messages
        msg_id = conn.execute(
            f"block = {LINE!r} * 1000\nfor _ in range({flushes}):\n    print(block, end='', flush=True)\n"
        )
        held: list[int] = []
        for _ in range(30):  # nobody takes messages for 3 s: the kernel has printed everything by then
            held.append(conn.messages.bytes)
            await asyncio.sleep(0.1)
        assert max(held) >= budget // 2, f"the connection took in little: {max(held)} bytes"
        assert max(held) <= budget, f"the connection took in {max(held)} bytes"
        text, types = await _collect(conn, msg_id)
        assert text == LINE * 1000 * flushes  # every byte, in order
        assert types[0] == "status" and types.count("stream") == flushes
    finally:
        await conn.close()
        await km.shutdown_kernel(now=True)


def _frames(session: Session, msg: dict[str, Any]) -> list[bytes]:
    return [bytes(f) for f in session.serialize(msg, ident=[b"topic"])]


@pytest.mark.parametrize("content_bytes", [100, 2_000_000])
def test_decode_is_deserialize_with_the_same_checks_and_dates_left_as_sent(content_bytes: int):
    sender = Session(key=b"k" * 32)
    parent = sender.msg_header("execute_request")
    msg = sender.msg("stream", {"name": "stdout", "text": "é" * (content_bytes // 2)}, parent=parent)
    msg["buffers"] = [b"\x00\x01"]
    frames = [*_frames(sender, msg), b"\x00\x01"]
    expected = Session(key=b"k" * 32).deserialize(Session().feed_identities(list(frames))[1])

    receiver = Session(key=b"k" * 32)
    got = _decode(receiver, list(frames), "iopub")
    assert got["channel"] == "iopub"
    buffers = [bytes(b) for b in got.pop("buffers")]
    assert buffers == [bytes(b) for b in expected.pop("buffers")] == [b"\x00\x01"]
    for part in ("header", "parent_header"):  # dates as the kernel wrote them, not datetime objects
        assert got[part].pop("date") == expected[part].pop("date").isoformat().replace("+00:00", "Z")
    del got["channel"]
    assert got == expected
    with pytest.raises(ValueError, match="Duplicate Signature"):  # a replay is refused, as by deserialize
        _decode(receiver, list(frames), "iopub")
    with pytest.raises(ValueError, match="Invalid Signature"):
        _decode(Session(key=b"other"), list(frames), "iopub")


def test_decode_leaves_older_protocols_to_deserialize_which_adapts_them():
    sender = Session(key=b"k")
    msg = sender.msg("pyout", {"data": {"text/plain": "1"}, "prompt_number": 3, "metadata": {}})
    msg["header"]["version"] = "4.1"
    got = _decode(Session(key=b"k"), _frames(sender, msg), "iopub")
    assert got["msg_type"] == "execute_result" and got["header"]["version"].startswith("5.")


async def test_big_messages_decode_to_the_same_content_as_small_ones():
    """Big contents (decoded once their raw bytes are dropped) arrive as the same messages."""
    km = AsyncKernelManager()
    await km.start_kernel()
    conn = LocalKernelConnection(_OneKernel(km), "k", iopub_buffer_bytes=16_000_000)
    try:
        await conn.start(60)
        code = (
            "from IPython.display import display\n"
            "print('é' * 1_500_000, end='', flush=True)\n"  # 3 MB of UTF-8 in one message
            "display({'text/plain': 'p' * 2_000_000, 'application/json': {'k': [1, 'ü']}}, raw=True)\n"
            "print('small', flush=True)\n"
        )
        msg_id = conn.execute(code)
        messages = []
        while True:
            msg = await asyncio.wait_for(conn.messages.get(), 60)
            if (msg.get("parent_header") or {}).get("msg_id") != msg_id:
                continue
            messages.append(msg)
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                break
        # ipykernel may split a print into several stream messages; a display is one message
        shown = [m["content"]["data"] for m in messages if m["msg_type"] == "display_data"]
        assert shown == [{"text/plain": "p" * 2_000_000, "application/json": {"k": [1, "ü"]}}]
        position = next(i for i, m in enumerate(messages) if m["msg_type"] == "display_data")
        before = "".join(m["content"]["text"] for m in messages[:position] if m["msg_type"] == "stream")
        after = "".join(m["content"]["text"] for m in messages[position:] if m["msg_type"] == "stream")
        assert (before, after) == ("é" * 1_500_000, "small\n")
        # tagged with their channel (the execute_reply may come before the idle); header fields as sent
        assert {m["channel"] for m in messages} <= {"iopub", "shell"}
        assert all(m["channel"] == "shell" for m in messages if m["msg_type"] == "execute_reply")
        assert all(isinstance(m["header"]["msg_id"], str) for m in messages)
    finally:
        await conn.close()
        await km.shutdown_kernel(now=True)

"""A stream client that falls behind for a moment: the eval waits for it (``stream_lag_grace``) instead of
skipping its output, without ever holding the kernel up.

The pure part drives :class:`StreamPace` with a real :class:`StreamBacklog` and :class:`MessageQueue`; the
end-to-end part runs a real server subprocess and kernel, with a client whose socket stops reading.
"""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import time
from pathlib import Path

import pytest

from jupyter_agent_tools.execution.backlog import StreamBacklog
from jupyter_agent_tools.execution.connection import MessageQueue
from jupyter_agent_tools.execution.pace import StreamPace

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from jupyter_agent_tools.testing.server import jupyter_server

pytestmark = pytest.mark.timeout(180)


def _lagging_backlog() -> StreamBacklog:
    backlog = StreamBacklog(1000)
    backlog.put({"type": "chunk", "index": 0, "name": "stdout", "text": "x" * 800})  # 200 bytes left
    assert backlog.lagging()
    return backlog


def test_waits_only_for_a_lagging_client_while_the_kernel_connection_has_room():
    backlog, queue = _lagging_backlog(), MessageQueue(budget=1000)
    pace = StreamPace(backlog.lagging, grace=1.0)
    assert pace.should_wait(queue)
    queue.put_sized({}, 499)
    assert pace.should_wait(queue)  # under half the budget
    queue.put_sized({}, 1)
    assert not pace.should_wait(queue)  # half: room is kept for the kernel's output to keep flowing
    queue.get_nowait(), queue.get_nowait()
    queue.waiting = 1
    assert not pace.should_wait(queue)  # a message waits for room: never hold the kernel up
    queue.waiting = 0
    assert not pace.should_wait(asyncio.Queue())  # an unbounded queue (gateway): never wait
    assert not StreamPace(StreamBacklog(1000).lagging, grace=1.0).should_wait(queue)  # a client that keeps up
    assert not StreamPace(backlog.lagging, grace=0).should_wait(queue)


async def test_a_wait_ends_on_progress_and_each_lag_has_the_grace_once():
    backlog, queue = _lagging_backlog(), MessageQueue(budget=1000)
    pace = StreamPace(backlog.lagging, grace=0.5)
    waiter = asyncio.ensure_future(pace.wait(10))
    await asyncio.sleep(0.05)
    assert not waiter.done()
    pace.progressed()  # the client took text but still lags
    await asyncio.wait_for(waiter, 1)
    await pace.wait(10)  # the rest of the grace, then no more waiting for this lag
    assert not pace.should_wait(queue)
    backlog.take()
    backlog.sent()  # caught up
    pace.progressed()
    backlog.put({"type": "chunk", "index": 0, "name": "stdout", "text": "y" * 900})
    assert pace.should_wait(queue)  # a new lag: the whole grace again


def _stream_with_a_pause(server, body: dict, pause: float) -> list[dict]:
    """POST an NDJSON eval on a socket with a small receive buffer, read nothing for ``pause`` seconds
    once the answer has started, then read it all; the events."""
    host, port = server.url.split("//", 1)[1].rstrip("/").split(":")
    payload = json.dumps(body).encode()
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
        sock.connect((host, int(port)))
        sock.sendall(
            (
                f"POST /api/agent/eval HTTP/1.1\r\nHost: {host}:{port}\r\n"
                f"Authorization: token {server.token}\r\nAccept: application/x-ndjson\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
            ).encode()
            + payload
        )
        data = sock.recv(1024)
        time.sleep(pause)
        while not data.endswith(b"\r\n0\r\n\r\n"):
            more = sock.recv(1 << 20)
            assert more, "the server closed the stream early"
            data += more
    head, _, chunked = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    body_bytes, rest = bytearray(), chunked
    while True:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            break
        body_bytes += rest[:size]
        rest = rest[size + 2 :]
    return [json.loads(line) for line in body_bytes.splitlines()]


PRINTED = 120  # flushes of 100 KB: 12 MB, far more than the socket buffers and the stream's backlog
CODE = f"block = 'z' * 99 + '\\n'\nfor _ in range({PRINTED}):\n    print(block * 1000, end='', flush=True)\n"


@pytest.mark.parametrize(("grace", "gaps_expected"), [(30.0, False), (0.0, True)])
def test_a_client_that_pauses_gets_everything_while_the_grace_lasts(grace: float, gaps_expected: bool):
    args = [
        "--AgentToolsApp.stream_backlog_bytes=262144",
        "--KernelService.iopub_buffer_bytes=67108864",
        f"--AgentToolsApp.stream_lag_grace={grace}",
    ]
    with jupyter_server(extra_args=args) as server:
        events = _stream_with_a_pause(server, {"cells": [{"code": CODE}], "session": "p"}, pause=1.5)
    text = "".join(e["text"] for e in events if e["type"] == "chunk")
    skipped = sum(e["bytes"] for e in events if e["type"] == "gap")
    (result,) = [e["result"] for e in events if e["type"] == "result"]
    assert result["cells"][0]["status"] == "complete"
    assert len(text) + skipped == PRINTED * 100_000  # nothing unaccounted for, either way
    if gaps_expected:  # without the grace, a 1.5 s pause costs the client most of the output
        assert skipped > 1_000_000, skipped
    else:
        assert skipped == 0 and text == ("z" * 99 + "\n") * 1000 * PRINTED

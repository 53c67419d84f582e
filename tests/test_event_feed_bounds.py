"""Event subscribers that never read cost the server a bounded amount (issue 35, M2).

A real server subprocess; real websockets to ``/api/events/subscribe`` opened by hand on raw sockets with a
small receive buffer, which then never read a byte. Events are emitted through the server's own
``POST /api/events`` (64 KB each). jupyter_server's handler kept every event for every subscriber (RSS grew
by events x subscribers); ours keeps at most ``EventFeed.max_pending_bytes`` per subscriber and closes one
that does not read, while other requests stay fast and the log stays free of unretrieved exceptions.
"""

from __future__ import annotations

import base64
import os
import socket
import time
import urllib.parse

import pytest

pytestmark = pytest.mark.timeout(300)

SUBSCRIBERS = 20
EVENTS = 200
PAYLOAD = 64 * 1024
PENDING = 256 * 1024  # EventFeed.max_pending_bytes for this server


def _silent_subscriber(url: str, token: str) -> socket.socket:
    """A websocket to the event feed that completes its handshake and never reads again."""
    parts = urllib.parse.urlsplit(url)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((parts.hostname, parts.port))
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(
        (
            f"GET {parts.path}api/events/subscribe HTTP/1.1\r\nHost: {parts.netloc}\r\n"
            "Upgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
            f"Authorization: token {token}\r\n\r\n"
        ).encode()
    )
    answer = b""
    while b"\r\n\r\n" not in answer:
        chunk = sock.recv(1)  # byte by byte: nothing past the handshake is read
        assert chunk, answer
        answer += chunk
    assert answer.startswith(b"HTTP/1.1 101"), answer
    return sock


def test_subscribers_that_never_read_cost_a_bounded_amount(agent_server) -> None:
    with agent_server(extra_args=[f"--EventFeed.max_pending_bytes={PENDING}"]) as server:
        client = server.client(timeout=60)
        subscribers = [_silent_subscriber(server.url, server.token) for _ in range(SUBSCRIBERS)]
        before = server.rss_bytes() or 0
        baseline = 0.0  # the slowest /api/status before the flood, on this machine now
        for _ in range(5):
            started = time.monotonic()
            client.json("GET", "api/status")
            baseline = max(baseline, time.monotonic() - started)
        event = {
            "schema_id": "https://events.jupyter.org/jupyter_agent_tools/refusal/v1",
            "version": "1",
            "data": {
                "user": "flood",
                "route": "test",
                "method": "GET",
                "action": "read",
                "resource": "events",
                "reason": "x" * PAYLOAD,
            },
        }
        slowest = 0.0
        for n in range(EVENTS):
            client.json("POST", "api/events", event, expect=204)
            if n % 20 == 0:
                started = time.monotonic()
                client.json("GET", "api/status")
                slowest = max(slowest, time.monotonic() - started)
        after = server.rss_bytes() or 0
        # jupyter_server's handler: about SUBSCRIBERS x EVENTS x PAYLOAD (256 MB here) more
        grown = after - before
        print(
            f"RSS {before / 2**20:.0f} MB -> {after / 2**20:.0f} MB;",
            f"slowest /api/status {slowest * 1000:.0f} ms",
        )
        assert grown < 64 * 2**20, f"RSS grew by {grown / 2**20:.0f} MB"
        assert slowest < 0.5 + 20 * baseline, (slowest, baseline)  # v0.3: requests waited seconds
        started = time.monotonic()
        for sock in subscribers:
            sock.close()
        client.json("GET", "api/status")
        assert time.monotonic() - started < 1 + 20 * baseline, baseline  # v0.3: closing froze it 40-74 s
        client.close()
        time.sleep(6)  # past tornado's 5 s wait for a close handshake the client never answers
        log = server.log_path.read_text(errors="replace")
    assert "was never retrieved" not in log, log[-2000:]
    assert "does not read" in log  # the server said why it closed them

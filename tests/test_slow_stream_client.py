"""A stream client that reads slower than the kernel prints: the server's memory stays bounded, it keeps
answering other requests, and a client that leaves cancels the run (real server subprocess, real kernel).
"""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from contract import NDJSON, Contract

from jupyter_agent_tools.api_document import openapi_document

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from jupyter_agent_tools.testing.server import jupyter_server

pytestmark = pytest.mark.timeout(240)

MB = 1024 * 1024
FLUSHES = 40  # of 10 MB: 400 MB printed in all
LINE = 10_000_000
MEMORY_BOUND = 200 * MB  # above the server's resident memory before the run


def _request(server, method: str, path: str, body: dict | None = None, timeout: float = 60) -> dict:
    request = urllib.request.Request(
        server.url + path,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"token {server.token}"},
        method=method,
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


def _open_slow_stream(server, body: dict) -> socket.socket:
    """Send an NDJSON eval over a raw socket with a small receive buffer; the caller reads it."""
    host, port = server.url.split("//", 1)[1].rstrip("/").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
    sock.connect((host, int(port)))
    payload = json.dumps(body).encode()
    sock.sendall(
        (
            "POST /api/agent/eval HTTP/1.1\r\n"
            f"Host: {host}:{port}\r\n"
            f"Authorization: token {server.token}\r\n"
            "Accept: application/x-ndjson\r\n"
            "Content-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n"
        ).encode()
        + payload
    )
    return sock


def _read_slowly(sock: socket.socket, stop: threading.Event, received: list[int]) -> None:
    """1 KB every 100 ms (10 KB/s) until told to stop."""
    while not stop.is_set():
        try:
            data = sock.recv(1024)
        except OSError:
            return
        if not data:
            return
        received[0] += len(data)
        stop.wait(0.1)


def _check_artifact(path: Path) -> None:
    """The artifact holds every byte the kernel printed (then the interrupt's traceback)."""
    expected = b"x" * LINE + b"\n"
    with path.open("rb") as f:
        for i in range(FLUSHES):
            block = f.read(len(expected))
            assert block == expected, f"artifact differs from the printed output in line {i + 1}"
        assert b"KeyboardInterrupt" in f.read()


def _artifact_size(artifacts: Path, session: str) -> int:
    """The largest artifact of the session (its directory: the name, then a key of owner and name)."""
    return max((p.stat().st_size for p in artifacts.glob(f"{session}.*/*.txt")), default=0)


def test_slow_stream_reader_keeps_memory_bounded_server_responsive_and_leaving_cancels(tmp_path):
    artifacts = tmp_path / "artifacts"
    with jupyter_server(extra_args=[f"--ArtifactStore.root_dir={artifacts}"]) as server:
        body = {"cells": [{"code": "state = 'kept'"}], "session": "flood"}
        _request(server, "POST", "api/agent/eval", body)
        baseline = server.rss_bytes()
        assert baseline
        assert server.reset_peak_memory()
        code = (
            "import time\n"
            f"line = 'x' * {LINE}\n"
            f"for _ in range({FLUSHES}):\n"
            "    print(line, flush=True)\n"
            "time.sleep(300)\n"
        )
        opened = time.monotonic()
        sock = _open_slow_stream(server, {"cells": [{"code": code}], "session": "flood", "timeout": 600})
        stop, received = threading.Event(), [0]
        reader = threading.Thread(target=_read_slowly, args=(sock, stop, received), daemon=True)
        reader.start()
        latencies: list[float] = []
        try:
            deadline = time.monotonic() + 120
            # until the server has taken in all the kernel printed (its artifact has every byte)
            while _artifact_size(artifacts, "flood") < FLUSHES * (LINE + 1):
                assert time.monotonic() < deadline, "the server did not take in the output in 120 s"
                rss = server.rss_bytes() or 0
                assert rss - baseline < MEMORY_BOUND, f"server RSS grew by {(rss - baseline) / MB:.0f} MB"
                started = time.monotonic()
                listing = _request(server, "GET", "api/agent/sessions", timeout=30)
                latencies.append(time.monotonic() - started)
                time.sleep(0.2)
            taking_in = time.monotonic() - opened
            # Measured against the intake's own time (a loaded machine slows both alike): no request
            # waited for half of it, as one would if the server stalled on the flood (0.08 measured).
            assert latencies and max(latencies) < taking_in / 2, (
                f"GET /api/agent/sessions took up to {max(latencies):.2f} s while the server took in the "
                f"output in {taking_in:.1f} s"
            )
            (session,) = [s for s in listing["sessions"] if s["name"] == "flood"]
            assert session["busy"] is True  # still running (sleeping), the client still connected
            grown = server.memory()["VmHWM"] - baseline
            assert grown < MEMORY_BOUND, f"server peak RSS grew by {grown / MB:.0f} MB"
        finally:
            stop.set()
            sock.close()  # the client leaves: the run is cancelled and the kernel interrupted
            reader.join(timeout=5)
        left = time.monotonic()
        while any(s["busy"] for s in _request(server, "GET", "api/agent/sessions")["sessions"]):
            assert time.monotonic() - left < 60, "the run went on after its client left"
            time.sleep(0.1)
        print(
            f"\npeak RSS growth {grown / MB:.0f} MB; GET /api/agent/sessions max "
            f"{max(latencies) * 1000:.0f} ms over {len(latencies)} requests while the server took in "
            f"the output in {taking_in:.1f} s; the client read "
            f"{received[0]} bytes; the run ended {time.monotonic() - left:.1f} s after the client left"
        )
        body = {"cells": [{"code": "print(state)"}], "session": "flood"}
        after = _request(server, "POST", "api/agent/eval", body)
        assert after["output"] == "kept\n"  # interrupted, not restarted: the session's state is there
        assert after["restarted"] is False and after["kernel_id"] == session["kernel_id"]
        spilled = sorted(artifacts.glob("flood.*/*.txt"), key=lambda p: p.stat().st_size)
        _check_artifact(spilled[-1])


# ------------------------------------------------------------- gap events (in-process server)


@pytest.fixture
def jp_server_config() -> dict[str, Any]:
    return {
        "ServerApp": {"jpserver_extensions": {"jupyter_agent_tools": True}},
        "AgentToolsApp": {"stream_backlog_bytes": 64 * 1024},
    }


def _dechunk(data: bytes) -> bytes:
    """The body of an HTTP/1.1 chunked response."""
    body, rest = b"", data
    while rest:
        size_line, rest = rest.split(b"\r\n", 1)
        size = int(size_line, 16)
        if size == 0:
            break
        body, rest = body + rest[:size], rest[size + 2 :]
    return body


async def test_client_that_falls_behind_gets_gaps_and_the_result_keeps_everything(
    jp_http_port, jp_base_url, jp_auth_header, jp_root_dir, jp_fetch, api
):
    lines = [chr(ord("a") + i) * 1_000_000 + "\n" for i in range(20)]
    printed = "".join(lines)
    marker = jp_root_dir / "printed"
    code = (
        "import pathlib\n"
        "for i in range(20):\n"
        "    print(chr(ord('a') + i) * 1_000_000, flush=True)\n"
        f"_ = pathlib.Path({str(marker)!r}).write_text('done')\n"
    )
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", jp_http_port))
    reader, writer = await asyncio.open_connection(sock=sock, limit=1 << 26)
    payload = json.dumps({"cells": [{"code": code}], "session": "behind", "timeout": 120}).encode()
    headers = "".join(f"{k}: {v}\r\n" for k, v in jp_auth_header.items())
    writer.write(
        f"POST {jp_base_url}api/agent/eval HTTP/1.1\r\nHost: 127.0.0.1\r\n{headers}"
        f"Accept: {NDJSON}\r\nContent-Type: application/json\r\nConnection: close\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n".encode()
        + payload
    )
    await writer.drain()
    for _ in range(1200):  # the client reads nothing until the cell is done
        if marker.exists():
            _, listing = await api("GET", "sessions")
            if not any(s["busy"] for s in listing["sessions"] if s["name"] == "behind"):
                break
        await asyncio.sleep(0.05)
    else:
        raise AssertionError("the cell did not finish in 60 s")
    response = await reader.read()
    writer.close()
    head, body = response.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 200") and b"chunked" in head.lower()
    events = [json.loads(line) for line in _dechunk(body).splitlines()]
    contract = Contract(openapi_document())
    for event in events:
        contract.assert_response("POST", "/api/agent/eval", 200, event, NDJSON)
    assert events[0]["type"] == "cell_start" and events[-1]["type"] == "result"
    gaps = [e for e in events if e["type"] == "gap"]
    assert gaps and all(e["index"] == 0 and e["name"] == "stdout" for e in gaps)
    offset = 0  # every byte printed was either sent, in order, or counted in a gap
    for event in events:
        if event["type"] == "chunk":
            assert printed[offset : offset + len(event["text"])] == event["text"], offset
            offset += len(event["text"])
        elif event["type"] == "gap":
            offset += event["bytes"]
    assert offset == len(printed)
    cell = events[-1]["result"]["cells"][0]
    assert cell["status"] == "complete" and cell["total_bytes"] == len(printed)
    assert cell["output"].endswith(lines[-1][-1000:])
    artifact = await jp_fetch("api", "agent", "artifacts", cell["artifact_id"])
    assert artifact.body.decode() == printed

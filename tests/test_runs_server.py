"""Detached runs against a real server process: a restart says 'lost' (a crashed server's runs too),
and a slow reader of a flood's events keeps the server's memory bounded."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from jupyter_agent_tools.testing.server import jupyter_server

pytestmark = pytest.mark.timeout(300)

MB = 1024 * 1024


def request(server: Any, method: str, path: str, body: Any = None, timeout: float = 60) -> Any:
    sent = urllib.request.Request(
        server.url + path,
        data=None if body is None and method == "GET" else json.dumps(body or {}).encode(),
        headers={"Authorization": f"token {server.token}"},
        method=method,
    )
    with urllib.request.urlopen(sent, timeout=timeout) as response:
        return response.status, json.loads(response.read())


def test_a_restarted_server_says_lost_and_the_notebook_has_the_finished_cells(tmp_path: Path) -> None:
    import nbformat

    root = tmp_path / "root"
    root.mkdir()
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("print('first')"),
        nbformat.v4.new_code_cell("import time; time.sleep(120)"),
    ]
    nbformat.write(nb, root / "long.ipynb")
    args = [f"--RunRegistry.runs_db_path={tmp_path / 'runs.db'}"]
    with jupyter_server(root_dir=root, extra_args=args) as server:
        status, done = request(server, "POST", "api/agent/eval", {"cells": [{"code": "1"}], "detach": True})
        assert status == 202
        request(server, "GET", f"api/agent/runs/{done['run_id']}?wait=60")
        status, run = request(
            server,
            "POST",
            "api/agent/notebooks/long.ipynb/run",
            {"all": True, "timeout": 600, "detach": True},
        )
        assert status == 202
        deadline = time.monotonic() + 60
        while True:  # until the first cell has finished (and its outputs were written)
            _, state = request(server, "GET", f"api/agent/runs/{run['run_id']}")
            if state["cells_done"] >= 1:
                break
            assert time.monotonic() < deadline, state
            time.sleep(0.2)
        server.process.kill()  # a crash: nothing runs at shutdown
        server.process.wait(10)
    saved = nbformat.read(root / "long.ipynb", as_version=4)
    assert saved.cells[0].outputs[0]["text"] == "first\n"
    with jupyter_server(root_dir=root, extra_args=args) as server:
        _, listing = request(server, "GET", "api/agent/runs")
        states = {r["run_id"]: r["state"] for r in listing["runs"]}
        assert states == {run["run_id"]: "lost", done["run_id"]: "complete"}
        _, lost = request(server, "GET", f"api/agent/runs/{run['run_id']}")
        assert lost["kind"] == "notebook_run" and lost["target"] == "long.ipynb"
        assert "restarted" in lost["message"] and lost["result"] is None
        try:
            request(server, "GET", f"api/agent/runs/{run['run_id']}/events")
        except urllib.error.HTTPError as e:
            assert e.code == 410
            assert "server process that stopped" in json.loads(e.read())["message"]
        else:
            raise AssertionError("the events of a lost run answered 200")


# 300 MB printed in messages of 5 MB: the server holds a few messages at once, never the flood
FLUSHES, LINE = 60, 5_000_000
MEMORY_BOUND = 150 * MB


def test_a_slow_reader_of_a_floods_events_keeps_server_memory_bounded() -> None:
    # every event kept (300 MB): memory holds 1 MiB of them, the rest is in the run's artifact on disk
    args = ["--RunRegistry.run_events_max_bytes=1073741824", "--RunRegistry.run_events_memory_bytes=1048576"]
    with jupyter_server(extra_args=args) as server:
        request(server, "POST", "api/agent/eval", {"cells": [{"code": "1"}], "session": "flood"})
        baseline = server.rss_bytes()
        assert baseline and server.reset_peak_memory()
        code = f"line = 'x' * {LINE}\nfor _ in range({FLUSHES}):\n    print(line, flush=True)\n"
        status, run = request(
            server,
            "POST",
            "api/agent/eval",
            {"cells": [{"code": code}], "session": "flood", "timeout": 600, "detach": True},
        )
        assert status == 202
        host, port = server.url.split("//", 1)[1].rstrip("/").split(":")
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
        sock.connect((host, int(port)))
        sock.sendall(
            (
                f"GET /api/agent/runs/{run['run_id']}/events?after=0 HTTP/1.1\r\nHost: {host}:{port}\r\n"
                f"Authorization: token {server.token}\r\n\r\n"
            ).encode()
        )
        stop, received = threading.Event(), [0]

        def read_slowly() -> None:  # 1 KB every 100 ms
            while not stop.is_set():
                try:
                    data = sock.recv(1024)
                except OSError:
                    return
                if not data:
                    return
                received[0] += len(data)
                stop.wait(0.1)

        reader = threading.Thread(target=read_slowly, daemon=True)
        reader.start()
        try:
            _, state = request(server, "GET", f"api/agent/runs/{run['run_id']}?wait=240", timeout=300)
            assert state["state"] == "complete", state
            grown = server.memory()["VmHWM"] - baseline
            assert grown < MEMORY_BOUND, f"server peak RSS grew by {grown / MB:.0f} MB"
            assert received[0] > 0  # the reader was being served all along
            assert received[0] < 10 * MB  # ... slowly
            assert state["events"] > FLUSHES  # every chunk was kept (no gap: the cap is 1 GiB)
        finally:
            stop.set()
            sock.close()
            reader.join(timeout=5)

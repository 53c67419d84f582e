"""Kernels the extension started do not outlive the server (a real server subprocess, SIGTERM)."""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from jupyter_agent_tools.testing.server import jupyter_server

pytestmark = pytest.mark.timeout(180)


def post_eval(server, body: dict) -> dict:
    request = urllib.request.Request(
        server.url + "api/agent/eval",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"token {server.token}"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split()[2]
    except OSError:
        return False
    return state != "Z"


def test_server_stop_shuts_down_session_and_per_call_kernels():
    pids = []
    with jupyter_server() as server:
        for name in ("one", "two"):
            answer = post_eval(
                server, {"cells": [{"code": "import os; print(os.getpid())"}], "session": name}
            )
            pids.append(int(answer["output"]))
        # a per-call kernel that is still running when the server stops
        per_call = threading.Thread(
            target=lambda: _swallow(
                post_eval,
                server,
                {
                    "cells": [{"code": "import os, time\nprint(os.getpid(), flush=True)\ntime.sleep(60)"}],
                    "mode": "per-call",
                    "timeout": 120,
                },
            ),
            daemon=True,
        )
        per_call.start()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            children = _kernel_children(server.process.pid)
            if len(children) >= 3:
                break
            time.sleep(0.2)
        children = _kernel_children(server.process.pid)
        assert len(children) >= 3
        assert all(alive(pid) for pid in pids)
    # the context manager sent SIGTERM and waited for the server to exit
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(alive(pid) for pid in children):
        time.sleep(0.2)
    assert not [pid for pid in children if alive(pid)]


def _swallow(fn, *args):
    with contextlib.suppress(Exception):  # the server goes away under this request: the point of the test
        fn(*args)


def _kernel_children(server_pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == server_pid and b"ipykernel_launcher" in cmdline:
            found.append(int(entry.name))
    return found

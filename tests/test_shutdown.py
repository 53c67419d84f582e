"""Kernels the extension started do not outlive the server (a real server subprocess, SIGTERM)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import IO

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from jupyter_agent_tools.testing.kernelspecs import RUN_IPYKERNEL, script_kernelspec
from jupyter_agent_tools.testing.server import jupyter_server

pytestmark = pytest.mark.timeout(180)


def post_eval(server, body: dict) -> dict:
    return post(server, "api/agent/eval", body)


def post(server, path: str, body: dict) -> dict:
    request = urllib.request.Request(
        server.url + path,
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
    with contextlib.ExitStack() as stack:
        with jupyter_server() as server:
            log = stack.enter_context(server.log_path.open(errors="replace"))  # read after the stop
            for name in ("one", "two"):
                answer = post_eval(
                    server, {"cells": [{"code": "import os; print(os.getpid())"}], "session": name}
                )
                pids.append(int(answer["output"]))
            # a per-call kernel that is still running when the server stops
            code = "import os, time\nprint(os.getpid(), flush=True)\ntime.sleep(60)"
            body = {"cells": [{"code": code}], "mode": "per-call", "timeout": 120}
            threading.Thread(target=lambda: _swallow(post_eval, server, body), daemon=True).start()
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                children = _kernel_children(server.process.pid)
                if len(children) >= 3:
                    break
                time.sleep(0.2)
            children = _kernel_children(server.process.pid)
            assert len(children) >= 3
            assert all(alive(pid) for pid in pids)
        # the context manager sent SIGTERM and waited for the server to exit (killed after 15 s)
        assert_gone(children, log)


def test_server_stop_kills_kernels_still_starting(tmp_path):
    """Kernels whose start is under way when the server stops (a per-call eval's, the pool's refill, a
    notebook run's) are killed, not waited for: the server's stop would outlast its grace and, killed,
    orphan a kernel that does not run ipykernel's parent poller yet."""
    # a kernel that takes ten minutes to start
    script_kernelspec(
        tmp_path / "share" / "kernels", "slow", "import runpy, time\ntime.sleep(600)\n" + RUN_IPYKERNEL
    )
    args = ["--MappingKernelManager.default_kernel_name=slow"]  # the pool fills with slow kernels
    with contextlib.ExitStack() as stack:
        with jupyter_server(extra_args=args, env={"JUPYTER_PATH": str(tmp_path / "share")}) as server:
            log = stack.enter_context(server.log_path.open(errors="replace"))  # read after the stop
            body = {"cells": [{"code": "1"}], "mode": "per-call", "kernel_name": "slow", "timeout": 120}
            threading.Thread(target=lambda: _swallow(post_eval, server, body), daemon=True).start()
            # and a run of a notebook without a kernel: the server's session starts one for it
            kernelspec = {"name": "slow", "display_name": "Slow", "language": "python"}
            notebook = new_notebook(cells=[new_code_cell("1")], metadata={"kernelspec": kernelspec})
            nbformat.write(notebook, server.root_dir / "nb.ipynb")
            run = ("api/agent/notebooks/nb.ipynb/run", {"all": True})
            threading.Thread(target=lambda: _swallow(post, server, *run), daemon=True).start()
            deadline = time.monotonic() + 60
            while len(starting := _kernel_children(server.process.pid, b"/slow/kernel_script.py")) < 3:
                assert time.monotonic() < deadline, f"3 kernels starting expected, found {starting}"
                time.sleep(0.2)
        assert_gone(starting, log)


def assert_gone(pids: list[int], log: IO[str]) -> None:
    """The processes exit within 10 s (a kernel whose server is gone exits within a second); survivors
    are killed, and the server's log is shown."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(alive(pid) for pid in pids):
        time.sleep(0.2)
    left = [pid for pid in pids if alive(pid)]
    for pid in left:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    assert not left, f"kernel processes {left} outlived the server; its log:\n{log.read()[-8000:]}"


def _swallow(fn, *args):
    with contextlib.suppress(Exception):  # the server goes away under this request: the point of the test
        fn(*args)


def _kernel_children(server_pid: int, marker: bytes = b"ipykernel_launcher") -> list[int]:
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
        if ppid == server_pid and marker in cmdline:
            found.append(int(entry.name))
    return found

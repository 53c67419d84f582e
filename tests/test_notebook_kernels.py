"""Kernels that notebook runs started do not pile up (real server, real kernels, a real websocket).

A run of a notebook without a jupyter session creates one with its kernel. Those kernels are shut down
(their jupyter session deleted) after ``NotebookKernels.idle_timeout`` unused, at the session sweep, and at
most ``NotebookKernels.max_kernels`` are kept, least recently used first; never a busy one, one a browser is
connected to, or one JupyterLab started.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from test_notebook_run import make, run

IDLE = 1.0  # NotebookKernels.idle_timeout (s) of the idle tests
SWEEP = 0.2  # cleanup_interval (s) of the idle tests
MAX = 3


async def session_paths(jp_fetch: Any) -> dict[str, str]:
    """Notebook path -> kernel id of every jupyter session."""
    listing = json.loads((await jp_fetch("api", "sessions")).body)
    return {s["path"]: s["kernel"]["id"] for s in listing}


async def kernel_ids(jp_fetch: Any) -> set[str]:
    return {k["id"] for k in json.loads((await jp_fetch("api", "kernels")).body)}


async def lab_session(jp_fetch: Any, path: str) -> str:
    """Open ``path`` the way JupyterLab does (POST /api/sessions); its kernel id."""
    body = {"path": path, "type": "notebook", "name": path, "kernel": {"name": "python3"}}
    response = await jp_fetch("api", "sessions", method="POST", body=json.dumps(body))
    return str(json.loads(response.body)["kernel"]["id"])


class TestAtMostMaxKernels:
    @pytest.fixture
    def jp_server_config(self) -> dict[str, Any]:
        return {
            "ServerApp": {"jpserver_extensions": {"jupyter_agent_tools": True}},
            # counts the kernel manager's kernels: no warm pool kernel beside the notebooks'
            "NotebookKernels": {"max_kernels": MAX},
            "KernelPool": {"size": 0},
        }

    async def test_twelve_runs_of_twelve_notebooks_leave_at_most_max_notebook_kernels(
        self, api, jp_fetch, jp_root_dir
    ):
        make(jp_root_dir, "lab.ipynb", "print('lab')")
        lab_kernel = await lab_session(jp_fetch, "lab.ipynb")
        await run(api, "lab.ipynb")  # runs in JupyterLab's kernel: never counted, never shut down
        for i in range(12):
            make(jp_root_dir, f"n{i}.ipynb", f"print({i})")
            answer = await run(api, f"n{i}.ipynb")
            assert answer["cells"][0]["output"] == f"{i}\n"
        sessions = await session_paths(jp_fetch)
        assert sorted(sessions) == ["lab.ipynb", "n10.ipynb", "n11.ipynb", "n9.ipynb"]  # the most recent
        assert await kernel_ids(jp_fetch) == set(sessions.values())  # no kernel without its session
        assert sessions["lab.ipynb"] == lab_kernel
        again = await run(api, "n0.ipynb")  # a notebook whose kernel went gets a new one
        assert again["cells"][0]["output"] == "0\n"
        assert sorted(await session_paths(jp_fetch)) == ["lab.ipynb", "n0.ipynb", "n10.ipynb", "n11.ipynb"]
        _, listing = await api("GET", "sessions")
        assert listing["totals"]["evictions"] == 10

    async def test_two_first_runs_of_a_notebook_at_once_start_one_kernel(self, api, jp_fetch, jp_root_dir):
        make(jp_root_dir, "twice.ipynb", "print('hi')")
        first, second = await asyncio.gather(run(api, "twice.ipynb"), run(api, "twice.ipynb"))
        assert first["kernel_id"] == second["kernel_id"]
        assert list(await session_paths(jp_fetch)) == ["twice.ipynb"]
        assert len(await kernel_ids(jp_fetch)) == 1


class TestIdleKernels:
    @pytest.fixture
    def jp_server_config(self) -> dict[str, Any]:
        return {
            "ServerApp": {"jpserver_extensions": {"jupyter_agent_tools": True}},
            "NotebookKernels": {"idle_timeout": IDLE},
            "EvalSessionManager": {"cleanup_interval": SWEEP},
        }

    async def test_an_unused_kernel_a_run_started_is_shut_down_but_busy_connected_and_lab_ones_stay(
        self, api, jp_fetch, jp_ws_fetch, jp_root_dir, agent_audit_events
    ):
        flag = Path(jp_root_dir) / "go"
        wait = f"import os, time\nwhile not os.path.exists({str(flag)!r}):\n    time.sleep(0.05)"
        make(jp_root_dir, "busy.ipynb", wait)
        make(jp_root_dir, "connected.ipynb", "y = 1")
        make(jp_root_dir, "idle.ipynb", "x = 1")
        make(jp_root_dir, "lab.ipynb", "z = 1")
        busy = asyncio.ensure_future(run(api, "busy.ipynb", timeout=600))
        while "busy.ipynb" not in await session_paths(jp_fetch):
            await asyncio.sleep(SWEEP / 4)
        connected = await run(api, "connected.ipynb")
        ws = await jp_ws_fetch("api", "kernels", connected["kernel_id"], "channels")
        lab_kernel = await lab_session(jp_fetch, "lab.ipynb")
        await run(api, "lab.ipynb")
        idle = await run(api, "idle.ipynb")  # used last: every other kernel has been unused longer

        # The idle one goes within a few sweeps of its timeout (bounded by the configured times)...
        for _ in range(int(20 * (IDLE + SWEEP) / SWEEP)):
            if "idle.ipynb" not in await session_paths(jp_fetch):
                break
            await asyncio.sleep(SWEEP)
        sessions = await session_paths(jp_fetch)
        assert "idle.ipynb" not in sessions, "the unused kernel was not shut down"
        assert idle["kernel_id"] not in await kernel_ids(jp_fetch)
        # ...while the busy one, the connected one and JupyterLab's, unused as long or longer, stay.
        assert {"busy.ipynb", "connected.ipynb", "lab.ipynb"} <= set(sessions)
        assert sessions["lab.ipynb"] == lab_kernel and not busy.done()
        culled = [e for e in agent_audit_events("session") if e["action"] == "idle_culled"]
        assert [(e["mode"], e["kernel_id"]) for e in culled] == [("notebook", idle["kernel_id"])]

        ws.close()  # the browser goes: its kernel is culled in turn
        for _ in range(int(20 * (IDLE + SWEEP) / SWEEP)):
            if "connected.ipynb" not in await session_paths(jp_fetch):
                break
            await asyncio.sleep(SWEEP)
        assert "connected.ipynb" not in await session_paths(jp_fetch)
        flag.write_text("")
        assert (await busy)["cells"][0]["status"] == "complete"
        assert "lab.ipynb" in await session_paths(jp_fetch)

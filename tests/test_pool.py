"""The warm kernel pool (KernelPool.size): per-call evals and new sessions take a started kernel,
the pool refills, no state crosses calls, pooled kernels go first under descriptor pressure and with the
server. Real server, real kernels; nothing here is timed."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_shutdown import _kernel_children, alive, post_eval

from jupyter_agent_tools.execution.faults import fd_usage
from jupyter_agent_tools.execution.kernel_session import KernelSession
from jupyter_agent_tools.testing.server import jupyter_server

pytestmark = [pytest.mark.timeout(180), pytest.mark.warm_pool]


def service_of(jp_serverapp: Any) -> Any:
    return jp_serverapp.web_app.settings["jupyter_agent_tools"].eval_service


async def gone(jp_serverapp: Any, kernel_id: str) -> None:
    """Wait (bounded) until the kernel manager no longer has ``kernel_id``."""
    for _ in range(300):
        if kernel_id not in jp_serverapp.kernel_manager.list_kernel_ids():
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"kernel {kernel_id} is still running")


async def pool_listing(api: Any) -> dict[str, Any]:
    status, listing = await api("GET", "sessions")
    assert status == 200
    return dict(listing["pool"])


async def wait_for_pool(api: Any, ready: int, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        pool = await pool_listing(api)
        if pool["ready"] == ready and pool["starting"] == 0:
            return pool
        assert time.monotonic() < deadline, f"pool never reached {ready} ready kernel(s): {pool}"
        await asyncio.sleep(0.1)


async def test_per_call_takes_a_pooled_kernel_which_is_replaced_and_never_reused(evaluate, api, jp_serverapp):
    pool = service_of(jp_serverapp).pool
    assert (await pool_listing(api))["size"] == 1
    await evaluate("1", session="starter")  # the first eval starts the filling
    await wait_for_pool(api, 1)
    pooled = set(pool.kernel_ids)
    first = await evaluate("x = 1\nimport os\nprint(os.getpid())", mode="per-call")
    assert first["cells"][0]["status"] == "complete"
    assert first["kernel_id"] in pooled, "the per-call eval ran on the pooled kernel"
    await gone(jp_serverapp, first["kernel_id"])  # shut down after the answer
    after = await wait_for_pool(api, 1)  # refilled
    assert after["taken"] == 1 and after["kernel_name"] == "python3"
    assert first["kernel_id"] not in pool.kernel_ids
    second = await evaluate("print(x)", mode="per-call")
    assert second["kernel_id"] != first["kernel_id"]
    assert second["cells"][0]["status"] == "error"
    assert "NameError" in second["output"], "no state leaks from one per-call eval to the next"
    assert second["output"].split()[0] != first["output"].split()[0]
    _status, listing = await api("GET", "sessions")
    assert [s["name"] for s in listing["sessions"]] == ["starter"], "pooled kernels are not sessions"


async def test_init_step_runs_on_the_pooled_kernel_when_taken(evaluate, api, jp_root_dir):
    (jp_root_dir / "sub").mkdir()
    (jp_root_dir / "sub" / "helper_mod.py").write_text("VALUE = 'from sub'\n")
    await evaluate("1", session="starter")
    await wait_for_pool(api, 1)
    result = await evaluate(
        "import os, helper_mod\nprint(os.getcwd())\nprint(os.environ['POOL_TEST'])\nprint(helper_mod.VALUE)",
        mode="per-call",
        cwd="sub",
        env={"POOL_TEST": "yes"},
    )
    assert (await pool_listing(api))["taken"] == 1
    cwd, env, value = result["output"].splitlines()
    assert Path(cwd).resolve() == (jp_root_dir / "sub").resolve()
    assert (env, value) == ("yes", "from sub")


async def test_a_new_session_draws_from_the_pool(evaluate, api, jp_serverapp):
    await evaluate("1", mode="per-call")  # starts the filling (no kernel ready yet: a cold start)
    await wait_for_pool(api, 1)
    pooled = set(service_of(jp_serverapp).pool.kernel_ids)
    session = await evaluate("y = 2", session="warm")
    assert session["kernel_id"] in pooled
    again = await evaluate("print(y)", session="warm")
    assert again["output"] == "2\n" and again["kernel_id"] == session["kernel_id"]
    await wait_for_pool(api, 1)


async def test_dead_pooled_kernel_is_not_handed_out(evaluate, api, jp_serverapp):
    await evaluate("1", session="starter")
    await wait_for_pool(api, 1)
    pool = service_of(jp_serverapp).pool
    (dead,) = pool.kernel_ids
    kernel = jp_serverapp.kernel_manager.get_kernel(dead)
    kernel.stop_restarter()  # not revived behind our back
    kernel.provisioner.process.kill()
    kernel.provisioner.process.wait()
    result = await evaluate("print('fresh')", mode="per-call")
    assert result["output"] == "fresh\n" and result["kernel_id"] != dead
    await gone(jp_serverapp, dead)  # the dead one was cleaned up


async def test_pooled_kernels_are_shut_down_first_when_descriptors_run_short(evaluate, api, jp_serverapp):
    service = service_of(jp_serverapp)
    await evaluate("1", session="keep")
    await wait_for_pool(api, 1)
    (pooled,) = service.pool.kernel_ids
    usage = fd_usage()
    assert usage is not None
    # Real descriptor counting: demand just more headroom than is free now; shutting the pooled kernel
    # down (its client sockets) frees enough, so no session has to go.
    service.kernels.fd_headroom = usage.headroom + 2
    session = KernelSession("probe", service.kernels)
    try:
        kernel_id, connection = await service.recovery.launch(session, "python3", "")
    finally:
        service.kernels.fd_headroom = 64
    try:
        assert kernel_id != pooled
        assert pooled not in jp_serverapp.kernel_manager.list_kernel_ids()
        assert session.recoveries["emfile_recoveries"] == 1
        _status, listing = await api("GET", "sessions")
        assert [s["name"] for s in listing["sessions"]] == ["keep"], "the idle session was spared"
        assert listing["pool"]["ready"] == 0, "the pool does not refill right away under pressure"
    finally:
        await connection.close()
        await service.kernels.shutdown(kernel_id)


class TestPoolDisabled:
    @pytest.fixture
    def jp_server_config(self) -> dict[str, Any]:
        return {
            "ServerApp": {"jpserver_extensions": {"jupyter_agent_tools": True}},
            "KernelPool": {"size": 0},
        }

    async def test_size_zero_starts_a_kernel_per_call_and_keeps_none(self, evaluate, api, jp_serverapp):
        before = set(jp_serverapp.kernel_manager.list_kernel_ids())
        first = await evaluate("z = 3", mode="per-call")
        second = await evaluate("print('z' in globals())", mode="per-call")
        assert second["output"] == "False\n" and first["kernel_id"] != second["kernel_id"]
        await gone(jp_serverapp, first["kernel_id"])
        await gone(jp_serverapp, second["kernel_id"])
        assert await pool_listing(api) == {
            "size": 0,
            "ready": 0,
            "starting": 0,
            "kernel_name": None,
            "taken": 0,
        }
        assert set(jp_serverapp.kernel_manager.list_kernel_ids()) == before


def test_server_stop_shuts_down_pooled_kernels_including_one_being_started():
    seen: set[int] = set()
    stop = threading.Event()
    with jupyter_server() as server:
        watcher = threading.Thread(target=_watch_children, args=(server.process.pid, seen, stop), daemon=True)
        watcher.start()
        post_eval(server, {"cells": [{"code": "1"}], "session": "one"})
        deadline = time.monotonic() + 60
        while _pool(server)["ready"] != 1:
            assert time.monotonic() < deadline, _pool(server)
            time.sleep(0.1)
        post_eval(server, {"cells": [{"code": "1"}], "mode": "per-call"})
        assert _pool(server)["taken"] == 1
        # stop now: the replacement is being started
    stop.set()
    watcher.join()
    assert len(seen) >= 2, seen  # the session's, the taken pooled one (and its replacement)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(alive(pid) for pid in seen):
        time.sleep(0.2)
    assert not [pid for pid in seen if alive(pid)]


def _pool(server: Any) -> dict[str, Any]:
    import json
    import urllib.request

    request = urllib.request.Request(
        server.url + "api/agent/sessions", headers={"Authorization": f"token {server.token}"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return dict(json.loads(response.read())["pool"])


def _watch_children(pid: int, seen: set[int], stop: threading.Event) -> None:
    while not stop.is_set():
        seen.update(_kernel_children(pid))
        time.sleep(0.02)

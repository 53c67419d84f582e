"""Eval on a real Jupyter Enterprise Gateway (tests/eg_harness.py): a per-user kernel cap of 2, kernels that
do not see the server's files, a kernel spec that takes 20 s to start, culling, a server restarted with
kernels left behind. The server talks to the gateway through the fault proxy (tests/gateway_harness.py),
which counts its requests.
"""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from eg_harness import HIDE_ENV, SLOW_START, EnterpriseGatewayProcess, start_enterprise_gateway
from gateway_fixtures import *  # noqa: F403

from jupyter_agent_tools.execution.gateway import PROCESS_ENV, SERVER_ENV
from jupyter_agent_tools.execution.session_manager import GATEWAY_HEARTBEAT
from jupyter_agent_tools.testing.server import jupyter_server

pytestmark = [pytest.mark.gateway, pytest.mark.timeout(240)]
USER = "agent-tests"  # KERNEL_USERNAME: whose kernels the gateway's per-user cap counts


@pytest.fixture(scope="module")
def enterprise_gateway() -> Iterator[EnterpriseGatewayProcess]:
    gateway = start_enterprise_gateway(max_kernels_per_user=2)
    try:
        yield gateway
    finally:
        gateway.stop()


@pytest.fixture
def gateway_target(enterprise_gateway: EnterpriseGatewayProcess) -> EnterpriseGatewayProcess:
    return enterprise_gateway


@pytest.fixture
def jp_argv() -> list[str]:
    return []  # the server's own defaults on a gateway (tests/conftest.py turns the pool off elsewhere)


@pytest.fixture
def jp_server_config(gateway_server_config, monkeypatch):
    monkeypatch.setenv("KERNEL_USERNAME", USER)  # jupyter_server sends every KERNEL_* to the gateway
    return gateway_server_config


def kernel_ids(gateway: EnterpriseGatewayProcess) -> set[str]:
    return {k["id"] for k in gateway.list_kernels()}


async def until(check: Any, timeout: float = 60.0) -> None:
    """Wait (bounded) until ``check()`` is true."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():
        assert loop.time() < deadline, "timed out waiting"
        await asyncio.sleep(0.1)


class TestCap:
    @pytest.fixture
    def jp_server_config(self, gateway_server_config, monkeypatch):
        monkeypatch.setenv("KERNEL_USERNAME", USER)
        config = dict(gateway_server_config)
        config["KernelPool"] = {"size": 1}  # set by the admin: a pool on a gateway only then
        return config

    async def test_a_pooled_kernel_gives_its_slot_to_the_users_notebook(
        self, evaluate, jp_fetch, jp_serverapp, jp_root_dir, enterprise_gateway
    ):
        """(a) The eval session and the warm pool hold the user's 2 slots; the notebook JupyterLab opens
        still gets its kernel: the pool's kernel is shut down and the creation tried again."""
        pool = jp_serverapp.web_app.settings["jupyter_agent_tools"].eval_service.pool
        assert pool.size == 1
        first = await evaluate("x = 1", session="s")
        await until(lambda: pool.ready_count == 1)
        pooled = pool.kernel_ids[0]
        assert kernel_ids(enterprise_gateway) == {first["kernel_id"], pooled}  # the cap (2) is reached
        status, refused = enterprise_gateway.request(
            "POST", "/api/kernels", body={"name": "python3", "env": {"KERNEL_USERNAME": USER}}
        )
        assert status == 403 and "max kernels per user" in refused["message"]

        (jp_root_dir / "nb.ipynb").write_text(
            json.dumps({"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5})
        )
        response = await jp_fetch(  # what JupyterLab does to open a notebook: jupyter_server's own route
            "api",
            "sessions",
            method="POST",
            body=json.dumps(
                {"path": "nb.ipynb", "type": "notebook", "name": "nb", "kernel": {"name": "python3"}}
            ),
        )
        assert response.code == 201
        notebook_kernel = json.loads(response.body)["kernel"]["id"]
        assert kernel_ids(enterprise_gateway) == {first["kernel_id"], notebook_kernel}
        assert pool.ready_count == 0 and pooled not in kernel_ids(enterprise_gateway)
        again = await evaluate("print(x)", session="s")  # the session kept its kernel and state
        assert again["output"] == "1\n" and again["kernel_id"] == first["kernel_id"]


async def test_b_idle_sessions_cost_no_gateway_requests(
    evaluate, jp_serverapp, fault_proxy, enterprise_gateway
):
    """(b) With the defaults, idle sessions on a gateway cost at most one request a minute each (the
    heartbeat, every 60 s; the sweep leaves liveness to it); 5 s before, 12 requests a minute each."""
    service = jp_serverapp.web_app.settings["jupyter_agent_tools"].eval_service
    assert service.sessions.heartbeat_interval == GATEWAY_HEARTBEAT
    assert service.pool.size == 0  # no warm pool on a gateway unless the admin sets one
    for name in ("one", "two"):
        assert (await evaluate("print(1)", session=name))["output"] == "1\n"
    assert len(kernel_ids(enterprise_gateway)) == 2  # no pooled kernel
    fault_proxy.reset()
    window = 6.0  # the heartbeat of before (5 s) asks at least once per session in any 6 s
    await asyncio.sleep(window)
    await service.sessions.sweep()  # the sweep of the idle sessions as well (every 30 s)
    requests = [r for r in fault_proxy.requests if r[1] != "/api/kernelspecs"]
    per_session_per_minute = len(requests) / 2 * 60 / window
    assert per_session_per_minute <= 1, requests
    assert fault_proxy.websocket_count == 2  # the sessions' websockets stay open: their liveness


async def test_c_a_cwd_the_kernel_lacks_is_said(evaluate, jp_root_dir, monkeypatch):
    """(c) The session's kernel starts with KERNEL_WORKING_DIR and the owner tag; where the server's
    directory does not exist in the kernel, the answer says so and where the code runs instead."""
    sub = jp_root_dir / "sub"
    sub.mkdir()
    code = "import os\nprint(os.getcwd())\nprint(os.environ.get('KERNEL_WORKING_DIR'))\n"
    code += f"print(bool(os.environ.get({SERVER_ENV!r})), bool(os.environ.get({PROCESS_ENV!r})))"
    seen = await evaluate(code, session="seen", cwd="sub")
    assert seen["output"] == f"{sub}\n{sub}\nTrue True\n"

    monkeypatch.setenv(HIDE_ENV, str(jp_root_dir))  # the kernel's mount namespace hides the server's root
    hidden = await evaluate(code, session="hidden", cwd="sub")
    assert hidden["cells"][0]["status"] == "complete"
    kernel_cwd = hidden["cells"][0]["output"].splitlines()[0]
    assert kernel_cwd != str(sub) and Path(kernel_cwd).name == "empty"
    assert f"The working directory {sub} does not exist where this kernel runs" in hidden["output"]
    assert f"the code runs in {kernel_cwd} instead" in hidden["output"]
    later = await evaluate("print(1)", session="hidden", cwd="sub")  # said on each call, not once
    assert "does not exist where this kernel runs" in later["output"]


async def test_f_a_slow_kernel_start_does_not_eat_the_timeout(evaluate):
    """(f) A kernel that takes SLOW_START (8) s to start, a call with a 5 s timeout: its 1-second cell runs,
    and the answer tells the start time."""
    answer = await evaluate(
        "import time\ntime.sleep(1)\nprint('done')", session="slow", kernel_name="slow", timeout=5
    )
    assert answer["cells"][0]["output"] == "done\n"
    assert answer["timed_out"] is False
    assert answer["kernel_start_seconds"] >= SLOW_START
    assert "A new kernel was started for this call in" in answer["output"]
    again = await evaluate("print(2)", session="slow", timeout=5)
    assert "kernel_start_seconds" not in again and "A new kernel" not in again["output"]


class TestRestart:
    """(g) A server killed with eval kernels on the gateway; its next start shuts them down."""

    @pytest.fixture
    def left_behind(self, enterprise_gateway, tmp_path) -> dict[str, str]:
        """A server process (a subprocess, with the state directory below) that started an eval session's
        kernel and a person's kernel on the gateway, killed: {"left": eval kernel, "person": the other}."""
        args = [
            f"--GatewayClient.url={enterprise_gateway.url}",
            f"--GatewayClient.auth_token={enterprise_gateway.token}",
            f"--AgentStores.state_dir={tmp_path / 'state'}",
        ]
        with (
            jupyter_server(tmp_path / "first", extra_args=args, env={"KERNEL_USERNAME": "killed"}) as first,
            first.client() as client,
        ):
            answer = client.json("POST", "api/agent/eval", {"cells": [{"code": "print(1)"}], "session": "a"})
            person = client.json("POST", "api/kernels", {"name": "python3"}, expect=201)
            first.process.send_signal(signal.SIGKILL)
            first.process.wait(10)
        return {"left": answer["kernel_id"], "person": person["id"]}

    @pytest.fixture
    def jp_server_config(self, gateway_server_config, monkeypatch, tmp_path, left_behind):
        monkeypatch.setenv("KERNEL_USERNAME", USER)
        return {**gateway_server_config, "AgentStores": {"state_dir": str(tmp_path / "state")}}

    async def test_g_the_next_start_shuts_down_the_kernels_left_behind(
        self, left_behind, enterprise_gateway, jp_serverapp, tmp_path
    ):
        record = tmp_path / "state" / "agent_tools_gateway_kernels.json"
        assert list(json.loads(record.read_text())["kernels"]) == [left_behind["left"]]
        # The server's start hook (pytest-jupyter's server does not run it): the clean-up starts there
        (extension,) = jp_serverapp.extension_manager.extension_apps["jupyter_agent_tools"]
        await extension._start_jupyter_server_extension(jp_serverapp)
        await until(lambda: left_behind["left"] not in kernel_ids(enterprise_gateway), timeout=30)
        assert left_behind["person"] in kernel_ids(enterprise_gateway)  # not ours: a person's
        # the record is rewritten once the gateway answered the shutdown, after the kernel left its list
        await until(lambda: json.loads(record.read_text())["kernels"] == {}, timeout=10)
        assert await extension._reaping == [left_behind["left"]]  # what it logged it shut down
        enterprise_gateway.delete_kernels([left_behind["person"]])


class TestCulledAndStopped:
    """A gateway of their own: one that culls kernels idle 3 s (connected ones too), then is killed."""

    @pytest.fixture(scope="class")
    def culling_gateway(self) -> Iterator[EnterpriseGatewayProcess]:
        gateway = start_enterprise_gateway(max_kernels_per_user=2, cull_idle_timeout=3)
        try:
            yield gateway
        finally:
            gateway.stop()

    @pytest.fixture
    def gateway_target(self, culling_gateway: EnterpriseGatewayProcess) -> EnterpriseGatewayProcess:
        return culling_gateway

    async def test_d_a_culled_session_kernel_is_restarted_and_said(self, evaluate, culling_gateway):
        """(d) The gateway culls an idle session's kernel; the next call runs in a new kernel, answers
        restarted: true and says the state is gone."""
        first = await evaluate("x = 1", session="culled")
        await until(lambda: first["kernel_id"] not in kernel_ids(culling_gateway), timeout=30)
        again = await evaluate("print('x' in globals())", session="culled")
        assert again["restarted"] is True
        assert again["kernel_id"] != first["kernel_id"]
        assert "Kernel had died and was restarted before this call" in again["output"]
        assert again["cells"][0]["output"] == "False\n"

    async def test_e_the_gateway_stopped_mid_call(self, evaluate, api, culling_gateway):
        """(e) The gateway is killed while a cell runs: the call ends with an error and a message (no
        hang), and the server keeps answering."""
        call = asyncio.ensure_future(
            api("POST", "eval", body={"cells": [{"code": "import time\ntime.sleep(60)"}], "session": "e"})
        )
        await until(lambda: len(kernel_ids(culling_gateway)) == 1 and culling_gateway.kernel_pids())
        await asyncio.sleep(1)  # the cell runs
        culling_gateway.kill()
        status, answer = await asyncio.wait_for(call, 60)
        assert status in (200, 502, 503), answer
        if status == 200:
            assert answer["error"] or answer["cells"][0]["status"] == "error", answer
        else:
            assert answer["message"]
        status, listing = await api("GET", "sessions")
        assert status == 200 and all(not s["busy"] for s in listing["sessions"])

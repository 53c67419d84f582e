"""Eval in gateway mode: a real jupyter_kernel_gateway with a token, faults injected by a real proxy."""

from __future__ import annotations

import asyncio
import json
import os

import pytest
from gateway_fixtures import *  # noqa: F403

pytestmark = [pytest.mark.gateway, pytest.mark.timeout(180)]


@pytest.fixture
def jp_server_config(gateway_server_config):
    config = dict(gateway_server_config)
    # No warm pool here: these tests count the kernel creations a call makes (TestGatewayPool has one).
    config["KernelRecovery"] = {"retry_backoff": 0.2}
    config["EvalSessionManager"] = {"heartbeat_interval": 0}
    config["KernelPool"] = {"size": 0}
    return config


async def gateway_settled(gateway_target, expected: set[str]) -> None:
    """Wait (bounded) until the gateway runs exactly ``expected`` (per-call kernels end after the answer)."""
    for _ in range(300):
        if {k["id"] for k in gateway_target.list_kernels()} == expected:
            return
        await asyncio.sleep(0.1)
    assert {k["id"] for k in gateway_target.list_kernels()} == expected


async def totals(api) -> dict[str, int]:
    _, listing = await api("GET", "sessions")
    return listing["totals"]


async def test_eval_end_to_end_through_token_gateway(evaluate, fault_proxy, gateway_target, jp_root_dir):
    result = await evaluate("x = 6 * 7", "print(x)\nimport os\nprint(os.environ['G'])", env={"G": "gw"})
    assert result["cells"][1]["output"] == "42\ngw\n"
    assert result["kernel_id"] in {k["id"] for k in gateway_target.list_kernels()}
    assert fault_proxy.websocket_count >= 1  # messages went over the gateway's websocket
    stdin = await evaluate("input('?')")
    assert stdin["cells"][0]["stdin_requested"] is True
    timed = await evaluate("import time; time.sleep(30)", timeout=2)
    assert timed["timed_out"] is True
    assert (await evaluate("print(x)"))["output"] == "42\n"


async def test_per_call_mode_on_gateway(evaluate, gateway_target):
    before = {k["id"] for k in gateway_target.list_kernels()}
    result = await evaluate("print(1 + 1)", mode="per-call")
    assert result["output"] == "2\n"
    await gateway_settled(gateway_target, before)


class TestGatewayPool:
    @pytest.fixture
    def jp_server_config(self, gateway_server_config):
        config = dict(gateway_server_config)
        config["EvalSessionManager"] = {"heartbeat_interval": 0}
        config["KernelPool"] = {"size": 1}
        return config

    async def test_per_call_takes_a_pooled_gateway_kernel_and_the_pool_refills(
        self, evaluate, api, gateway_target, jp_serverapp
    ):
        pool = jp_serverapp.web_app.settings["jupyter_agent_tools"].eval_service.pool

        async def pooled_kernel() -> str:
            for _ in range(600):
                if pool.ready_count == 1:
                    break
                await asyncio.sleep(0.1)
            (kernel_id,) = pool.kernel_ids
            return str(kernel_id)

        first = await evaluate("x = 1", mode="per-call")  # starts the filling
        pooled = await pooled_kernel()
        assert pooled in {k["id"] for k in gateway_target.list_kernels()}
        result = await evaluate(
            "import os\nprint('x' in globals(), os.environ['G'])", mode="per-call", env={"G": "pool"}
        )
        assert result["kernel_id"] == pooled and result["kernel_id"] != first["kernel_id"]
        assert result["output"] == "False pool\n"
        refill = await pooled_kernel()
        await gateway_settled(gateway_target, {refill})
        _, listing = await api("GET", "sessions")
        assert listing["pool"]["taken"] == 1 and listing["sessions"] == []
        await pool.shutdown()
        assert refill not in {k["id"] for k in gateway_target.list_kernels()}


@pytest.mark.parametrize("status", [500, 503])
async def test_one_5xx_on_kernel_creation_is_retried(evaluate, api, fault_proxy, status, agent_audit_events):
    fault_proxy.fail_kernel_posts(count=1, status=status)
    result = await evaluate("print('ok')", session=f"retry{status}")
    assert result["output"] == "ok\n"
    assert fault_proxy.kernel_posts == 2
    assert (await totals(api))["create_retries"] == 1
    recoveries = [(e["kind"], e["outcome"]) for e in agent_audit_events("recovery")]
    assert recoveries == [("create_retries", "retrying"), ("create_retries", "recovered")]


@pytest.mark.parametrize(("status", "answer"), [(500, 502), (503, 503)])
async def test_two_5xx_fail_after_exactly_one_retry(
    api, fault_proxy, status, answer, jp_fetch, agent_audit_events
):
    fault_proxy.fail_kernel_posts(count=2, status=status)
    response = await jp_fetch(
        "api",
        "agent",
        "eval",
        method="POST",
        raise_error=False,
        body=json.dumps({"cells": [{"code": "1"}], "session": "broken"}),
    )
    assert response.code == answer
    body = json.loads(response.body)
    assert f"HTTP {status}" in body["message"] and "tried twice" in body["message"]
    if answer == 503:
        assert response.headers.get("Retry-After")
    assert fault_proxy.kernel_posts == 2
    recoveries = [(e["kind"], e["outcome"]) for e in agent_audit_events("recovery")]
    assert recoveries == [("create_retries", "retrying"), ("create_retries", "failed")]
    (failed,) = agent_audit_events("execution")
    assert failed["status"] == "failed" and failed["http_status"] == answer
    fault_proxy.clear_faults()
    status_, again = await api("POST", "eval", body={"cells": [{"code": "print(3)"}], "session": "broken"})
    assert status_ == 200 and again["output"] == "3\n"  # the failed start left nothing stuck


async def test_4xx_on_kernel_creation_is_not_retried(api, fault_proxy):
    fault_proxy.fail_kernel_posts(count=1, status=403)
    status, answer = await api("POST", "eval", body={"cells": [{"code": "1"}], "session": "denied"})
    assert status == 400
    assert "HTTP 403" in answer["message"]
    assert fault_proxy.kernel_posts == 1


async def test_creation_timeout_599_is_retried_then_503(api, fault_proxy):
    fault_proxy.delay_kernel_posts(10, status=504)
    app_status, answer = await api("POST", "eval", body={"cells": [{"code": "1"}], "session": "slow"})
    assert app_status == 503
    assert "HTTP 599" in answer["message"]
    assert "KERNEL_LAUNCH_TIMEOUT" in answer["message"]  # what bounds a start, and what to raise
    assert fault_proxy.kernel_posts == 2


@pytest.fixture
def gateway_request_timeout() -> float:
    return 3.0


@pytest.mark.parametrize("gateway_target", ["fresh"], indirect=True)
async def test_gateway_killed_mid_session(evaluate, api, gateway_target, jp_root_dir, jp_fetch):
    (jp_root_dir / "nb.ipynb").write_text(
        json.dumps({"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5})
    )
    await evaluate("x = 1", session="s")
    gateway_target.kill()
    status, answer = await api("POST", "eval", body={"cells": [{"code": "print(x)"}], "session": "s"})
    assert status in (502, 503), answer
    assert answer["message"]
    # the server stays healthy: other routes answer, listing works, the session is not stuck busy
    status, listing = await api("GET", "sessions")
    assert status == 200
    assert all(not s["busy"] for s in listing["sessions"])
    status, _ = await api("GET", "notebooks", "nb.ipynb")
    assert status == 200
    assert os.path.exists(jp_root_dir / "nb.ipynb")
    await asyncio.sleep(0)

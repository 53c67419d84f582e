"""Proves the gateway test harness: real Kernel Gateway processes, the fault proxy, gateway-mode server."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from gateway_fixtures import *  # noqa: F403
from gateway_harness import FaultProxy, KernelGatewayProcess, gateway_http, pid_alive, wait_pids_gone
from jupyter_client.jsonutil import json_default
from jupyter_client.session import Session
from tornado import httpclient, websocket

pytestmark = pytest.mark.gateway


@pytest.fixture
def jp_server_config(gateway_server_config):
    return gateway_server_config


def kernel_info_request() -> str:
    msg = Session().msg("kernel_info_request", content={})
    msg["channel"] = "shell"
    return json.dumps(msg, default=json_default)


async def await_kernel_info_reply(ws: websocket.WebSocketClientConnection, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        assert remaining > 0, "no kernel_info_reply"
        raw = await asyncio.wait_for(ws.read_message(), remaining)
        assert raw is not None, f"websocket closed: {ws.close_code} {ws.close_reason}"
        msg = json.loads(raw)
        if msg.get("msg_type") == "kernel_info_reply":
            return msg


async def post_kernel(jp_fetch) -> tuple[int, Any]:
    response = await jp_fetch(
        "api", "kernels", method="POST", body=json.dumps({"name": "python3"}), raise_error=False
    )
    return response.code, json.loads(response.body) if response.body else None


async def test_server_creates_kernel_on_real_gateway_through_proxy(
    jp_fetch, jp_ws_fetch, jp_serverapp, fault_proxy: FaultProxy, kernel_gateway: KernelGatewayProcess
):
    from jupyter_server.gateway.managers import GatewayMappingKernelManager

    assert isinstance(jp_serverapp.kernel_manager, GatewayMappingKernelManager)
    code, model = await post_kernel(jp_fetch)
    assert code == 201, model
    assert fault_proxy.kernel_posts == 1
    assert fault_proxy.created_kernel_ids == [model["id"]]
    status, gw_model = kernel_gateway.request("GET", f"/api/kernels/{model['id']}")
    assert status == 200 and gw_model["id"] == model["id"]

    # websocket: client -> server -> GatewayWebSocketConnection (token) -> proxy -> gateway -> kernel
    ws = await jp_ws_fetch("api", "kernels", model["id"], "channels")
    try:
        ws.write_message(kernel_info_request())
        reply = await await_kernel_info_reply(ws)
        assert reply["content"]["status"] == "ok"
    finally:
        ws.close()
    assert fault_proxy.websockets_opened >= 1


async def test_injected_kernel_post_failure_then_success(jp_fetch, fault_proxy: FaultProxy):
    fault_proxy.fail_kernel_posts(count=1, status=500)
    code, body = await post_kernel(jp_fetch)
    assert code >= 500, body
    assert fault_proxy.kernel_posts == 1
    assert fault_proxy.created_kernel_ids == []

    code, model = await post_kernel(jp_fetch)
    assert code == 201, model
    assert fault_proxy.kernel_posts == 2
    assert fault_proxy.created_kernel_ids == [model["id"]]


async def test_503_fault_and_refused_connections(jp_fetch, fault_proxy: FaultProxy):
    fault_proxy.fail_kernel_posts(count=1, status=503, retry_after=1)
    code, _ = await post_kernel(jp_fetch)
    assert code == 503

    fault_proxy.refuse_connections()
    code, body = await post_kernel(jp_fetch)
    assert code == 503, body  # jupyter_server maps ConnectionRefusedError to 503
    assert fault_proxy.kernel_posts == 1  # the refused one never reached the proxy

    fault_proxy.refuse_connections(False)
    code, model = await post_kernel(jp_fetch)
    assert code == 201, model


@pytest.mark.parametrize("gateway_request_timeout", [2.0])
async def test_delayed_kernel_post_times_out_with_599(jp_fetch, jp_serverapp, fault_proxy: FaultProxy):
    from jupyter_server.gateway.gateway_client import GatewayClient

    held = 60.0  # the gateway's answer (a 504) would come this late: far past the 2 s request timeout
    fault_proxy.delay_kernel_posts(held, count=1, status=504)
    start = time.monotonic()
    code, body = await post_kernel(jp_fetch)
    elapsed = time.monotonic() - start
    assert code == 599, body  # the request timed out: the gateway's own answer would be its 504
    assert elapsed < held, elapsed  # without waiting for the gateway
    assert GatewayClient.instance().request_timeout == 2.0
    assert fault_proxy.kernel_posts == 1


def test_gateway_requires_token(kernel_gateway: KernelGatewayProcess, fault_proxy: FaultProxy):
    for url in (kernel_gateway.url, fault_proxy.url):
        status, _ = gateway_http(url, "GET", "/api/kernelspecs")
        assert status in (401, 403)
        status, _ = gateway_http(url, "GET", "/api/kernelspecs", token="wrong")
        assert status in (401, 403)
        status, _ = gateway_http(url, "POST", "/api/kernels", body={"name": "python3"})
        assert status in (401, 403)
        status, _ = gateway_http(url, "GET", "/api/kernelspecs", token=kernel_gateway.token)
        assert status == 200


@pytest.mark.parametrize("gateway_auth_token", ["wrong-token"])
async def test_server_with_wrong_gateway_token_is_refused(jp_fetch, fault_proxy: FaultProxy):
    code, body = await post_kernel(jp_fetch)
    assert code in (401, 403), body
    assert fault_proxy.created_kernel_ids == []


async def test_proxy_relays_kernel_websocket_and_close(
    kernel_gateway: KernelGatewayProcess, fault_proxy: FaultProxy
):
    status, model = gateway_http(
        fault_proxy.url, "POST", "/api/kernels", token=kernel_gateway.token, body={"name": "python3"}
    )
    assert status == 201, model
    ws_path = f"/api/kernels/{model['id']}/channels"

    # without the token the upgrade is refused by the gateway, and the proxy passes the status on
    with pytest.raises(httpclient.HTTPClientError) as info:
        await websocket.websocket_connect(fault_proxy.ws_url + ws_path)
    assert info.value.code in (401, 403)

    request = httpclient.HTTPRequest(
        fault_proxy.ws_url + ws_path, headers={"Authorization": f"token {kernel_gateway.token}"}
    )
    ws = await websocket.websocket_connect(request)
    ws.write_message(kernel_info_request())
    reply = await await_kernel_info_reply(ws)
    assert reply["content"]["status"] == "ok"
    assert fault_proxy.websocket_count == 1

    assert fault_proxy.close_websockets(code=1011, reason="drop") == 1
    assert await asyncio.wait_for(_drain(ws), 10) is None
    assert ws.close_code == 1011


async def _drain(ws: websocket.WebSocketClientConnection) -> None:
    while (msg := await ws.read_message()) is not None:
        del msg


@pytest.mark.parametrize("gateway_target", ["fresh"], indirect=True)
async def test_kill_removes_gateway_and_its_kernels(
    jp_fetch, gateway_target: KernelGatewayProcess, fault_proxy: FaultProxy
):
    code, model = await post_kernel(jp_fetch)
    assert code == 201, model
    assert gateway_target.request("GET", f"/api/kernels/{model['id']}")[0] == 200
    kernel_pids = gateway_target.kernel_pids()
    assert kernel_pids, "the gateway should have spawned a kernel process"

    killed = gateway_target.kill()
    assert gateway_target.pid in killed
    assert set(kernel_pids) <= set(killed)
    assert not gateway_target.alive()
    assert wait_pids_gone([gateway_target.pid, *kernel_pids], timeout=5) == []
    assert not any(pid_alive(p) for p in kernel_pids)

    # the server now sees the dead gateway through the proxy (502 from the proxy)
    code, body = await post_kernel(jp_fetch)
    assert code >= 500, body
    # teardown must still pass although the server holds a kernel on a dead gateway

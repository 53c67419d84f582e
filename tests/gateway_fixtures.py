"""pytest fixtures for gateway-mode tests (real Kernel Gateway, optional fault proxy).

Use in a test module with a star import (fixtures must be visible in the module namespace)::

    from gateway_fixtures import *  # noqa: F403

    pytestmark = pytest.mark.gateway


    @pytest.fixture
    def jp_server_config(gateway_server_config):
        return gateway_server_config

Fixture graph (scope)::

    kernel_gateway (session)       shared real gateway; never kill() it
    fresh_kernel_gateway (function) a private gateway, stopped at teardown; kill() it freely
    gateway_target (function)      the gateway under test: kernel_gateway, or fresh_kernel_gateway with
                                   @pytest.mark.parametrize("gateway_target", ["fresh"], indirect=True)
    fault_proxy (function)         FaultProxy in front of gateway_target (own thread + loop)
    gateway_url (function)         what the server talks to: fault_proxy.url (override to bypass the proxy)
    gateway_auth_token (function)  gateway_target.token (parametrize it directly to test a wrong token)
    gateway_request_timeout (function)  GatewayClient.request_timeout, default 60 (parametrize directly)
    gateway_server_config (function)    jp_server_config dict for gateway mode + GatewayClient isolation
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
from gateway_harness import (
    FaultProxy,
    KernelGatewayProcess,
    make_gateway_server_config,
    start_kernel_gateway,
)

__all__ = [
    "fault_proxy",
    "fresh_kernel_gateway",
    "gateway_auth_token",
    "gateway_request_timeout",
    "gateway_server_config",
    "gateway_target",
    "gateway_url",
    "kernel_gateway",
]


@pytest.fixture(scope="session")
def kernel_gateway() -> Iterator[KernelGatewayProcess]:
    """One real Kernel Gateway (token required) shared by the whole session."""
    gw = start_kernel_gateway()
    try:
        yield gw
    finally:
        gw.stop()


@pytest.fixture
def fresh_kernel_gateway() -> Iterator[KernelGatewayProcess]:
    """A private Kernel Gateway for one test (safe to kill()); stopped with all its kernels afterwards."""
    gw = start_kernel_gateway()
    try:
        yield gw
    finally:
        gw.stop()


@pytest.fixture
def gateway_target(request: pytest.FixtureRequest) -> KernelGatewayProcess:
    """The gateway a test talks to. Shared by default; indirect-parametrize with "fresh" for a private one."""
    which = getattr(request, "param", "shared")
    if which == "fresh":
        return request.getfixturevalue("fresh_kernel_gateway")
    if which != "shared":
        raise ValueError(f"gateway_target: unknown param {which!r} (use 'shared' or 'fresh')")
    return request.getfixturevalue("kernel_gateway")


@pytest.fixture
def fault_proxy(gateway_target: KernelGatewayProcess) -> Iterator[FaultProxy]:
    """A fault-injecting proxy in front of ``gateway_target``; kernels created through it are deleted on
    the gateway at teardown."""
    proxy = FaultProxy(gateway_target.url).start()
    try:
        yield proxy
    finally:
        proxy.stop()  # first: a delayed POST still waiting in the proxy must not create a kernel later
        gateway_target.delete_kernels(proxy.created_kernel_ids)


@pytest.fixture
def gateway_url(fault_proxy: FaultProxy) -> str:
    return fault_proxy.url


@pytest.fixture
def gateway_auth_token(gateway_target: KernelGatewayProcess) -> str:
    return gateway_target.token


@pytest.fixture
def gateway_request_timeout() -> float:
    return 60.0


@pytest.fixture
def gateway_server_config(
    gateway_url: str,
    gateway_auth_token: str,
    gateway_request_timeout: float,
    gateway_target: KernelGatewayProcess,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[dict[str, Any]]:
    """``jp_server_config`` for a server in gateway mode; isolates GatewayClient state per test.

    Setup: ``GatewayClient.clear_instance()`` (the server would otherwise reuse a singleton configured
    for an earlier test), and ``KERNEL_LAUNCH_TIMEOUT`` lowered so a short request timeout is honoured.
    Teardown: deletes kernels the test left on the gateway and makes the server forget its gateway
    kernels, so pytest-jupyter's server cleanup does not fail (it only ignores RuntimeError, and a DELETE
    to a dead gateway or stopped proxy raises HTTPError 502/503); clears the GatewayClient singleton.
    """
    from jupyter_server.gateway.gateway_client import GatewayClient

    GatewayClient.clear_instance()
    # init_connection_args() raises request_timeout to KERNEL_LAUNCH_TIMEOUT + launch_timeout_pad
    # (default 40 + 2) and writes both the class attribute and os.environ: restore them afterwards.
    pad = 0.5
    monkeypatch.setattr(GatewayClient, "KERNEL_LAUNCH_TIMEOUT", max(1, int(gateway_request_timeout - pad)))
    monkeypatch.setenv("KERNEL_LAUNCH_TIMEOUT", str(GatewayClient.KERNEL_LAUNCH_TIMEOUT))
    before: set[str] = set()
    with contextlib.suppress(Exception):
        before = {k["id"] for k in gateway_target.list_kernels()}

    config = make_gateway_server_config(
        gateway_url,
        gateway_auth_token,
        request_timeout=gateway_request_timeout,
        extra={"GatewayClient": {"launch_timeout_pad": pad}},
    )
    try:
        yield config
    finally:
        _forget_server_gateway_kernels(gateway_target)
        with contextlib.suppress(Exception):
            leftover = {k["id"] for k in gateway_target.list_kernels()} - before
            gateway_target.delete_kernels(leftover)
        GatewayClient.clear_instance()


def _forget_server_gateway_kernels(gateway: KernelGatewayProcess) -> None:
    from jupyter_server.gateway.managers import GatewayMappingKernelManager
    from jupyter_server.serverapp import ServerApp

    if not ServerApp.initialized():
        return
    km = getattr(ServerApp.instance(), "kernel_manager", None)
    if not isinstance(km, GatewayMappingKernelManager):
        return
    kernel_ids = list(km._kernels)
    gateway.delete_kernels(kernel_ids)
    for kid in kernel_ids:
        km.remove_kernel(kid)

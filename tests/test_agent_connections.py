"""Revoking or expiring an agent token closes every websocket it opened (real server, kernel, terminal).

Websockets outlive the request that authenticated them: a kernel's channels, a terminal, the event feed.
After ``DELETE /api/agent/tokens/NAME`` they are closed at once and can run nothing; a token that expires
(or is revoked by another process sharing the token database) has them closed within
``AgentIdentityProvider.connection_check_interval``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from tornado.websocket import WebSocketClientConnection, WebSocketClosedError

from jupyter_agent_tools.auth import AgentAuthorizer, AgentIdentityProvider

pytestmark = pytest.mark.timeout(300)

CHECK_INTERVAL = 0.2


@pytest.fixture
def jp_server_config() -> dict[str, Any]:
    return {
        "ServerApp": {
            "jpserver_extensions": {"jupyter_agent_tools": True, "jupyter_server_terminals": True},
            "identity_provider_class": AgentIdentityProvider,
            "authorizer_class": AgentAuthorizer,
        },
        "AgentIdentityProvider": {"connection_check_interval": CHECK_INTERVAL},
        "KernelPool": {"size": 0},
    }


def _execute(code: str) -> tuple[str, str]:
    msg_id = uuid.uuid4().hex
    header = {
        "msg_id": msg_id,
        "msg_type": "execute_request",
        "username": "",
        "session": "s",
        "version": "5.3",
    }
    content = {"code": code, "silent": False, "allow_stdin": False}
    message = {"header": header, "parent_header": {}, "metadata": {}, "content": content, "channel": "shell"}
    return msg_id, json.dumps({**message, "buffers": []})


async def _run(ws: WebSocketClientConnection, code: str) -> str:
    """Execute ``code`` over the kernel websocket; what it printed."""
    msg_id, message = _execute(code)
    await ws.write_message(message)
    printed = ""
    while True:
        reply = json.loads(await asyncio.wait_for(ws.read_message(), 60))
        if reply.get("parent_header", {}).get("msg_id") != msg_id:
            continue
        if reply["msg_type"] == "stream":
            printed += reply["content"]["text"]
        if reply["msg_type"] == "status" and reply["content"]["execution_state"] == "idle":
            return printed


async def _closed(ws: WebSocketClientConnection, within: float) -> bool:
    """Whether the server closes ``ws`` within ``within`` seconds (messages before that are skipped)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            message = await asyncio.wait_for(ws.read_message(), deadline - time.monotonic())
        except asyncio.TimeoutError:
            return False
        if message is None:
            return True
    return False


async def _open_all(jp_ws_fetch: Any, token: str, kernel: str, terminal: str) -> dict[str, Any]:
    headers = {"Authorization": f"token {token}"}
    return {
        "kernel": await jp_ws_fetch("api", "kernels", kernel, "channels", headers=headers),
        "terminal": await jp_ws_fetch("terminals", "websocket", terminal, headers=headers),
        "events": await jp_ws_fetch("api", "events", "subscribe", headers=headers),
    }


async def test_revoking_a_token_closes_its_websockets_and_they_run_nothing(
    http, jp_ws_fetch, jp_serverapp, jp_root_dir: Path
) -> None:
    status, made = await http("POST", "api/agent/tokens", {"name": "bot", "scopes": ["read", "execute"]})
    assert status == 201, made
    token = made["token"]
    other = (await http("POST", "api/agent/tokens", {"name": "other", "scopes": ["read", "execute"]}))[1]
    status, kernel = await http("POST", "api/kernels", {"name": "python3"}, token=token)
    assert status == 201, kernel
    status, terminal = await http("POST", "api/terminals", token=token)
    assert status == 200, terminal
    try:
        sockets = await _open_all(jp_ws_fetch, token, kernel["id"], terminal["name"])
        kept = await _open_all(jp_ws_fetch, other["token"], kernel["id"], terminal["name"])
        assert "42" in await _run(sockets["kernel"], "print(6 * 7)")
        status, answer = await http("DELETE", "api/agent/tokens/bot")
        assert status == 200, answer
        for name, ws in sockets.items():
            assert await _closed(ws, 5), name
            assert ws.close_code == 1008 and "revoked" in (ws.close_reason or ""), (name, ws.close_code)
        # the closed kernel websocket runs nothing
        ran = jp_root_dir / "ran-after-revoke"
        with contextlib.suppress(WebSocketClosedError):
            await sockets["kernel"].write_message(_execute(f"open({str(ran)!r}, 'w').close()")[1])
        await asyncio.sleep(1)
        assert not ran.exists()
        # another token's websockets stay open and work
        assert "7" in await _run(kept["kernel"], "print(3 + 4)")
        for ws in kept.values():
            ws.close()
    finally:
        await http("DELETE", f"api/terminals/{terminal['name']}")
        await jp_serverapp.kernel_manager.shutdown_kernel(kernel["id"])


async def test_an_expired_token_has_its_websockets_closed(http, jp_ws_fetch, jp_serverapp) -> None:
    status, made = await http(
        "POST", "api/agent/tokens", {"name": "brief", "scopes": ["read", "execute"], "expires_in": 60}
    )
    assert status == 201, made
    token = made["token"]
    status, kernel = await http("POST", "api/kernels", {"name": "python3"}, token=token)
    assert status == 201, kernel
    status, terminal = await http("POST", "api/terminals", token=token)
    assert status == 200, terminal
    try:
        sockets = await _open_all(jp_ws_fetch, token, kernel["id"], terminal["name"])
        assert not await _closed(sockets["kernel"], 3 * CHECK_INTERVAL)  # still active: left open
        # the token's expiry passes (written by another connection, as a second server's would be)
        path = jp_serverapp.identity_provider.tokens.path
        with contextlib.closing(sqlite3.connect(path)) as db, db:
            db.execute("UPDATE agent_tokens SET expires = ? WHERE name = 'brief'", (time.time() - 1,))
        for name, ws in sockets.items():
            assert await _closed(ws, 10 * CHECK_INTERVAL + 2), name
            assert "expired" in (ws.close_reason or ""), (name, ws.close_reason)
    finally:
        await http("DELETE", f"api/terminals/{terminal['name']}")
        await jp_serverapp.kernel_manager.shutdown_kernel(kernel["id"])

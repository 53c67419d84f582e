"""Revoking an agent token ends what the token started (issue 41), through the real routes.

Its pending approval requests are withdrawn (approving one answers 409 and nothing runs), its detached runs
are cancelled, an "approve for N seconds" grant does not pass to a new token of the same name, and its
kernel websocket forwards nothing from the revocation on, even to a client that never reads the close
frame. Agents are real agent tokens; the person is the server's own token.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import sqlite3
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from jupyter_agent_tools.approvals.service import ApprovalPolicy, Forbidden
from jupyter_agent_tools.audit.context import set_token
from jupyter_agent_tools.auth import AgentAuthorizer, AgentIdentityProvider
from jupyter_agent_tools.errors import AgentToolsError
from jupyter_agent_tools.runs import RunRegistry

pytestmark = pytest.mark.timeout(300)

REVOKED = "the agent's token was revoked"
CHECK_INTERVAL = 0.2


@pytest.fixture
def jp_server_config() -> dict[str, Any]:
    return {
        "ServerApp": {
            "jpserver_extensions": {"jupyter_agent_tools": True},
            "identity_provider_class": AgentIdentityProvider,
            "authorizer_class": AgentAuthorizer,
        },
        "AgentIdentityProvider": {"connection_check_interval": CHECK_INTERVAL},
        "KernelPool": {"size": 0},
    }


async def token(http: Any, name: str, scopes: list[str], ask: list[str] | None = None) -> dict[str, Any]:
    status, made = await http("POST", "api/agent/tokens", {"name": name, "scopes": scopes, "ask": ask or []})
    assert status == 201, made
    return dict(made)


async def revoke(http: Any, name: str) -> None:
    status, answer = await http("DELETE", f"api/agent/tokens/{name}")
    assert status == 200 and answer["status"] == "revoked", answer


async def test_a_revoked_tokens_pending_request_is_withdrawn_and_cannot_be_approved(
    http: Any, jp_root_dir: Path
) -> None:
    path = jp_root_dir / "nb.ipynb"
    nbformat.write(new_notebook(cells=[new_code_cell("print(1)", id="c1")]), str(path))
    before = path.read_bytes()
    bot = await token(http, "bot", ["read", "edit"], ask=["edit"])
    edit = {"action": "edit", "cell_id": "c1", "content": "print('agent')", "approval_wait": 0}
    status, pending = await http("POST", "api/agent/notebooks/nb.ipynb", edit, token=bot["token"])
    assert status == 202, pending
    url = f"api/agent/approvals/{pending['approval_id']}"
    assert (await http("GET", url))[1]["state"] == "pending"

    await revoke(http, "bot")
    status, request = await http("GET", url)
    assert status == 200 and request["state"] == "withdrawn", request
    assert request["reason"] == REVOKED
    assert (await http("GET", "api/agent/approvals"))[1]["pending"] == []
    status, refused = await http("POST", url, {"decision": "approve"})
    assert status == 409 and "already withdrawn" in refused["message"], refused
    await asyncio.sleep(0.5)  # an approved edit is applied at once: give it the chance it must not take
    assert path.read_bytes() == before


async def test_an_expired_tokens_pending_request_is_withdrawn(
    http: Any, jp_root_dir: Path, jp_serverapp: Any
) -> None:
    nbformat.write(new_notebook(cells=[new_code_cell("print(1)", id="c1")]), str(jp_root_dir / "nb.ipynb"))
    bot = await token(http, "bot", ["read", "edit"], ask=["edit"])
    edit = {"action": "edit", "cell_id": "c1", "content": "print('agent')", "approval_wait": 0}
    status, pending = await http("POST", "api/agent/notebooks/nb.ipynb", edit, token=bot["token"])
    assert status == 202, pending
    # its expiry passes (written by another connection, as a second server on the token file would)
    path = jp_serverapp.identity_provider.tokens.path
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        db.execute("UPDATE agent_tokens SET expires = ? WHERE name = 'bot'", (time.time() - 1,))
    url = f"api/agent/approvals/{pending['approval_id']}"
    for _ in range(int(20 * CHECK_INTERVAL / 0.05) + 40):
        request = (await http("GET", url))[1]
        if request["state"] != "pending":
            break
        await asyncio.sleep(0.05)
    assert request["state"] == "withdrawn" and request["reason"] == "the agent's token expired", request
    assert (await http("POST", url, {"decision": "approve"}))[0] == 409


async def test_a_revoked_tokens_detached_run_is_cancelled(http: Any, jp_root_dir: Path) -> None:
    finished = jp_root_dir / "finished"
    code = f"import time\nfor _ in range(1200):\n    time.sleep(0.1)\nopen({str(finished)!r}, 'w').close()"
    bot = await token(http, "bot", ["read", "execute"])
    body = {"cells": [{"code": code}], "session": "s", "timeout": 600, "detach": True}
    status, started = await http("POST", "api/agent/eval", body, token=bot["token"])
    assert status == 202, started
    run_url = f"api/agent/runs/{started['run_id']}"
    for _ in range(600):  # until its cell runs
        run = (await http("GET", run_url))[1]
        if run["cells_started"]:
            break
        await asyncio.sleep(0.05)
    assert run["state"] == "running", run

    await revoke(http, "bot")
    status, run = await http("GET", run_url + "?wait=30")
    assert status == 200 and run["state"] == "cancelled", run
    assert run["message"] == REVOKED
    assert not finished.exists()


async def test_an_approve_for_grant_does_not_pass_to_a_new_token_of_the_same_name(http: Any) -> None:
    body = {"cells": [{"code": "print('ran')"}], "session": "s", "approval_wait": 60}
    bot = await token(http, "bot", ["read", "execute"], ask=["execute"])
    call = asyncio.ensure_future(http("POST", "api/agent/eval", body, token=bot["token"]))
    for _ in range(600):
        listing = (await http("GET", "api/agent/approvals"))[1]
        if listing["pending"]:
            break
        await asyncio.sleep(0.05)
    approval_id = listing["pending"][0]["id"]
    decision = {"decision": "approve", "for_seconds": 600}
    assert (await http("POST", f"api/agent/approvals/{approval_id}", decision))[0] == 200
    status, answer = await call
    assert status == 200 and "ran" in answer["cells"][0]["output"], answer
    # the grant holds for this token: its next eval is approved at once
    status, answer = await http("POST", "api/agent/eval", {**body, "approval_wait": 0}, token=bot["token"])
    assert status == 200, answer

    await revoke(http, "bot")
    again = await token(http, "bot", ["read", "execute"], ask=["execute"])
    status, answer = await http("POST", "api/agent/eval", {**body, "approval_wait": 0}, token=again["token"])
    assert status == 202 and answer["approval_id"] > approval_id, answer  # asked anew
    assert (await http("POST", f"api/agent/runs/{answer['run_id']}/cancel", token=again["token"]))[0] == 200


def _execute(code: str) -> bytes:
    header = {
        "msg_id": uuid.uuid4().hex,
        "msg_type": "execute_request",
        "username": "",
        "session": "s",
        "version": "5.3",
    }
    content = {"code": code, "silent": False, "allow_stdin": False}
    message = {"header": header, "parent_header": {}, "metadata": {}, "content": content, "channel": "shell"}
    return json.dumps({**message, "buffers": []}).encode()


def _text_frame(payload: bytes) -> bytes:
    """One masked text frame, as a client sends it (RFC 6455 5.2)."""
    mask = os.urandom(4)
    length = len(payload)
    if length < 126:
        head = bytes([0x81, 0x80 | length])
    elif length < 1 << 16:
        head = bytes([0x81, 0x80 | 126]) + length.to_bytes(2, "big")
    else:
        head = bytes([0x81, 0x80 | 127]) + length.to_bytes(8, "big")
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


async def _raw_websocket(url: str, token: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A websocket client that never reads what the server sends (so it never answers a close frame):
    the handshake over a plain TCP connection, then frames written by hand."""
    parts = urlparse(url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    key = base64.b64encode(os.urandom(16)).decode()
    writer.write(
        (
            f"GET {parts.path} HTTP/1.1\r\nHost: {parts.netloc}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
            f"Authorization: token {token}\r\n\r\n"
        ).encode()
    )
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
    assert head.startswith(b"HTTP/1.1 101"), head
    return reader, writer


async def _wait_for(path: Path, seconds: float) -> bool:
    for _ in range(int(seconds * 20)):
        if path.exists():
            return True
        await asyncio.sleep(0.05)
    return path.exists()


async def test_a_revoked_tokens_kernel_websocket_forwards_nothing_even_unanswered(
    http: Any, jp_ws_fetch: Any, jp_serverapp: Any, jp_http_port: int, jp_base_url: str, jp_root_dir: Path
) -> None:
    bot = await token(http, "bot", ["read", "execute"])
    status, kernel = await http("POST", "api/kernels", {"name": "python3"}, token=bot["token"])
    assert status == 201, kernel
    url = f"ws://127.0.0.1:{jp_http_port}{jp_base_url}api/kernels/{kernel['id']}/channels"
    before, after = jp_root_dir / "before-revoke", jp_root_dir / "after-revoke"
    try:
        _reader, writer = await _raw_websocket(url, bot["token"])
        writer.write(_text_frame(_execute(f"open({str(before)!r}, 'w').close()")))
        assert await _wait_for(before, 60)  # the agent's websocket reaches the kernel

        await revoke(http, "bot")
        # sent after the revocation, without reading (nor answering) the server's close frame
        writer.write(_text_frame(_execute(f"open({str(after)!r}, 'w').close()")))
        await writer.drain()
        await asyncio.sleep(1)
        # the person's own websocket: the kernel runs in order, so a forwarded message would have run first
        person = await jp_ws_fetch("api", "kernels", kernel["id"], "channels")
        done = jp_root_dir / "person-ran"
        await person.write_message(_execute(f"open({str(done)!r}, 'w').close()").decode())
        assert await _wait_for(done, 60)
        assert not after.exists()
        person.close()
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()
    finally:
        await jp_serverapp.kernel_manager.shutdown_kernel(kernel["id"])


async def test_a_token_that_asks_but_executes_unasked_is_warned_about(http: Any) -> None:
    made = await token(http, "editor", ["read", "edit", "execute"], ask=["edit"])
    [warning] = made["warnings"]
    assert "jpserver-" in warning and "approve its own requests" in warning and "execute" in warning
    bound = await token(http, "bound", ["read", "edit", "execute"], ask=["edit", "execute"])
    assert bound["warnings"] == []
    no_code = await token(http, "writer", ["read", "edit"], ask=["edit"])
    assert no_code["warnings"] == []
    plain = await token(http, "plain", ["read", "execute"])
    assert plain["warnings"] == []


async def test_a_call_past_the_door_when_its_token_ended_neither_asks_nor_runs(tmp_path: Path) -> None:
    """A request authenticated just before its token was revoked reaches the services after the signal:
    the gate and the run registry remember the ended token and refuse it."""
    policy = ApprovalPolicy(db_path=str(tmp_path / "approvals.db"))
    registry = RunRegistry(runs_db_path=":memory:")
    try:
        set_token("t1")
        policy.withdraw_token("t1", REVOKED)
        registry.cancel_token("t1", REVOKED)
        ask = {"agent": "agent:bot", "door": "http", "action": "edit", "path": None, "summary": "s"}
        with pytest.raises(Forbidden, match="token was revoked"):
            await policy.request(**ask, details={})

        async def call(emit: Any, cancel: Any) -> dict[str, Any]:
            return {}

        with pytest.raises(AgentToolsError, match="token was revoked") as refused:
            registry.start("eval", "s", call)
        assert refused.value.status == 403
        set_token("t2")  # another token (a new one of the same name) asks as before
        assert (await policy.request(**ask, details={})).state == "pending"
    finally:
        set_token(None)
        policy.stop()
        await registry.shutdown()

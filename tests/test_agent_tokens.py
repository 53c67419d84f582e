"""Agent tokens on a real server (in process) with real kernels and terminals.

The server runs with the two documented lines (``AgentIdentityProvider``, ``AgentAuthorizer``). Tokens are
created through ``/api/agent/tokens`` with the server's own token, then used the way an agent would: on
this extension's routes, the contents API, ``/files``, kernels and their websocket, sessions, terminals and
their websocket, kernelspecs, events, and the MCP endpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sqlite3
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import nbformat
import pytest
from jupyter_server.base.handlers import JupyterHandler
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from nbformat.v4 import new_code_cell, new_notebook
from tornado import web
from tornado.httpclient import HTTPClientError
from tornado.websocket import WebSocketClientConnection

from jupyter_agent_tools.auth import AgentAuthorizer, AgentIdentityProvider

pytestmark = pytest.mark.timeout(300)

AGENT_CLASSES = {
    "identity_provider_class": AgentIdentityProvider,
    "authorizer_class": AgentAuthorizer,
}


@pytest.fixture
def jp_server_config() -> dict[str, Any]:
    return {
        "ServerApp": {
            "jpserver_extensions": {"jupyter_agent_tools": True, "jupyter_server_terminals": True},
            **AGENT_CLASSES,
        },
        "KernelPool": {"size": 0},
        "EvalSessionManager": {"max_sessions": 2},
    }


def _notebook(path: Path, code: str = "print(1)") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(new_notebook(cells=[new_code_cell(code, id="c1")]), str(path))
    return path


@pytest.fixture
def files(jp_root_dir: Path) -> Path:
    """reports/a.ipynb (inside the usual globs), secret.ipynb and secret.txt (outside)."""
    _notebook(jp_root_dir / "reports" / "a.ipynb")
    _notebook(jp_root_dir / "secret.ipynb", "print('secret')")
    (jp_root_dir / "secret.txt").write_text("the secret")
    return jp_root_dir


@pytest.fixture
def http(http_server_client: Any, jp_base_url: str, jp_serverapp: Any) -> Any:
    """``http(method, url, body=None, token=<server's>)`` -> (status, JSON or text, headers); ``url`` is
    sent as is (no escaping), so traversal attempts reach the server as written."""

    async def call(
        method: str,
        url: str,
        body: Any = None,
        token: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, Any, Any]:
        sent = {"Authorization": f"token {token or jp_serverapp.identity_provider.token}", **(headers or {})}
        data = None
        if body is not None or method in ("POST", "PUT", "PATCH"):
            data = json.dumps(body if body is not None else {}).encode()
        response = await http_server_client.fetch(
            jp_base_url + url,
            method=method,
            body=data,
            headers=sent,
            raise_error=False,
            request_timeout=120,
            follow_redirects=False,
            allow_nonstandard_methods=True,
        )
        text = response.body.decode() if response.body else ""
        try:
            parsed = json.loads(text) if text else None
        except ValueError:
            parsed = text
        return response.code, parsed, response.headers

    return call


@pytest.fixture
def make_token(http: Any) -> Any:
    async def make(name: str, scopes: list[str], paths: list[str] | None = None, **extra: Any) -> str:
        body: dict[str, Any] = {"name": name, "scopes": scopes, **extra}
        if paths is not None:
            body["paths"] = paths
        status, answer, _ = await http("POST", "api/agent/tokens", body)
        assert status == 201, answer
        assert answer["user"] == f"agent:{name}" and answer["token"].startswith("jat_")
        return str(answer["token"])

    return make


async def _ws(jp_ws_fetch: Any, token: str, *parts: str) -> WebSocketClientConnection | int:
    """A websocket opened with ``token``, or the HTTP status that refused it."""
    try:
        return await jp_ws_fetch(*parts, headers={"Authorization": f"token {token}"})
    except HTTPClientError as e:
        return e.code


# ------------------------------------------------------------------------ each scope on each route family

# (label, method, url, body, the scope it needs or None for never); "{k}" is a kernel id, "{t}" a terminal
ROUTES: list[tuple[str, str, str, Any, str | None]] = [
    ("agent notebook read", "GET", "api/agent/notebooks/reports/a.ipynb", None, "read"),
    (
        "agent notebook edit",
        "POST",
        "api/agent/notebooks/reports/a.ipynb",
        {"action": "insert", "content": "z"},
        "edit",
    ),
    ("agent session list", "GET", "api/agent/sessions", None, "read"),
    (
        "agent eval",
        "POST",
        "api/agent/eval",
        {"cells": [{"code": "open('ran-{scope}', 'w').close()"}]},
        "execute",
    ),
    ("agent run", "POST", "api/agent/notebooks/reports/a.ipynb/run", {"all": True}, "edit+execute"),
    ("contents read", "GET", "api/contents/reports/a.ipynb", None, "read"),
    ("contents list", "GET", "api/contents/reports", None, "read"),
    ("files read", "GET", "files/reports/a.ipynb", None, "read"),
    (
        "contents write",
        "PUT",
        "api/contents/reports/new-{scope}.txt",
        {"type": "file", "format": "text", "content": "x"},
        "edit",
    ),
    ("contents delete", "DELETE", "api/contents/reports/a.ipynb", None, "edit"),
    ("kernel list", "GET", "api/kernels", None, "read"),
    ("kernel start", "POST", "api/kernels", {"name": "python3"}, "execute"),
    ("kernel interrupt", "POST", "api/kernels/{k}/interrupt", None, "execute"),
    ("session list", "GET", "api/sessions", None, "read"),
    (
        "session create",
        "POST",
        "api/sessions",
        {"path": "reports/b.ipynb", "type": "notebook", "kernel": {"name": "python3"}},
        "execute",
    ),
    ("kernelspecs", "GET", "api/kernelspecs", None, "read"),
    ("terminal list", "GET", "api/terminals", None, "execute"),
    ("terminal create", "POST", "api/terminals", None, "execute"),
    ("status", "GET", "api/status", None, "read"),
    ("emit an event", "POST", "api/events", {"schema_id": "x", "version": "1", "data": {}}, None),
    ("shut the server down", "POST", "api/shutdown", None, None),
    ("create a token", "POST", "api/agent/tokens", {"name": "more", "scopes": ["read"]}, None),
]
GRANTS = {"read": {"read"}, "edit": {"read", "edit"}, "execute": {"execute"}}


def _allowed(needs: str | None, scope: str) -> bool:
    return needs is not None and all(n in GRANTS[scope] for n in needs.split("+"))


@pytest.mark.parametrize("scope", ["read", "edit", "execute"])
async def test_each_scope_on_each_route_family(
    scope, http, make_token, files, jp_serverapp, jp_ws_fetch, agent_audit_events
) -> None:
    token = await make_token(f"bot-{scope}", [scope])
    status, kernel, _ = await http("POST", "api/kernels", {"name": "python3"})  # the server's own kernel
    assert status == 201
    status, terminal, _ = await http("POST", "api/terminals")
    assert status == 200
    notebook = files / "reports" / "a.ipynb"
    before = notebook.read_bytes()
    try:
        for label, method, url, body, needs in ROUTES:
            url = url.format(k=kernel["id"], t=terminal["name"], scope=scope)
            if isinstance(body, dict) and "cells" in body:
                body = {"cells": [{"code": body["cells"][0]["code"].format(scope=scope)}]}
            kernels = set(jp_serverapp.kernel_manager.list_kernel_ids())
            terminals = len(jp_serverapp.web_app.settings["terminal_manager"].terminals)
            if label == "contents delete" and _allowed(needs, scope):
                continue  # allowed: checked by the edit scope below without losing the notebook
            status, answer, _ = await http(method, url, body, token=token)
            if _allowed(needs, scope):
                assert status < 400, (scope, label, status, answer)
                before = notebook.read_bytes()
                continue
            assert status == 403, (scope, label, status, answer)
            message = answer["message"] if isinstance(answer, dict) else answer
            if needs is not None and isinstance(answer, dict):
                missing = next(n for n in needs.split("+") if n not in GRANTS[scope])
                assert f"needs the '{missing}' scope" in message, (label, message)
            # nothing was done
            assert notebook.read_bytes() == before, label
            assert set(jp_serverapp.kernel_manager.list_kernel_ids()) == kernels, label
            assert len(jp_serverapp.web_app.settings["terminal_manager"].terminals) == terminals, label
        assert (files / f"ran-{scope}").exists() == (scope == "execute")
        assert (files / "reports" / f"new-{scope}.txt").exists() == (scope == "edit")

        # the websockets: a kernel's channels and a terminal
        kernel_ws = await _ws(jp_ws_fetch, token, "api", "kernels", kernel["id"], "channels")
        terminal_ws = await _ws(jp_ws_fetch, token, "terminals", "websocket", terminal["name"])
        for ws in (kernel_ws, terminal_ws):
            if scope == "execute":
                assert isinstance(ws, WebSocketClientConnection), ws
                ws.close()
            else:
                assert ws == 403
    finally:
        await http("DELETE", f"api/terminals/{terminal['name']}")
        for kernel_id in list(jp_serverapp.kernel_manager.list_kernel_ids()):
            await jp_serverapp.kernel_manager.shutdown_kernel(kernel_id)

    refusals = [e for e in agent_audit_events("refusal") if e["user"] == f"agent:bot-{scope}"]
    assert refusals and all("reason" in e for e in refusals)
    if scope != "execute":
        assert any(e["resource"] == "kernels" and "'execute' scope" in e["reason"] for e in refusals)
    assert {e["route"] for e in refusals} >= {"ShutdownHandler", "tokens"}


async def test_execute_scope_talks_to_a_kernel_through_its_websocket(http, make_token, jp_ws_fetch) -> None:
    token = await make_token("runner", ["execute"])
    status, kernel, _ = await http("POST", "api/kernels", {"name": "python3"}, token=token)
    assert status == 201, kernel
    ws = await _ws(jp_ws_fetch, token, "api", "kernels", kernel["id"], "channels")
    assert isinstance(ws, WebSocketClientConnection)
    msg_id = uuid.uuid4().hex
    header = {
        "msg_id": msg_id,
        "msg_type": "execute_request",
        "username": "",
        "session": "s",
        "version": "5.3",
    }
    ws.write_message(
        json.dumps(
            {
                "header": header,
                "parent_header": {},
                "metadata": {},
                "content": {"code": "print(6 * 7)", "silent": False, "allow_stdin": False},
                "channel": "shell",
                "buffers": [],
            }
        )
    )
    printed = ""
    deadline = time.monotonic() + 60
    while "42" not in printed and time.monotonic() < deadline:
        message = json.loads(await asyncio.wait_for(ws.read_message(), 60))
        if message.get("parent_header", {}).get("msg_id") == msg_id and message["msg_type"] == "stream":
            printed += message["content"]["text"]
    ws.close()
    assert "42" in printed
    status, _, _ = await http("DELETE", f"api/kernels/{kernel['id']}", token=token)
    assert status == 204


# ------------------------------------------------------------------------------ paths and traversal


async def test_path_globs_confine_every_route_with_traversal_attempts(http, make_token, files) -> None:
    token = await make_token("reporter", ["edit"], ["reports/**"])
    secret = (files / "secret.ipynb").read_bytes()
    os.symlink(files / "secret.ipynb", files / "reports" / "link.ipynb")
    os.symlink(files, files / "reports" / "up")
    absent_status, absent, _ = await http("GET", "api/contents/nothere.txt", token=token)
    assert absent_status == 404 and absent["message"].startswith("No such file or directory"), absent
    attempts = [
        ("GET", "api/contents/secret.txt", None),
        ("GET", "api/contents/reports/../secret.txt", None),
        ("GET", "api/contents/reports/%2e%2e/secret.txt", None),
        ("GET", "api/contents/reports%2F..%2Fsecret.txt", None),
        ("GET", "api/contents/reports/./../secret.txt", None),
        ("GET", "api/contents/", None),
        ("GET", "api/contents/reports/link.ipynb", None),  # a symlink out of the globs
        ("GET", "api/contents/reports/up/secret.txt", None),  # a symlinked directory
        ("GET", "files/secret.txt", None),
        ("GET", "files/reports/../secret.txt", None),
        ("GET", "api/agent/notebooks/secret.ipynb", None),
        ("GET", "api/agent/notebooks/reports/%2e%2e/secret.ipynb", None),
        ("GET", "api/agent/notebooks/reports/link.ipynb", None),
        ("POST", "api/agent/notebooks/secret.ipynb", {"action": "insert", "content": "x"}),
        ("PUT", "api/contents/secret.ipynb", {"type": "file", "format": "text", "content": "x"}),
        ("PATCH", "api/contents/reports/a.ipynb", {"path": "stolen.ipynb"}),  # rename out of the globs
        ("POST", "api/contents/reports", {"copy_from": "secret.ipynb"}),  # copy into them
        ("DELETE", "api/contents/secret.ipynb", None),
        ("GET", "nbconvert/html/secret.ipynb", None),
    ]
    for method, url, body in attempts:
        status, answer, _ = await http(method, url, body, token=token)
        assert status == 404, (method, url, status, answer)
        if isinstance(answer, dict) and url.startswith("api/contents"):  # worded as a missing file
            assert answer["message"].startswith("No such file or directory"), answer
    assert (files / "secret.ipynb").read_bytes() == secret
    assert (files / "reports" / "a.ipynb").exists() and not (files / "stolen.ipynb").exists()
    assert sorted(p.name for p in (files / "reports").iterdir()) == ["a.ipynb", "link.ipynb", "up"]
    # inside the globs everything works
    for method, url, body in [
        ("GET", "api/contents/reports", None),
        ("GET", "api/contents/reports/a.ipynb", None),
        ("GET", "files/reports/a.ipynb", None),
        ("GET", "api/agent/notebooks/reports/a.ipynb", None),
        ("POST", "api/agent/notebooks/reports/a.ipynb", {"action": "insert", "content": "y"}),
        ("PUT", "api/contents/reports/new.txt", {"type": "file", "format": "text", "content": "x"}),
        ("PATCH", "api/contents/reports/new.txt", {"path": "reports/renamed.txt"}),
    ]:
        status, answer, _ = await http(method, url, body, token=token)
        assert status < 400, (method, url, status, answer)
    assert (files / "reports" / "renamed.txt").read_text() == "x"


async def test_path_globs_confine_mcp_tools(http, make_token, files, jp_http_port, jp_base_url) -> None:
    token = await make_token("reporter", ["read"], ["reports/**"])
    url = f"http://127.0.0.1:{jp_http_port}{jp_base_url}api/agent/mcp"
    async with mcp_session(url, token) as session:
        inside = await session.call_tool("notebook_read", {"path": "reports/a.ipynb"})
        assert not inside.is_error, inside
        for path in ("secret.ipynb", "reports/../secret.ipynb", "/secret.ipynb"):
            outside = await session.call_tool("notebook_read", {"path": path})
            assert outside.is_error and "not found" in outside.content[0].text.lower(), outside
            assert "secret')" not in outside.content[0].text
        listing = await session.call_tool("file_list", {"path": "reports", "recursive": True})
        assert not listing.is_error, listing
        assert "secret" not in listing.content[0].text and "reports/a.ipynb" in listing.content[0].text
        root = await session.call_tool("file_list", {"path": ""})
        assert root.is_error and "secret" not in root.content[0].text
        # a missing scope is a tool error naming it, and nothing runs
        ran = await session.call_tool("eval", {"cells": [{"code": "open('mcp-ran', 'w').close()"}]})
        assert ran.is_error and "needs the 'execute' scope" in ran.content[0].text, ran
    assert not (files / "mcp-ran").exists()


async def test_path_globs_confine_create_files_and_resources(
    http, make_token, files, jp_http_port, jp_base_url
) -> None:
    """A token limited to reports/** creates and lists only there, over HTTP and MCP (tools, resources)."""
    token = await make_token("maker", ["edit"], ["reports/**"])
    reader = await make_token("reader", ["read"], ["reports/**"])
    status, made, _ = await http("POST", "api/agent/notebooks/reports/new/n.ipynb", {"action": "create",
                                 "parents": True}, token=token)  # fmt: skip
    assert status == 201, made
    for path in ("outside.ipynb", "reports/../outside.ipynb", "other/n.ipynb"):
        status, answer, _ = await http(
            "POST", f"api/agent/notebooks/{path}", {"action": "create", "parents": True}, token=token
        )
        assert status == 404, (path, status, answer)
    status, answer, _ = await http(
        "POST", "api/agent/notebooks/reports/x.ipynb", {"action": "create"}, token=reader
    )
    assert status == 403 and "scope" in answer["message"], answer
    assert not (files / "outside.ipynb").exists() and not (files / "other").exists()
    assert not (files / "reports" / "x.ipynb").exists()
    status, listing, _ = await http("GET", "api/agent/files?path=reports&recursive=1", token=reader)
    assert status == 200 and {e["path"] for e in listing["entries"]} >= {
        "reports/a.ipynb",
        "reports/new/n.ipynb",
    }
    for query in ("", "?glob=**/*.ipynb", "?path=reports/..", "?path=other"):
        status, answer, _ = await http("GET", f"api/agent/files{query}", token=reader)
        assert status in (400, 404) and "secret" not in json.dumps(answer), (query, answer)
    url = f"http://127.0.0.1:{jp_http_port}{jp_base_url}api/agent/mcp"
    async with mcp_session(url, reader) as session:
        created = await session.call_tool("notebook_edit", {"path": "reports/m.ipynb", "action": "create"})
        assert created.is_error and "scope" in created.content[0].text, created
        found = await session.call_tool("file_list", {"path": "reports", "glob": "**/*.ipynb"})
        assert [e["path"] for e in found.structured_content["entries"]] == [
            "reports/a.ipynb",
            "reports/new/n.ipynb",
        ]
        resources = await session.list_resources()
        assert sorted(str(r.name) for r in resources.resources) == ["reports/a.ipynb", "reports/new/n.ipynb"]
        with pytest.raises(Exception) as refused:
            await session.read_resource("jupyter://notebooks/secret.ipynb")
        assert refused.value.error.code == -32002 and "secret')" not in str(refused.value)
        inside = await session.read_resource("jupyter://notebooks/reports/a.ipynb")
        assert "print(1)" in inside.contents[0].text


@contextlib.asynccontextmanager
async def mcp_session(url: str, token: str) -> AsyncIterator[ClientSession]:
    async with (
        create_mcp_http_client(headers={"Authorization": f"token {token}"}) as client,
        streamable_http_client(url, http_client=client) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


# ----------------------------------------------------------------------------- expiry and revocation


async def test_expired_and_revoked_tokens_are_refused_saying_so(
    http, make_token, files, jp_serverapp
) -> None:
    expiring = await make_token("short", ["edit"], expires_in=60)
    revoked = await make_token("gone", ["edit"])
    for token in (expiring, revoked):
        status, _, _ = await http("GET", "api/contents/reports/a.ipynb", token=token)
        assert status == 200
    # the token's expiry passes: written to the store's file by another connection (as a second server
    # on the same data directory would), which the server notices
    with contextlib.closing(sqlite3.connect(jp_serverapp.identity_provider.tokens.path)) as db, db:
        db.execute("UPDATE agent_tokens SET expires = ? WHERE name = 'short'", (time.time() - 1,))
    status, answer, _ = await http("DELETE", "api/agent/tokens/gone")
    assert status == 200 and answer["status"] == "revoked", answer
    before = (files / "reports" / "a.ipynb").read_bytes()
    for token, word in ((expiring, "expired"), (revoked, "revoked")):
        for method, url, body in [
            ("GET", "api/contents/reports/a.ipynb", None),
            ("POST", "api/agent/notebooks/reports/a.ipynb", {"action": "insert", "content": "z"}),
            ("GET", "api/agent/sessions", None),
        ]:
            status, answer, _ = await http(method, url, body, token=token)
            assert status == 403, (word, url, answer)
            said = "The agent token 'short' expired at" if word == "expired" else "'gone' was revoked at"
            assert said in answer["message"], answer
    assert (files / "reports" / "a.ipynb").read_bytes() == before
    status, listing, _ = await http("GET", "api/agent/tokens")
    statuses = {t["name"]: t["status"] for t in listing["tokens"]}
    assert statuses == {"short": "expired", "gone": "revoked"}
    assert all("token" not in t for t in listing["tokens"])
    # the name is free again: a new token works, the revoked one stays refused
    renewed = await make_token("gone", ["read"])
    assert (await http("GET", "api/contents/reports/a.ipynb", token=renewed))[0] == 200
    assert (await http("GET", "api/contents/reports/a.ipynb", token=revoked))[0] == 403
    status, answer, _ = await http("DELETE", "api/agent/tokens/nobody")
    assert status == 404 and "no agent token named 'nobody'" in answer["message"]


async def test_tokens_are_managed_with_the_servers_own_credentials_only(http, make_token, files) -> None:
    token = await make_token("boss", ["read", "edit", "execute"])
    for method, url, body in [
        ("GET", "api/agent/tokens", None),
        ("POST", "api/agent/tokens", {"name": "minion", "scopes": ["execute"]}),
        ("DELETE", "api/agent/tokens/boss", None),
    ]:
        status, answer, _ = await http(method, url, body, token=token)
        assert status == 403 and "agent_tokens" in answer["message"], answer
    status, listing, _ = await http("GET", "api/agent/tokens")
    assert [(t["name"], t["status"]) for t in listing["tokens"]] == [("boss", "active")]
    # bad input is a 400 that says what to fix, a name taken by an active token a 409
    for body, words in [
        ({"name": "x", "scopes": ["admin"]}, "admin"),
        ({"name": "x", "scopes": []}, "scopes"),
        ({"name": "../x", "scopes": ["read"]}, "'name'"),
        ({"name": "x", "scopes": ["read"], "paths": ["../etc/**"]}, "'..'"),
        ({"name": "x", "scopes": ["read"], "expires_in": 5}, "expires_in"),
    ]:
        status, answer, _ = await http("POST", "api/agent/tokens", body)
        assert status == 400 and words in answer["message"], (body, answer)
    status, answer, _ = await http("POST", "api/agent/tokens", {"name": "boss", "scopes": ["read"]})
    assert status == 409 and "revoke it first" in answer["message"]


@pytest.mark.parametrize(
    "jp_server_config",
    [{"ServerApp": {"jpserver_extensions": {"jupyter_agent_tools": True}}}],
    ids=["default-classes"],
)
async def test_without_the_two_lines_token_routes_say_how_to_enable_them(http, jp_serverapp) -> None:
    for method, url, body in [
        ("GET", "api/agent/tokens", None),
        ("POST", "api/agent/tokens", {"name": "x", "scopes": ["read"]}),
        ("DELETE", "api/agent/tokens/x", None),
    ]:
        status, answer, _ = await http(method, url, body)
        assert status == 409, answer
        assert "AgentIdentityProvider" in answer["message"] and "AgentAuthorizer" in answer["message"]
    assert not Path(jp_serverapp.data_dir, "jupyter_agent_tools").exists()


@pytest.mark.parametrize(
    "jp_server_config",
    [
        {
            "ServerApp": {
                "jpserver_extensions": {"jupyter_agent_tools": True},
                "identity_provider_class": AgentIdentityProvider,
            }
        }
    ],
    ids=["identity-provider-alone"],
)
async def test_agent_tokens_need_the_agent_authorizer(http, make_token, files) -> None:
    token = await make_token("bot", ["read"])
    status, answer, _ = await http("GET", "api/contents/reports/a.ipynb", token=token)
    assert status == 403 and "AgentAuthorizer" in answer["message"], answer
    status, _, _ = await http("GET", "api/contents/reports/a.ipynb")
    assert status == 200


# ----------------------------------------------------------------------------------------- identity


async def test_the_agent_is_named_in_owners_events_and_metrics(
    http, make_token, files, agent_audit_events
) -> None:
    token = await make_token("analyst", ["edit", "execute"])
    status, answer, _ = await http(
        "POST", "api/agent/eval", {"cells": [{"code": "1 + 1"}], "session": "mine"}, token=token
    )
    assert status == 200, answer
    status, answer, _ = await http(
        "POST", "api/agent/notebooks/reports/a.ipynb", {"action": "insert", "content": "x"}, token=token
    )
    assert status == 200, answer
    status, answer, _ = await http(
        "POST", "api/agent/notebooks/reports/a.ipynb/run", {"all": True}, token=token
    )
    assert status == 200 and answer["cells"][0]["status"] == "complete", answer
    status, listing, _ = await http("GET", "api/agent/sessions", token=token)
    owners = {s["name"]: s["owner"] for s in listing["sessions"]}  # the eval's and the run's sessions
    assert owners["mine"] == "agent:analyst" and set(owners.values()) == {"agent:analyst"}, owners
    assert {e["user"] for e in agent_audit_events("execution")} == {"agent:analyst"}
    assert {e["user"] for e in agent_audit_events("notebook_change")} == {"agent:analyst"}
    status, me, _ = await http("GET", "api/me", token=token)
    assert me["identity"]["username"] == "agent:analyst"
    status, _, _ = await http("PATCH", "api/me", {"name": "root"}, token=token)
    assert status == 400
    status, metrics, _ = await http("GET", "metrics")
    assert 'jupyter_agent_agent_requests_total{agent="analyst",outcome="authenticated"}' in metrics
    assert token not in metrics and token[4:] not in metrics
    # the server's own token still acts as the stable token principal, named as the server's owner
    status, answer, _ = await http("POST", "api/agent/eval", {"cells": [{"code": "2"}], "session": "own"})
    assert status == 200
    owners = {s["name"]: s["owner"] for s in (await http("GET", "api/agent/sessions"))[1]["sessions"]}
    assert owners["own"] == "the server's owner"


async def test_an_agent_gets_no_cookie_and_no_cookie_names_an_agent(
    http, make_token, files, jp_serverapp
) -> None:
    token = await make_token("bot", ["read"])
    status, _, headers = await http("GET", "api/contents/reports/a.ipynb", token=token)
    assert status == 200
    assert not [c for c in headers.get_list("Set-Cookie") if c.startswith("username-")]
    # a login cookie that names an agent (signed with the server's own secret) is no login
    provider = jp_serverapp.identity_provider
    value = json.dumps(
        {
            "username": "agent:bot",
            "name": "agent:bot",
            "display_name": "x",
            "initials": None,
            "color": None,
            "avatar_url": None,
        }
    )
    signed = web.create_signed_value(jp_serverapp.web_app.settings["cookie_secret"], "username-x", value)
    cookie = {"Cookie": f"username-x={signed.decode()}"}
    original = provider.cookie_name
    provider.cookie_name = "username-x"
    try:
        status, _, _ = await http("GET", "api/contents/reports/a.ipynb", token="not-a-token", headers=cookie)
    finally:
        provider.cookie_name = original
    assert status == 403


class NeverAsks(JupyterHandler):
    """A route of some extension that authenticates but never asks the authorizer."""

    @web.authenticated
    def get(self) -> None:
        self.finish("secret settings")


async def test_routes_that_never_ask_the_authorizer_refuse_agents(http, make_token, jp_serverapp) -> None:
    jp_serverapp.web_app.add_handlers(".*$", [(jp_serverapp.base_url + "never-asks", NeverAsks)])
    token = await make_token("bot", ["read", "edit", "execute"])
    status, answer, _ = await http("GET", "never-asks", token=token)
    assert status == 403 and "secret" not in str(answer)
    status, answer, _ = await http("GET", "never-asks")
    assert status == 200 and answer == "secret settings"


# ------------------------------------------------------------------------------------- wrong tokens


async def test_a_thousand_wrong_tokens_cost_good_requests_nothing(
    http, make_token, files, jp_serverapp, monkeypatch
) -> None:
    """A wrong token costs one hash and one dictionary probe: no read of the token file, nothing kept,
    nothing written, and good requests between them are answered as before. (Counted, not timed: what a
    token lookup costs a request is measured by `python3 dev.py bench auth`.)"""
    good = await make_token("good", ["read"])
    store = jp_serverapp.identity_provider.tokens

    async def answered(token: str) -> None:
        status, _, _ = await http("GET", "api/contents/reports/a.ipynb", token=token)
        assert status == 200

    await answered(good)
    store.settle()  # its first use is written (once a minute at most: no other write in this test)
    await answered(good)  # which the store reads back once (its own writer is another connection)
    reads: list[int] = []
    take = store._take
    monkeypatch.setattr(store, "_take", lambda version, rows: (reads.append(len(rows)), take(version, rows)))
    records = dict(store._by_hash)
    sizes = [os.path.getsize(p) for p in (store.path, store.path + "-wal") if os.path.exists(p)]
    wrong = ["jat_" + uuid.uuid4().hex + uuid.uuid4().hex for _ in range(500)]
    wrong += [uuid.uuid4().hex for _ in range(500)]
    for i, bad in enumerate(wrong):
        status, answer, _ = await http("GET", "api/contents/reports/a.ipynb", token=bad)
        assert status == 403, answer
        if i % 25 == 0:
            await answered(good)
    # no wrong token made the store read its records again, kept anything, or wrote to its file
    assert reads == []
    assert store._by_hash == records
    assert [os.path.getsize(p) for p in (store.path, store.path + "-wal") if os.path.exists(p)] == sizes

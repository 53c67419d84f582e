"""The approval policy on every door an agent can reach, end to end on a real server.

jupyter_server's own routes (contents, checkpoints, uploads, the collaboration room and its undo/redo,
kernels and their websocket, sessions, terminals, files) ask ``AgentAuthorizer``, which asks the same
policy the agent routes ask: an ``edit``, ``execute`` or ``kernel`` action an agent must ask for (or is
denied) is refused there with a 403 naming the rule (those routes cannot wait for the person); a path is
placed the way the file is opened (``../<root>/...``, ``sub/../..``, symlinks) before any rule matches it;
``deny read`` hides files on every read door; and agent tokens are refused when the extension did not load.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import urllib.parse
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import nbformat
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from nbformat.v4 import new_code_cell, new_notebook
from tornado.httpclient import HTTPClientError
from tornado.websocket import WebSocketClientConnection

from jupyter_agent_tools.auth import AgentAuthorizer, AgentIdentityProvider
from jupyter_agent_tools.auth.store import TokenStore

pytest.importorskip("jupyter_server_ydoc", reason="jupyter-collaboration is not installed")

from rtc_client import collaboration_config

pytestmark = pytest.mark.timeout(300)

DENY_EDIT_PROD = {"who": "agent:*", "actions": ["edit"], "paths": ["prod/**"], "decision": "deny"}
DENY_READ_SECRET = {"who": "agent:*", "actions": ["read"], "paths": ["secret/**"], "decision": "deny"}


@pytest.fixture
def jp_server_config(jp_root_dir: Path, request: pytest.FixtureRequest) -> dict[str, Any]:
    marker = request.node.get_closest_marker("rules")
    rules = marker.args[0] if marker else [DENY_EDIT_PROD, DENY_READ_SECRET]
    config = collaboration_config(jp_root_dir)
    config["ServerApp"]["jpserver_extensions"]["jupyter_server_terminals"] = True
    config["ServerApp"].update(
        identity_provider_class=AgentIdentityProvider, authorizer_class=AgentAuthorizer
    )
    token_db = jp_root_dir.parent / "agent_tokens.db"
    return {
        **config,
        "KernelPool": {"size": 0},
        "ApprovalPolicy": {"rules": rules, "db_path": str(jp_root_dir.parent / "approvals.db")},
        "AgentIdentityProvider": {"token_db": str(token_db)},
    }


def _notebook(path: Path, code: str = "x = 1") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(new_notebook(cells=[new_code_cell(code, id="c1")]), str(path))
    return path


@pytest.fixture
def tree(jp_root_dir: Path) -> Path:
    """prod/p.ipynb (deny edit), secret/s.ipynb and secret/s.txt (deny read), free/f.ipynb (no rule),
    sub/plink.ipynb -> ../prod/p.ipynb and sub/slink.txt -> ../secret/s.txt."""
    _notebook(jp_root_dir / "prod" / "p.ipynb", "prod = 1")
    _notebook(jp_root_dir / "secret" / "s.ipynb", "secret = 1")
    (jp_root_dir / "secret" / "s.txt").write_text("the secret")
    _notebook(jp_root_dir / "free" / "f.ipynb", "free = 1")
    (jp_root_dir / "sub").mkdir()
    os.symlink("../prod/p.ipynb", jp_root_dir / "sub" / "plink.ipynb")
    os.symlink("../secret/s.txt", jp_root_dir / "sub" / "slink.txt")
    return jp_root_dir


@pytest.fixture
def http(http_server_client: Any, jp_base_url: str, jp_serverapp: Any) -> Any:
    """``http(method, url, body=None, token=<server's>)`` -> (status, JSON or text); the url is sent as
    written (no normalization), so walk-arounds reach the server as an agent would send them."""

    async def call(method: str, url: str, body: Any = None, token: str | None = None) -> tuple[int, Any]:
        headers = {"Authorization": f"token {token or jp_serverapp.identity_provider.token}"}
        data = None
        if body is not None or method in ("POST", "PUT", "PATCH"):
            data = json.dumps(body if body is not None else {}).encode()
        response = await http_server_client.fetch(
            jp_base_url + url,
            method=method,
            body=data,
            headers=headers,
            raise_error=False,
            request_timeout=120,
            allow_nonstandard_methods=True,
        )
        text = response.body.decode() if response.body else ""
        try:
            return response.code, json.loads(text) if text else None
        except ValueError:
            return response.code, text

    call.serverapp = jp_serverapp  # type: ignore[attr-defined]
    return call


@pytest.fixture
def make_token(http: Any) -> Any:
    async def make(name: str, scopes: list[str], **extra: Any) -> str:
        status, answer = await http("POST", "api/agent/tokens", {"name": name, "scopes": scopes, **extra})
        assert status == 201, answer
        return str(answer["token"])

    return make


def _snapshot(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.is_symlink() and ".ipynb_checkpoints" not in p.parts
    }


def _refused_by(status: int, answer: Any, *words: str) -> None:
    assert status == 403, (status, answer)
    message = answer["message"] if isinstance(answer, dict) else str(answer)
    for word in words:
        assert word in message, (word, message)


def _nb_model(code: str) -> dict[str, Any]:
    return {"type": "notebook", "format": "json", "content": new_notebook(cells=[new_code_cell(code)])}


async def test_contents_writes_ask_the_policy(http: Any, make_token: Any, tree: Path) -> None:
    """Every write of /api/contents on a file under ``deny edit prod/**`` is refused naming the rule
    (save, rename into and out of, create, copy into, upload, chunked upload, checkpoints, delete), and
    the same writes elsewhere pass; an ``--ask edit`` token is refused on any write, saying it must ask."""
    bot = await make_token("bot", ["edit", "execute"])
    status, _ = await http("POST", "api/contents/prod/p.ipynb/checkpoints")  # the person made one
    assert status == 201
    before = _snapshot(tree)
    text = {"type": "file", "format": "text", "content": "x"}
    b64 = {"type": "file", "format": "base64", "content": base64.b64encode(b"x").decode()}
    writes: list[tuple[str, str, Any]] = [
        ("PUT", "api/contents/prod/p.ipynb", _nb_model("changed = 1")),
        ("PATCH", "api/contents/prod/p.ipynb", {"path": "free/moved.ipynb"}),
        ("PATCH", "api/contents/free/f.ipynb", {"path": "prod/moved.ipynb"}),
        ("POST", "api/contents/prod", {"type": "notebook"}),
        ("POST", "api/contents/prod", {"copy_from": "free/f.ipynb"}),
        ("PUT", "api/contents/prod/new.txt", text),
        ("PUT", "api/contents/prod/up.bin", {**b64, "chunk": 1}),
        ("PUT", "api/contents/prod/up.bin", {**b64, "chunk": -1}),
        ("POST", "api/contents/prod/p.ipynb/checkpoints", None),
        ("POST", "api/contents/prod/p.ipynb/checkpoints/checkpoint", None),
        ("DELETE", "api/contents/prod/p.ipynb/checkpoints/checkpoint", None),
        ("DELETE", "api/contents/prod/p.ipynb", None),
        # the same file named another way: through a link, above the root and back, encoded
        ("PUT", "api/contents/sub/plink.ipynb", _nb_model("changed = 1")),
        ("PUT", f"api/contents/../{tree.name}/prod/p.ipynb", _nb_model("changed = 1")),
        ("PUT", f"api/contents/free/../../{tree.name}/prod/p.ipynb", _nb_model("changed = 1")),
        ("PUT", f"api/contents/%2E%2E/{tree.name}/prod/p.ipynb", _nb_model("changed = 1")),
    ]
    for method, url, body in writes:
        status, answer = await http(method, url, body, token=bot)
        if status == 404:  # the route does not exist this way (a URL the server does not route)
            continue
        _refused_by(status, answer, "denies the 'edit' action", "rule 0")
    assert _snapshot(tree) == before
    assert not (tree / "free" / "moved.ipynb").exists() and (tree / "free" / "f.ipynb").exists()
    # elsewhere the same agent writes as before
    status, _ = await http("PUT", "api/contents/free/f.ipynb", _nb_model("free = 2"), token=bot)
    assert status == 200
    status, _ = await http("POST", "api/contents/free", {"copy_from": "free/f.ipynb"}, token=bot)
    assert status == 201

    asker = await make_token("asker", ["edit"], ask=["edit"])
    before = _snapshot(tree)
    for method, url, body in [
        ("PUT", "api/contents/free/f.ipynb", _nb_model("asked = 1")),
        ("POST", "api/contents/free", {"copy_from": "free/f.ipynb"}),
        ("PUT", "api/contents/free/new.txt", text),
        ("POST", "api/contents/free/f.ipynb/checkpoints", None),
    ]:
        status, answer = await http(method, url, body, token=asker)
        _refused_by(status, answer, "asks for it", "cannot ask", "/api/agent/notebooks")
    assert _snapshot(tree) == before
    status, answer = await http("GET", "api/contents/free/f.ipynb", token=asker)  # reads stay open
    assert status == 200, answer


async def test_agent_routes_place_paths_before_rules(
    http: Any, make_token: Any, tree: Path, jp_http_port: int, jp_base_url: str
) -> None:
    """``../<root name>/prod/...``, ``free/../../<root>/...``, URL-encoded, and a symlink into prod/: the
    agent's notebook edit, run and eval (HTTP and MCP) are decided on where the file is, and denied."""
    rules_for_run = {"who": "agent:*", "actions": ["execute"], "paths": ["prod/**"], "decision": "deny"}
    policy = _policy(http)
    policy.rules = [*policy.rules, rules_for_run]
    bot = await make_token("bot", ["edit", "execute"])
    before = (tree / "prod" / "p.ipynb").read_bytes()
    edit = {"action": "insert", "content": "walked = 1"}
    walks = [
        f"../{tree.name}/prod/p.ipynb",
        f"free/../../{tree.name}/prod/p.ipynb",
        urllib.parse.quote(f"../{tree.name}/prod/p.ipynb", safe=""),
        "sub/plink.ipynb",
        "prod/p.ipynb",
    ]
    for path in walks:
        for url, body in [
            (f"api/agent/notebooks/{path}", edit),
            (f"api/agent/notebooks/{path}/run", {"all": True}),
            ("api/agent/eval", {"notebook": urllib.parse.unquote(path), "cells": [{"code": "1"}]}),
        ]:
            status, answer = await http("POST", url, body, token=bot)
            if status == 404:
                continue  # not routed or not found that way: nothing done either
            _refused_by(status, answer, "denies")
    mcp_url = f"http://127.0.0.1:{jp_http_port}{jp_base_url}api/agent/mcp"
    async with mcp_session(mcp_url, bot) as session:
        for path in walks[:2] + walks[3:]:
            for tool, arguments in [
                ("notebook_edit", {"path": path, **edit}),
                ("notebook_run", {"path": path, "all": True}),
                ("eval", {"notebook": path, "cells": [{"code": "1"}]}),
            ]:
                called = await session.call_tool(tool, arguments)
                text = called.content[0].text if called.content else ""
                assert called.is_error, (tool, path, called)
                assert "denies" in text or "not found" in text.lower(), (tool, path, text)
    assert (tree / "prod" / "p.ipynb").read_bytes() == before
    status, answer = await http("POST", "api/agent/notebooks/free/f.ipynb", edit, token=bot)
    assert status == 200, answer


def _policy(http: Any) -> Any:
    return http.serverapp.web_app.settings["jupyter_agent_tools_approvals"]


@contextlib.asynccontextmanager
async def mcp_session(url: str, token: str) -> AsyncIterator[ClientSession]:
    async with (
        create_mcp_http_client(headers={"Authorization": f"token {token}"}) as client,
        streamable_http_client(url, http_client=client) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


async def test_deny_read_hides_files_on_every_read_door(http: Any, make_token: Any, tree: Path) -> None:
    bot = await make_token("bot", ["read"])
    for url in [
        "api/contents/secret/s.ipynb",
        "api/contents/secret/s.txt",
        "api/contents/secret",
        "api/contents/sub/slink.txt",
        f"api/contents/../{tree.name}/secret/s.txt",
        "files/secret/s.txt",
        "files/sub/slink.txt",
        "api/agent/notebooks/secret/s.ipynb",
        "nbconvert/script/secret/s.ipynb",
    ]:
        status, answer = await http("GET", url, token=bot)
        assert status in (403, 404), (url, status, answer)
        assert "the secret" not in json.dumps(answer) and "secret = 1" not in json.dumps(answer), url
    status, listing = await http("GET", "api/contents", token=bot)
    assert status == 200 and "secret" not in [e["name"] for e in listing["content"]], listing
    status, found = await http("GET", "api/agent/files?recursive=true", token=bot)
    assert status == 200 and not [e for e in found["entries"] if "secret" in e["path"]], found
    status, answer = await http("GET", "api/contents/free/f.ipynb", token=bot)
    assert status == 200, answer
    # a read cannot be asked: a token asking for reads is refused at creation, saying why
    status, answer = await http(
        "POST", "api/agent/tokens", {"name": "r", "scopes": ["read"], "ask": ["read"]}
    )
    assert status == 400 and "read cannot wait" in answer["message"], answer


@pytest.mark.rules([{"who": "agent:*", "actions": ["kernel"], "decision": "ask"}])
async def test_kernel_actions_on_jupyter_servers_routes_ask_the_policy(
    http: Any, make_token: Any, jp_ws_fetch: Any
) -> None:
    """An agent that must ask before kernel actions cannot restart, interrupt or shut down the person's
    kernel, nor delete their session, nor reach the kernel's websocket (which sends control messages)."""
    bot = await make_token("bot", ["read", "execute"])
    status, session = await http(
        "POST", "api/sessions", {"path": "free/f.ipynb", "type": "notebook", "kernel": {"name": "python3"}}
    )
    assert status == 201, session
    kernel = session["kernel"]["id"]
    try:
        for method, url in [
            ("POST", f"api/kernels/{kernel}/restart"),
            ("POST", f"api/kernels/{kernel}/interrupt"),
            ("DELETE", f"api/kernels/{kernel}"),
            ("DELETE", f"api/sessions/{session['id']}"),
            ("PATCH", f"api/sessions/{session['id']}"),
            ("POST", "api/kernels"),
        ]:
            status, answer = await http(method, url, {} if method != "DELETE" else None, token=bot)
            _refused_by(status, answer, "'kernel' action", "cannot ask")
        try:
            ws = await jp_ws_fetch(
                "api", "kernels", kernel, "channels", headers={"Authorization": f"token {bot}"}
            )
        except HTTPClientError as e:
            assert e.code == 403
        else:
            assert not isinstance(ws, WebSocketClientConnection), "the kernel websocket opened"
        status, kernels = await http("GET", "api/kernels", token=bot)  # reading stays open
        assert status == 200 and [k["id"] for k in kernels] == [kernel]
        status, _ = await http("GET", f"api/kernels/{kernel}")
        assert status == 200  # the kernel lives on
    finally:
        await http("DELETE", f"api/sessions/{session['id']}")


@pytest.mark.rules([])
async def test_without_rules_jupyter_servers_routes_answer_agents_as_before(
    http: Any, make_token: Any, tree: Path
) -> None:
    bot = await make_token("bot", ["edit", "execute"])
    status, _ = await http("PUT", "api/contents/prod/p.ipynb", _nb_model("mine = 1"), token=bot)
    assert status == 200
    status, kernel = await http("POST", "api/kernels", {"name": "python3"}, token=bot)
    assert status == 201, kernel
    status, _ = await http("POST", f"api/kernels/{kernel['id']}/interrupt", token=bot)
    assert status == 204
    status, _ = await http("DELETE", f"api/kernels/{kernel['id']}", token=bot)
    assert status == 204
    # above the root and back: the same 404 whether or not the guess is the root's name (no oracle)
    answers = []
    for guess in (tree.name, "not-the-root"):
        status, answer = await http("GET", f"api/contents/../{guess}/free/f.ipynb", token=bot)
        assert status == 404, answer
        answers.append(answer["message"].replace(guess, "NAME"))
    assert answers[0] == answers[1]


async def test_the_collaboration_room_asks_the_policy(
    http: Any, make_token: Any, tree: Path, jp_http_port: int, jp_base_url: str
) -> None:
    """Joining a notebook's room (its Yjs updates are saved) and its undo/redo are edits."""
    asker = await make_token("asker", ["edit"], ask=["edit"])
    bot = await make_token("bot", ["edit"])
    rooms = {}
    for path in ("free/f.ipynb", "prod/p.ipynb"):
        status, session = await http(
            "PUT", f"api/collaboration/session/{path}", {"format": "json", "type": "notebook"}
        )
        assert status in (200, 201), session
        rooms[path] = f"json:notebook:{session['fileId']}"
    for token, path in [(asker, "free/f.ipynb"), (bot, "prod/p.ipynb")]:
        status, answer = await http(
            "PUT", f"api/collaboration/session/{path}", {"format": "json", "type": "notebook"}, token=token
        )
        assert status == 403, answer
        status, answer = await http(
            "PUT", f"api/collaboration/undo_redo/{rooms[path]}", {"action": "undo"}, token=token
        )
        assert status == 403, answer
        import tornado.httpclient
        import tornado.websocket

        url = f"ws://127.0.0.1:{jp_http_port}{jp_base_url}api/collaboration/room/{rooms[path]}"
        request = tornado.httpclient.HTTPRequest(url, headers={"Authorization": f"token {token}"})
        with pytest.raises(tornado.httpclient.HTTPClientError) as refused:
            ws = await tornado.websocket.websocket_connect(request)
            ws.close()
        assert refused.value.code == 403
    status, _ = await http(
        "PUT", "api/collaboration/session/free/f.ipynb", {"format": "json", "type": "notebook"}, token=bot
    )
    assert status in (200, 201)


@pytest.mark.rules([{"who": "agent:*", "actions": ["edit"], "decision": "maybe"}])
async def test_a_configuration_error_refuses_agent_tokens_everywhere(
    http: Any, jp_root_dir: Path, jp_serverapp: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A typo in the rules: the extension does not load, and no agent token is accepted anywhere (the
    server's own token still works), rather than agents passing with no limits."""
    token, _ = TokenStore(str(jp_root_dir.parent / "agent_tokens.db")).create("bot", ["edit", "execute"])
    for method, url, body in [
        ("GET", "api/contents", None),
        ("PUT", "api/contents/new.txt", {"type": "file", "format": "text", "content": "x"}),
        ("POST", "api/kernels", {"name": "python3"}),
        ("GET", "api/kernels", None),
    ]:
        status, answer = await http(method, url, body, token=token)
        assert status == 503, (url, status, answer)
        assert "did not load" in json.dumps(answer), answer
    assert not (jp_root_dir / "new.txt").exists()
    status, _ = await http("GET", "api/contents")
    assert status == 200
    assert "jupyter_agent_tools_approvals" not in jp_serverapp.web_app.settings


@pytest.mark.rules([{"who": "agent:*", "actions": ["execute"], "decision": "ask"}])
async def test_eval_in_a_notebook_needs_read_on_every_door(
    http: Any, make_token: Any, tree: Path, jp_http_port: int, jp_base_url: str, jp_serverapp: Any
) -> None:
    """An eval in a notebook's kernel reads the notebook: a token without ``read`` is refused before the
    person is asked, attached, detached and over MCP alike (MCP's detached eval skipped the check)."""
    runner = await make_token("runner", ["execute"])
    body = {"notebook": "free/f.ipynb", "cells": [{"code": "open('ran', 'w').close()"}]}
    for extra in ({}, {"detach": True}):
        status, answer = await http("POST", "api/agent/eval", {**body, **extra}, token=runner)
        assert status == 403 and "'read' scope" in answer["message"], answer
    mcp_url = f"http://127.0.0.1:{jp_http_port}{jp_base_url}api/agent/mcp"
    async with mcp_session(mcp_url, runner) as session:
        for extra in ({}, {"detach": True}):
            called = await session.call_tool("eval", {**body, **extra, "approval_wait": 0})
            assert called.is_error and "read" in called.content[0].text, called
    policy = jp_serverapp.web_app.settings["jupyter_agent_tools_approvals"]
    assert policy.pending() == []  # nobody was asked
    assert not (tree / "ran").exists()

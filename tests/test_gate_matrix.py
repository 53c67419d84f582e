"""Doors x decisions x actions: the one decision point, asked by every door, in the quick tier.

jupyter_server's own routes reach the policy through ``AgentAuthorizer.is_authorized`` (asked here with
instances of the real handler classes, on a real contents root, without a running server); this
extension's HTTP routes and MCP tools reach it through ``approvals.gate.clear`` (asked here with the
``Asking`` each door builds). For every door, every class of action and every decision of a rule on
``prod/**``: a door that performs the action is refused (403; a hidden read: 404) or asks, exactly when the
rule says so, and every other door is untouched.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest
from jupyter_server.auth.identity import IdentityProvider
from jupyter_server.services.contents.filemanager import FileContentsManager
from tornado import httputil, web

from jupyter_agent_tools.approvals import ApprovalPolicy
from jupyter_agent_tools.approvals.gate import ApprovalDenied, Asking, clear, described
from jupyter_agent_tools.auth import AgentAuthorizer
from jupyter_agent_tools.auth.identity import APPROVALS_SETTING, AgentUser
from jupyter_agent_tools.auth.scopes import effective

pytestmark = pytest.mark.quick  # the fast tier: no server, no kernel

ACTIONS = ("read", "edit", "execute", "kernel")
DECISIONS = ("allow", "ask", "deny")

S = "jupyter_server.services."
# (door, handler class, HTTP method, the authorizer's (action, resource), path kwargs or args, body,
#  the gate's classes of action it performs)
DOORS: list[tuple[str, str, str, str, str, dict[str, Any] | list[str], Any, frozenset[str]]] = [
    (
        "contents read",
        S + "contents.handlers.ContentsHandler",
        "GET",
        "read",
        "contents",
        {"path": "prod/p.ipynb"},
        None,
        frozenset({"read"}),
    ),
    (
        "contents save",
        S + "contents.handlers.ContentsHandler",
        "PUT",
        "write",
        "contents",
        {"path": "prod/p.ipynb"},
        None,
        frozenset({"read", "edit"}),
    ),
    (
        "contents rename",
        S + "contents.handlers.ContentsHandler",
        "PATCH",
        "write",
        "contents",
        {"path": "free/f.ipynb"},
        {"path": "prod/q.ipynb"},
        frozenset({"read", "edit"}),
    ),
    (
        "contents copy",
        S + "contents.handlers.ContentsHandler",
        "POST",
        "write",
        "contents",
        {"path": "free"},
        {"copy_from": "prod/p.ipynb"},
        frozenset({"read", "edit"}),
    ),
    (
        "contents delete",
        S + "contents.handlers.ContentsHandler",
        "DELETE",
        "write",
        "contents",
        {"path": "prod/p.ipynb"},
        None,
        frozenset({"read", "edit"}),
    ),
    (
        "checkpoint",
        S + "contents.handlers.CheckpointsHandler",
        "POST",
        "write",
        "contents",
        {"path": "prod/p.ipynb"},
        None,
        frozenset({"read", "edit"}),
    ),
    (
        "restore",
        S + "contents.handlers.ModifyCheckpointsHandler",
        "POST",
        "write",
        "contents",
        {"path": "prod/p.ipynb", "checkpoint_id": "c"},
        None,
        frozenset({"read", "edit"}),
    ),
    (
        "trust",
        S + "contents.handlers.TrustNotebooksHandler",
        "POST",
        "write",
        "contents",
        {"path": "prod/p.ipynb"},
        None,
        frozenset({"read", "edit"}),
    ),
    (
        "files",
        "jupyter_server.files.handlers.FilesHandler",
        "GET",
        "read",
        "contents",
        ["prod/p.ipynb"],
        None,
        frozenset({"read"}),
    ),
    (
        "nbconvert",
        "jupyter_server.nbconvert.handlers.NbconvertFileHandler",
        "GET",
        "read",
        "nbconvert",
        {"format": "script", "path": "prod/p.ipynb"},
        None,
        frozenset({"read"}),
    ),
    (
        "kernel start",
        S + "kernels.handlers.MainKernelHandler",
        "POST",
        "write",
        "kernels",
        {},
        None,
        frozenset({"execute", "kernel"}),
    ),
    (
        "kernel list",
        S + "kernels.handlers.MainKernelHandler",
        "GET",
        "read",
        "kernels",
        {},
        None,
        frozenset(),
    ),
    (
        "kernel restart",
        S + "kernels.handlers.KernelActionHandler",
        "POST",
        "write",
        "kernels",
        {"kernel_id": "k", "action": "restart"},
        None,
        frozenset({"execute", "kernel"}),
    ),
    (
        "kernel shutdown",
        S + "kernels.handlers.KernelHandler",
        "DELETE",
        "write",
        "kernels",
        {"kernel_id": "k"},
        None,
        frozenset({"execute", "kernel"}),
    ),
    (
        "kernel websocket",
        S + "kernels.websocket.KernelWebsocketHandler",
        "GET",
        "execute",
        "kernels",
        {"kernel_id": "k"},
        None,
        frozenset({"execute", "kernel"}),
    ),
    (
        "session create",
        S + "sessions.handlers.SessionRootHandler",
        "POST",
        "write",
        "sessions",
        {},
        None,
        frozenset({"execute", "kernel"}),
    ),
    (
        "session delete",
        S + "sessions.handlers.SessionHandler",
        "DELETE",
        "write",
        "sessions",
        {"session_id": "s"},
        None,
        frozenset({"execute", "kernel"}),
    ),
    (
        "terminal create",
        "jupyter_server_terminals.api_handlers.TerminalRootHandler",
        "POST",
        "write",
        "terminals",
        {},
        None,
        frozenset({"execute"}),
    ),
    (
        "terminal websocket",
        "jupyter_server_terminals.handlers.TermSocket",
        "GET",
        "execute",
        "terminals",
        {"term_name": "1"},
        None,
        frozenset({"execute"}),
    ),
    (
        "room",
        "jupyter_server_ydoc.handlers.YDocWebSocketHandler",
        "GET",
        "read",
        "contents",
        ["json:notebook:prod-id"],
        None,
        frozenset({"read", "edit"}),
    ),
    (
        "room undo",
        "jupyter_server_ydoc.handlers.UndoRedoHandler",
        "PUT",
        "write",
        "contents",
        ["json:notebook:prod-id"],
        None,
        frozenset({"read", "edit"}),
    ),
    (
        "room session",
        "jupyter_server_ydoc.handlers.DocSessionHandler",
        "PUT",
        "write",
        "contents",
        ["prod/p.ipynb"],
        None,
        frozenset({"read", "edit"}),
    ),
]


def _class(dotted: str) -> type:
    module, name = dotted.rsplit(".", 1)
    return getattr(pytest.importorskip(module), name)  # type: ignore[no-any-return]


class _Connection:
    """What a handler needs of an HTTP connection to be built (no request is served)."""

    def set_close_callback(self, callback: Any) -> None:
        pass


class _FileIds:
    """The file id service's one call the authorizer makes: a room's file id to its path."""

    def get_path(self, file_id: str) -> str | None:
        return {"prod-id": "prod/p.ipynb"}.get(file_id)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("root")
    for name in ("prod/p.ipynb", "free/f.ipynb"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("{}")
    os.symlink("../prod/p.ipynb", root / "free" / "plink.ipynb")
    return root


def _policy(root: Path, rules: list[dict[str, Any]]) -> ApprovalPolicy:
    return ApprovalPolicy(rules=rules, root_dir=str(root), db_path=str(root.parent / "approvals.db"))


def _handler(root: Path, policy: ApprovalPolicy, door: tuple[Any, ...]) -> web.RequestHandler:
    _name, dotted, method, _action, _resource, where, body, _gates = door
    settings = {
        APPROVALS_SETTING: policy,
        "contents_manager": FileContentsManager(root_dir=str(root)),
        "file_id_manager": _FileIds(),
        "base_url": "/",
    }
    application = web.Application([], **settings)
    request = httputil.HTTPServerRequest(
        method=method,
        uri="/",
        body=json.dumps(body).encode() if body is not None else b"",
        connection=_Connection(),  # type: ignore[arg-type]
    )
    cls = _class(dotted)
    handler = cls.__new__(cls)  # as Tornado makes it, without its initialize(): no request is served
    handler.application, handler.request = application, request
    handler.path_kwargs = where if isinstance(where, dict) else {}
    handler.path_args = where if isinstance(where, list) else []
    return handler


def _agent(policy: ApprovalPolicy, ask: frozenset[str] = frozenset()) -> AgentUser:
    name = "agent:bot"
    return AgentUser(
        username=name,
        name=name,
        agent="bot",
        scopes=effective({"read", "edit", "execute"}),
        path_scope=policy.reach(name, None, ask),
        ask=ask,
    )


def _outcome(authorizer: AgentAuthorizer, handler: web.RequestHandler, user: AgentUser, door: Any) -> int:
    try:
        allowed = authorizer.is_authorized(handler, user, door[3], door[4])
    except web.HTTPError as e:
        return e.status_code
    return 200 if allowed else 403


@pytest.mark.parametrize("decision", DECISIONS)
@pytest.mark.parametrize("action", ACTIONS)
def test_jupyter_servers_doors_ask_the_one_policy(root: Path, action: str, decision: str) -> None:
    if action == "read" and decision == "ask":
        with pytest.raises(Exception, match="'read' cannot be asked"):
            _policy(
                root, [{"who": "agent:*", "actions": [action], "decision": decision, "paths": ["prod/**"]}]
            )
        return
    policy = _policy(
        root, [{"who": "agent:*", "actions": [action], "decision": decision, "paths": ["prod/**"]}]
    )
    authorizer = AgentAuthorizer(identity_provider=IdentityProvider())
    user = _agent(policy)
    for door in DOORS:
        handler = _handler(root, policy, door)
        got = _outcome(authorizer, handler, user, door)
        performs = action in door[7]
        if decision == "allow" or not performs:
            assert got == 200, (door[0], action, decision, got)
        elif action == "read":
            assert got == 404, (door[0], action, decision, got)  # hidden, as outside the token's paths
        else:
            assert got == 403, (door[0], action, decision, got)


@pytest.mark.parametrize("action", ("edit", "execute", "kernel"))
def test_a_tokens_own_ask_closes_the_doors_that_cannot_ask(root: Path, action: str) -> None:
    policy = _policy(root, [])
    authorizer = AgentAuthorizer(identity_provider=IdentityProvider())
    user = _agent(policy, frozenset({action}))
    for door in DOORS:
        got = _outcome(authorizer, _handler(root, policy, door), user, door)
        assert got == (403 if action in door[7] else 200), (door[0], action, got)


def test_a_path_is_placed_before_rules_match_it(root: Path) -> None:
    """Through a symlink, above the root and back, or where it cannot be placed: the strictest rule."""
    policy = _policy(
        root, [{"who": "agent:*", "actions": ["edit"], "decision": "deny", "paths": ["prod/**"]}]
    )
    for path in ("free/plink.ipynb", f"../{root.name}/prod/p.ipynb", f"free/../../{root.name}/prod/x.ipynb"):
        assert policy.decision("agent:bot", "edit", path, frozenset()) == "deny", path
    for path in ("../elsewhere/p.ipynb", "a\x00b"):  # cannot be placed: every rule with paths matches
        assert policy.decision("agent:bot", "edit", path, frozenset()) == "deny", path
    assert policy.decision("agent:bot", "edit", "free/f.ipynb", frozenset()) == "allow"
    assert policy.decision("agent:bot", "edit", None, frozenset()) == "allow"  # no file: path rules skip


# This extension's doors (HTTP routes and MCP tools): the class of action each asks the gate for.
OWN_DOORS = [
    ("POST /api/agent/eval", "http", "execute", None),
    ("POST /api/agent/eval with notebook", "http", "execute", "prod/p.ipynb"),
    ("POST /api/agent/notebooks/{path}", "http", "edit", "prod/p.ipynb"),
    ("POST /api/agent/notebooks/{path}/run", "http", "execute", "prod/p.ipynb"),
    ("POST /api/agent/notebooks/{path}/kernel", "http", "kernel", "prod/p.ipynb"),
    ("POST /api/agent/changes/{id}/undo", "http", "edit", "prod/p.ipynb"),
    ("DELETE /api/agent/sessions/{name}", "http", "kernel", None),
    ("MCP eval", "mcp", "execute", None),
    ("MCP notebook_edit", "mcp", "edit", "prod/p.ipynb"),
    ("MCP notebook_run", "mcp", "execute", "prod/p.ipynb"),
    ("MCP notebook_kernel", "mcp", "kernel", "prod/p.ipynb"),
    ("MCP session_delete", "mcp", "kernel", None),
]


@pytest.mark.parametrize("decision", DECISIONS)
@pytest.mark.parametrize("action", ("edit", "execute", "kernel"))
def test_the_extensions_doors_ask_the_same_policy(root: Path, action: str, decision: str) -> None:
    rules = [{"who": "agent:*", "actions": [action], "decision": decision}]

    async def go() -> None:
        policy = _policy(root, rules)
        try:
            for name, via, performs, path in OWN_DOORS:
                asking = Asking("agent:bot", frozenset(), via, performs, path)
                describe = described(name, {})
                if performs != action or decision == "allow":
                    assert await clear(policy, asking, describe, 0) is None, name
                elif decision == "deny":
                    with pytest.raises(ApprovalDenied, match=f"rule 0 \\(deny {action}"):
                        await clear(policy, asking, describe, 0)
                else:
                    approval = await clear(policy, asking, describe, 0)
                    assert approval is not None and approval.state == "pending", name
                    assert approval.path == (path and "prod/p.ipynb") and approval.door == via
                    policy.withdraw(approval, "test")
        finally:
            policy.stop()

    asyncio.run(go())

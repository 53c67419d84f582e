"""Authentication, authorization and XSRF on every route, against a real server and real kernels.

An authorizer installed through ``ServerApp.authorizer_class`` denies one (action, resource) at a time:
every route that needs it answers 403 and does nothing, every other route still works, and the authorizer
was asked exactly the pairs the contract documents.
"""

from __future__ import annotations

import json
from http.cookies import SimpleCookie
from pathlib import Path
from typing import Any, ClassVar

import nbformat
import pytest
from jupyter_server.auth.authorizer import Authorizer
from nbformat.v4 import new_code_cell, new_notebook, new_output

from jupyter_agent_tools.api_document import openapi_document, operations
from jupyter_agent_tools.auth import AgentAuthorizer, AgentIdentityProvider

pytestmark = pytest.mark.timeout(240)


class DenyOne(Authorizer):
    """Allows everything except the (action, resource) pairs in ``denied``; records what it was asked."""

    denied: ClassVar[set[tuple[str, str]]] = set()
    asked: ClassVar[list[tuple[str, str, str]]] = []

    def is_authorized(self, handler: Any, user: Any, action: str, resource: str) -> bool:
        self.asked.append((type(handler).__name__, action, resource))
        return (action, resource) not in self.denied


@pytest.fixture
def jp_server_config() -> dict[str, Any]:
    # Agent tokens enabled (so the token routes work), with DenyOne as the authorizer they wrap: requests
    # made with the server's own token reach DenyOne exactly as they would without agent tokens.
    return {
        "ServerApp": {
            "jpserver_extensions": {"jupyter_agent_tools": True},
            "identity_provider_class": AgentIdentityProvider,
            "authorizer_class": AgentAuthorizer,
        },
        "AgentAuthorizer": {"authorizer_class": DenyOne},
        "EvalSessionManager": {"max_sessions": 2},
        "CellExecutor": {"max_output_bytes": 256},
        # one action the person must approve, so that _setup leaves a request waiting for the routes
        "ApprovalPolicy": {
            "rules": [{"who": "*", "actions": ["kernel"], "paths": ["gate.ipynb"], "decision": "ask"}]
        },
    }


@pytest.fixture(autouse=True)
def reset_authorizer():
    DenyOne.denied, DenyOne.asked = set(), []
    yield
    DenyOne.denied, DenyOne.asked = set(), []


@pytest.fixture
def notebook(jp_root_dir: Path) -> Path:
    path = jp_root_dir / "nb.ipynb"
    # print(1): a run writes the output back, so the output route finds it before and after one
    outputs = [new_output("stream", name="stdout", text="1\n")]
    nbformat.write(new_notebook(cells=[new_code_cell("print(1)", outputs=outputs)]), str(path))
    return path


@pytest.fixture
def http(http_server_client, jp_base_url):
    """A request with exactly the given headers (no token unless given): (status, JSON or None, headers)."""

    async def call(
        method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
    ) -> tuple[int, Any, Any]:
        data = None
        if method in ("POST", "PUT"):
            data = json.dumps(body if body is not None else {}).encode()
        response = await http_server_client.fetch(
            jp_base_url + path,
            method=method,
            body=data,
            headers=headers or {},
            raise_error=False,
            request_timeout=120,
            follow_redirects=False,
        )
        text = response.body.decode() if response.body else ""
        try:
            parsed = json.loads(text) if text else None
        except ValueError:
            parsed = text
        return response.code, parsed, response.headers

    return call


# (method, url under base_url, body, the (action, resource) pairs it needs)
EVAL_BODY = {"cells": [{"code": "print('y' * 2000)"}], "session": "keep"}
READ_CONTENTS, WRITE_CONTENTS = ("read", "contents"), ("write", "contents")
EXECUTE_KERNELS, READ_KERNELS = ("execute", "kernels"), ("read", "kernels")
READ_TOKENS, WRITE_TOKENS = ("read", "agent_tokens"), ("write", "agent_tokens")
READ_APPROVALS, WRITE_APPROVALS = ("read", "agent_approvals"), ("write", "agent_approvals")
READ_FOCUS, WRITE_FOCUS, WRITE_UI = ("read", "agent_focus"), ("write", "agent_focus"), ("write", "agent_ui")
TAB = "tab-auth0001"
ROUTES = [
    ("GET", "api/agent/notebooks/nb.ipynb", None, {READ_CONTENTS}),
    ("POST", "api/agent/notebooks/nb.ipynb", {"action": "insert", "content": "z"}, {WRITE_CONTENTS}),
    ("GET", "api/agent/notebooks/nb.ipynb/cells/@0/outputs/0", None, {READ_CONTENTS}),
    ("POST", "api/agent/notebooks/nb.ipynb/run", {"all": True}, {WRITE_CONTENTS, EXECUTE_KERNELS}),
    (
        "POST",
        "api/agent/eval",
        {"cells": [{"code": "open('made.txt', 'w')"}], "session": "new"},
        {EXECUTE_KERNELS},
    ),
    ("GET", "api/agent/sessions", None, {READ_KERNELS}),
    ("GET", "api/agent/artifacts/{artifact}", None, {READ_KERNELS}),
    ("GET", "api/agent/tokens", None, {READ_TOKENS}),
    ("POST", "api/agent/tokens", {"name": "bot", "scopes": ["read"]}, {WRITE_TOKENS}),
    ("DELETE", "api/agent/tokens/bot", None, {WRITE_TOKENS}),
    ("GET", "api/agent/approvals", None, {READ_APPROVALS}),
    ("GET", "api/agent/approvals/{approval}", None, {READ_APPROVALS}),
    ("POST", "api/agent/approvals/{approval}", {"decision": "approve"}, {WRITE_APPROVALS}),
    ("POST", "api/agent/sessions/keep/interrupt", {}, {EXECUTE_KERNELS}),
    ("DELETE", "api/agent/sessions/keep", None, {EXECUTE_KERNELS}),
    ("GET", "api/agent/notebooks/nb.ipynb/changes", None, {READ_CONTENTS}),
    ("GET", "api/agent/notebooks/nb.ipynb/changes/1", None, {READ_CONTENTS}),
    ("POST", "api/agent/notebooks/nb.ipynb/changes/1/undo", {}, {WRITE_CONTENTS}),
    ("GET", "api/agent/changes", None, {READ_CONTENTS}),
    ("GET", "api/agent/notebooks/nb.ipynb/kernel", None, {READ_KERNELS}),
    ("POST", "api/agent/notebooks/nb.ipynb/kernel", {"action": "interrupt"}, {EXECUTE_KERNELS}),
    ("GET", "api/agent/files", None, {READ_CONTENTS}),
    ("GET", "api/agent/runs", None, {READ_KERNELS}),
    ("GET", "api/agent/runs/{run}", None, {READ_KERNELS}),
    ("GET", "api/agent/runs/{run}/events", None, {READ_KERNELS}),
    ("POST", "api/agent/runs/{run}/cancel", {}, {EXECUTE_KERNELS}),
    ("PUT", f"api/agent/focus/tabs/{TAB}", {"agents": "all", "path": "nb.ipynb"}, {WRITE_FOCUS}),
    ("GET", "api/agent/focus", None, {READ_FOCUS}),
    ("POST", "api/agent/focus/actions", {"action": "open_notebook", "path": "nb.ipynb"}, {WRITE_UI}),
    ("DELETE", f"api/agent/focus/tabs/{TAB}", None, {WRITE_FOCUS}),
]
PAIRS = [
    ("read", "contents"),
    ("write", "contents"),
    ("execute", "kernels"),
    ("read", "kernels"),
    ("read", "agent_tokens"),
    ("write", "agent_tokens"),
    ("read", "agent_approvals"),
    ("write", "agent_approvals"),
    ("read", "agent_focus"),
    ("write", "agent_focus"),
    ("write", "agent_ui"),
]


def _doc_path(url: str) -> str:
    url = url.replace("nb.ipynb", "{path}").replace("keep", "{name}").replace("{artifact}", "{artifact_id}")
    url = url.replace("tokens/bot", "tokens/{name}").replace("{approval}", "{approval_id}")
    url = url.replace("/changes/1", "/changes/{change_id}").replace("{run}", "{run_id}").replace(TAB, "{tab}")
    return "/" + url.replace("/cells/@0/outputs/0", "/cells/{cell}/outputs/{n}")


def test_routes_are_every_documented_operation_with_its_permission() -> None:
    """The routes tested here, and what they need, are exactly the document's x-authorization."""
    tested = {(method, _doc_path(url)): needs for method, url, _body, needs in ROUTES}
    documented = {}
    for method, path, op in operations(openapi_document()):
        needs = op.get("x-authorization")
        if needs is not None:
            needs = needs if isinstance(needs, list) else [needs]
            documented[(method, path)] = {(n["action"], n["resource"]) for n in needs}
    assert tested == documented
    assert len(documented) == len(operations(openapi_document())) - 1  # all but openapi.json


async def _setup(http, auth: dict[str, str]) -> dict[str, str]:
    """A session 'keep' with a truncated output and a finished detached run: returns their ids (the
    routes' ``{artifact}`` and ``{run}``). The notebook's change 1 (the
    ledger's first entry) inserts a markdown cell, which the routes' undo takes out again."""
    status, answer, _ = await http(
        "POST",
        "api/agent/notebooks/nb.ipynb",
        {"action": "insert", "content": "m", "cell_type": "markdown"},
        auth,
    )
    assert status == 200 and answer["change_id"] == "1", answer
    status, answer, _ = await http("POST", "api/agent/eval", EVAL_BODY, auth)
    assert status == 200, answer
    artifact = answer["cells"][0]["artifact_id"]
    detached = {"cells": [{"code": "1"}], "session": "keep", "detach": True}
    status, run, _ = await http("POST", "api/agent/eval", detached, auth)
    assert status == 202, run
    status, ended, _ = await http("GET", f"api/agent/runs/{run['run_id']}?wait=60", None, auth)
    assert status == 200 and ended["state"] == "complete", ended
    # a focus shared, so that reading it works whichever route is denied
    status, answer, _ = await http("PUT", f"api/agent/focus/tabs/{TAB}-s", {"path": "nb.ipynb"}, auth)
    assert status == 200, answer
    gated = {"action": "interrupt", "approval_wait": 0}  # the kernel of gate.ipynb: the person must approve
    status, waiting, _ = await http("POST", "api/agent/notebooks/gate.ipynb/kernel", gated, auth)
    assert status == 202, waiting
    return {"{artifact}": artifact, "{run}": run["run_id"], "{approval}": str(waiting["approval_id"])}


def _fill(url: str, ids: dict[str, str]) -> str:
    for name, value in ids.items():
        url = url.replace(name, value)
    return url


async def test_no_token_is_refused_everywhere(
    http, jp_auth_header, notebook, jp_serverapp, jp_root_dir
) -> None:
    ids = await _setup(http, jp_auth_header)
    kernels = set(jp_serverapp.kernel_manager.list_kernel_ids())
    before = notebook.read_bytes()
    routes = [
        *ROUTES,
        ("GET", "api/agent/openapi.json", None, None),
        ("POST", "api/agent/mcp", {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, None),
        ("GET", "api/agent/no-such-route", None, None),
    ]
    for bad in ({}, {"Authorization": "token wrong"}, {"Authorization": "Bearer nope"}):
        for method, url, body, _pair in routes:
            status, answer, headers = await http(method, _fill(url, ids), body, bad)
            # no credentials at all on the MCP endpoint: the OAuth challenge (docs/mcp.md)
            signin = url == "api/agent/mcp" and not bad
            assert status == (401 if signin else 403), (method, url, bad, answer)
            assert ("resource_metadata=" in (headers.get("WWW-Authenticate") or "")) == signin, headers
            assert "y" * 100 not in json.dumps(answer)
            # what to fix, never the XSRF check that only browsers with a login need
            message = answer["message"]
            assert "_xsrf" not in message and "'Authorization: token <TOKEN>'" in message, (url, answer)
            wrong = "not accepted by this server" in message
            assert wrong == bool(bad), (url, bad, message)
    assert notebook.read_bytes() == before
    assert set(jp_serverapp.kernel_manager.list_kernel_ids()) == kernels
    assert not (jp_root_dir / "made.txt").exists()
    status, listing, _ = await http("GET", "api/agent/sessions", None, jp_auth_header)
    assert [s["name"] for s in listing["sessions"]] == ["keep"]


@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: f"deny-{p[0]}-{p[1]}")
async def test_denying_one_permission(
    http, jp_auth_header, notebook, jp_serverapp, jp_root_dir, pair
) -> None:
    ids = await _setup(http, jp_auth_header)
    DenyOne.denied = {pair}
    DenyOne.asked = []
    kernels = set(jp_serverapp.kernel_manager.list_kernel_ids())
    before = notebook.read_bytes()
    for method, url, body, needs in ROUTES:
        if pair not in needs:
            continue
        status, answer, _ = await http(method, _fill(url, ids), body, jp_auth_header)
        assert status == 403, (method, url, answer)
        assert f"not authorized to {pair[0]} on resource: {pair[1]}" in answer["message"]
    # nothing was done
    assert notebook.read_bytes() == before
    assert set(jp_serverapp.kernel_manager.list_kernel_ids()) == kernels
    assert not (jp_root_dir / "made.txt").exists()
    DenyOne.denied = set()
    status, listing, _ = await http("GET", "api/agent/sessions", None, jp_auth_header)
    names = sorted(s["name"] for s in listing["sessions"])
    assert names == ["keep"], names
    # every other route still works while this pair is denied
    DenyOne.denied = {pair}
    for method, url, body, needs in ROUTES:
        if pair in needs or method == "DELETE":
            continue
        status, answer, _ = await http(method, _fill(url, ids), body, jp_auth_header)
        assert status < 400, (method, url, answer)
    asked = {(a, r) for _h, a, r in DenyOne.asked}
    assert pair in asked
    assert asked <= set(PAIRS)


async def test_authorizer_is_asked_the_documented_pair(http, jp_auth_header, notebook) -> None:
    ids = await _setup(http, jp_auth_header)
    for method, url, body, needs in ROUTES:
        DenyOne.asked = []
        status, answer, _ = await http(method, _fill(url, ids), body, jp_auth_header)
        assert status < 400, (method, url, answer)
        assert {(a, r) for _h, a, r in DenyOne.asked} == needs, (method, url, DenyOne.asked)


async def _cookies(http, token: str) -> dict[str, str]:
    """A browser's cookies: the login cookie (from a token in the URL) and the _xsrf cookie."""
    jar: dict[str, str] = {}
    for url in (f"api/agent/sessions?token={token}", "login"):
        _status, _answer, headers = await http("GET", url)
        for header in headers.get_list("Set-Cookie"):
            jar.update({k: m.value for k, m in SimpleCookie(header).items()})
    assert "_xsrf" in jar and any(k.startswith("username-") for k in jar), jar
    return jar


async def test_cookie_requests_need_xsrf_token_requests_do_not(
    http, jp_serverapp, jp_auth_header, notebook, jp_root_dir
) -> None:
    await _setup(http, jp_auth_header)
    jar = await _cookies(http, jp_serverapp.identity_provider.token)
    cookie = {"Cookie": "; ".join(f"{k}={v}" for k, v in jar.items())}
    with_xsrf = {**cookie, "X-XSRFToken": jar["_xsrf"]}
    before = notebook.read_bytes()
    kernels = set(jp_serverapp.kernel_manager.list_kernel_ids())

    # reading with the cookie alone works
    status, answer, _ = await http("GET", "api/agent/notebooks/nb.ipynb", None, cookie)
    assert status == 200, answer
    # changing state with the cookie but without the XSRF token is refused and does nothing
    for method, url, body, _pair in ROUTES:
        if method == "GET":
            continue
        status, answer, _ = await http(method, url, body, cookie)
        assert status == 403 and "_xsrf" in answer["message"], (method, url, answer)
    assert notebook.read_bytes() == before
    assert set(jp_serverapp.kernel_manager.list_kernel_ids()) == kernels
    assert not (jp_root_dir / "made.txt").exists()
    # a wrong XSRF token is refused too
    status, _, _ = await http("POST", ROUTES[1][1], ROUTES[1][2], {**cookie, "X-XSRFToken": "2|0|0|0"})
    assert status == 403 and notebook.read_bytes() == before
    # with the XSRF token the same requests work
    status, answer, _ = await http("POST", ROUTES[1][1], ROUTES[1][2], with_xsrf)
    assert status == 200, answer
    assert notebook.read_bytes() != before
    status, answer, _ = await http("POST", "api/agent/sessions/keep/interrupt", {}, with_xsrf)
    assert status == 200, answer
    status, answer, _ = await http("DELETE", "api/agent/sessions/keep", None, with_xsrf)
    assert status == 204, answer
    # token requests never need it
    status, answer, _ = await http(
        "POST", "api/agent/notebooks/nb.ipynb", {"action": "insert", "content": "t"}, jp_auth_header
    )
    assert status == 200, answer

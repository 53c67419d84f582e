"""No page, header or body an agent can reach carries the server's own token (a real server, real agent
tokens, JupyterLab and Notebook 7 loaded as they are next to the extension).

jupyter_server renders ``page.html`` (every HTML error page) with ``data-jupyter-api-token`` for a
logged-in user, and an agent is logged in: the token must be empty there for agents, while the person
(the server's token, a login cookie) still gets the page they always got.
"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from jupyter_agent_tools.auth import AgentAuthorizer, AgentIdentityProvider

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def jp_server_config() -> dict[str, Any]:
    return {
        "ServerApp": {
            "jpserver_extensions": {
                "jupyter_agent_tools": True,
                "jupyter_server_terminals": True,
                "jupyterlab": True,
                "notebook": True,
            },
            "identity_provider_class": AgentIdentityProvider,
            "authorizer_class": AgentAuthorizer,
        },
        "KernelPool": {"size": 0},
    }


@pytest.fixture
def fetch(http_server_client: Any, jp_base_url: str) -> Any:
    async def call(method: str, url: str, token: str, body: Any = None, **headers: str) -> Any:
        data = json.dumps(body).encode() if body is not None else (b"{}" if method == "POST" else None)
        return await http_server_client.fetch(
            jp_base_url + url,
            method=method,
            body=data,
            headers={"Authorization": f"token {token}", **headers},
            raise_error=False,
            follow_redirects=False,
            request_timeout=60,
            allow_nonstandard_methods=True,
        )

    return call


UPGRADE = {
    "Connection": "Upgrade",
    "Upgrade": "websocket",
    "Sec-WebSocket-Version": "13",
    "Sec-WebSocket-Key": base64.b64encode(os.urandom(16)).decode(),
}

# Every kind of page an agent can make the server render: error pages of each family, refusals,
# websocket handshakes refused, the applications' pages, login and logout.
PAGES: list[tuple[str, str, dict[str, str]]] = [
    ("GET", "files/sub/missing.txt", {}),
    ("GET", "files/secret.txt", {}),
    ("GET", "view/sub/missing.txt", {}),
    ("GET", "view/secret.txt", {}),
    ("GET", "nbconvert/html/sub/missing.ipynb", {}),
    ("GET", "nbconvert/html/sub/a.ipynb", {}),
    ("POST", "api/shutdown", {}),
    ("GET", "api/kernels/{kernel}/channels", UPGRADE),
    ("GET", "api/kernels/{kernel}/channels", {}),
    ("GET", "api/kernels/nokernel/channels", UPGRADE),
    ("GET", "terminals/websocket/1", UPGRADE),
    ("GET", "api/nothing-here", {}),
    ("GET", "nothing-here", {}),
    ("GET", "", {}),
    ("GET", "lab", {}),
    ("GET", "lab/tree/sub/a.ipynb", {}),
    ("GET", "tree", {}),
    ("GET", "tree/sub", {}),
    ("GET", "notebooks/sub/a.ipynb", {}),
    ("GET", "edit/sub/a.ipynb", {}),
    ("GET", "login", {}),
    ("GET", "logout", {}),
    ("POST", "login", {}),
    ("GET", "api/me", {}),
    ("GET", "api/contents/secret.txt", {}),
    ("POST", "api/agent/tokens", {}),
    ("GET", "metrics", {}),
    ("GET", "api/agent/notebooks/sub/missing.ipynb", {}),
]


def _leaks(response: Any, secret: str) -> list[str]:
    """Where ``secret`` (or its URL-encoded form) shows in a response: its body or a header."""
    forms = {secret, quote(secret, safe=""), quote(secret)}
    body = (response.body or b"").decode("utf-8", "replace")
    found = [f"body: ...{body[max(0, body.find(f) - 60) : body.find(f)]}" for f in forms if f in body]
    found += [f"header {k}" for k, v in response.headers.get_all() if any(f in v for f in forms)]
    return found


async def _log_in(client: Any, base_url: str, password: str) -> str:
    """Log in through /login as a browser does (the server's token as the password); the cookies."""
    form = await client.fetch(base_url + "login", raise_error=False)
    xsrf = next(c.split(";")[0] for c in form.headers.get_list("Set-Cookie") if c.startswith("_xsrf="))
    response = await client.fetch(
        base_url + "login",
        method="POST",
        body=f"_xsrf={xsrf.split('=', 1)[1]}&password={quote(password)}",
        headers={"Cookie": xsrf},
        follow_redirects=False,
        raise_error=False,
    )
    assert response.code == 302, response.code
    login = [c.split(";")[0] for c in response.headers.get_list("Set-Cookie") if c.startswith("username-")]
    assert login, response.headers
    return "; ".join([xsrf, *login])


async def test_no_page_an_agent_can_reach_carries_the_servers_token(
    fetch, jp_serverapp: Any, jp_root_dir: Path, http_server_client: Any, jp_base_url: str, jp_http_port: int
) -> None:
    (jp_root_dir / "sub").mkdir()
    (jp_root_dir / "sub" / "a.ipynb").write_text(
        json.dumps({"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5})
    )
    (jp_root_dir / "secret.txt").write_text("outside")
    server_token = jp_serverapp.identity_provider.token
    assert server_token
    made = await fetch(
        "POST", "api/agent/tokens", server_token, {"name": "reader", "scopes": ["read"], "paths": ["sub/**"]}
    )
    assert made.code == 201, made.body
    agent = json.loads(made.body)["token"]
    unlimited = json.loads(
        (await fetch("POST", "api/agent/tokens", server_token, {"name": "all", "scopes": ["read"]})).body
    )["token"]
    kernel = json.loads((await fetch("POST", "api/kernels", server_token, {"name": "python3"})).body)["id"]
    try:
        statuses = {}
        for token in (agent, unlimited):
            for method, url, headers in PAGES:
                url = url.format(kernel=kernel)
                response = await fetch(method, url, token, **headers)
                statuses[(token == agent, method, url, bool(headers))] = response.code
                assert not _leaks(response, server_token), (
                    method,
                    url,
                    response.code,
                    _leaks(response, server_token),
                )
        # the pages were really rendered for the agent (an HTML error page, a refused handshake)
        assert statuses[(True, "GET", "files/sub/missing.txt", False)] == 404
        assert statuses[(True, "POST", "api/shutdown", False)] == 403
        assert statuses[(True, "GET", f"api/kernels/{kernel}/channels", True)] == 403
        page = await fetch("GET", "view/sub/missing.txt", agent)
        assert page.code == 404 and b"<html" in page.body.lower()
        # a page refused to agents says why (it was an empty 403)
        page = await fetch("GET", "lab", agent)
        assert page.code == 403 and b"cannot use this route" in page.body, page.body[:300]

        # the person still gets the page they got, with their token in it: with the server's token, and
        # logged in with a cookie (a browser)
        response = await fetch("GET", "files/sub/missing.txt", server_token)
        assert response.code == 404
        assert f'data-jupyter-api-token="{quote(server_token)}"' in response.body.decode()
        lab = await fetch("GET", "lab", server_token)
        assert lab.code == 200 and server_token in lab.body.decode()
        cookie = await _log_in(http_server_client, jp_base_url, server_token)
        for url in ("files/sub/missing.txt", "lab"):
            page = await http_server_client.fetch(
                jp_base_url + url,
                headers={"Cookie": cookie, "Referer": f"http://127.0.0.1:{jp_http_port}{jp_base_url}lab"},
                raise_error=False,
                follow_redirects=False,
            )
            assert page.code in (200, 404) and quote(server_token) in page.body.decode(), (url, page.code)
    finally:
        await jp_serverapp.kernel_manager.shutdown_kernel(kernel)


async def test_metrics_are_not_served_to_agents(fetch, jp_serverapp: Any) -> None:
    server_token = jp_serverapp.identity_provider.token
    made = await fetch("POST", "api/agent/tokens", server_token, {"name": "watcher", "scopes": ["read"]})
    agent = json.loads(made.body)["token"]
    assert (await fetch("GET", "api/status", agent)).code == 200
    refused = await fetch("GET", "metrics", agent)
    assert refused.code == 403 and b"watcher" not in refused.body and b"jupyter_agent" not in refused.body
    served = await fetch("GET", "metrics", server_token)
    assert served.code == 200 and 'agent="watcher"' in served.body.decode()


async def test_contents_listings_hold_only_what_the_paths_reach(
    fetch, jp_serverapp: Any, jp_root_dir: Path
) -> None:
    reports = jp_root_dir / "reports"
    (reports / "deep").mkdir(parents=True)
    (reports / "a.ipynb").write_text("{}")
    (jp_root_dir / "secret-name.txt").write_text("outside")
    os.symlink(jp_root_dir / "secret-name.txt", reports / "leads-out.txt")
    os.symlink(jp_root_dir, reports / "up")
    os.symlink(reports / "a.ipynb", reports / "stays-in.ipynb")
    server_token = jp_serverapp.identity_provider.token
    tokens = {}
    for name, paths in (("deep", ["reports/**"]), ("dir-only", ["reports"])):
        made = await fetch(
            "POST", "api/agent/tokens", server_token, {"name": name, "scopes": ["read"], "paths": paths}
        )
        tokens[name] = json.loads(made.body)["token"]

    async def listing(token: str) -> set[str]:
        response = await fetch("GET", "api/contents/reports", token)
        assert response.code == 200, response.body
        return {e["name"] for e in json.loads(response.body)["content"]}

    assert await listing(server_token) == {"a.ipynb", "deep", "leads-out.txt", "up", "stays-in.ipynb"}
    assert await listing(tokens["deep"]) == {"a.ipynb", "deep", "stays-in.ipynb"}
    assert await listing(tokens["dir-only"]) == set()  # 'reports' reaches the folder, not what is in it

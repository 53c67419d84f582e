"""The multi-user deployment, for real: a JupyterHub on 127.0.0.1 whose users' servers run this extension.

A remote agent reaches alice's server only through the hub's proxy (``/user/alice/...``), with a hub API
token owned by alice and scoped to her server: the REST routes, the MCP endpoint with the official MCP SDK
client, and ``jupyter agent --url .../user/alice/`` with ``JUPYTERHUB_API_TOKEN``. Bob's token and a token
of alice's without ``access:servers`` are refused and change nothing. What the agent did is in alice's
audit events under the hub's user name. Skipped (saying why) only when the proxy cannot be found.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import nbformat
import pytest
from browser import ARTIFACTS, launch, needs_chromium
from hub_harness import NO_PROXY_REASON, PROXY, Hub, request, running_hub
from nbformat.v4 import new_code_cell, new_notebook
from tornado.httpclient import HTTPRequest
from tornado.websocket import websocket_connect

from jupyter_agent_tools.testing.server import PACKAGE_PARENT

pytest.importorskip("jupyterhub", reason="JupyterHub is not installed (it is in the test extra)")
pytestmark = [
    pytest.mark.timeout(600),
    pytest.mark.skipif(shutil.which(PROXY) is None, reason=NO_PROXY_REASON),
]


# (a notebook without a kernelspec opens JupyterLab's kernel picker over the page)
KERNEL = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    with running_hub(tmp_path_factory.mktemp("hub")) as running:
        for name in ("alice", "bob"):
            running.add_user(name)
        # alice's named server lab2: the same home, its own agent tokens
        running.start_servers([("alice", ""), ("bob", ""), ("alice", "lab2")])
        nbformat.write(
            new_notebook(cells=[new_code_cell("x = 1", id="c1")], metadata=KERNEL),
            str(running.home("alice") / "a.ipynb"),
        )
        yield running


@pytest.fixture(scope="module")
def tokens(hub: Hub) -> dict[str, str]:
    return {
        "alice": hub.token("alice", ["access:servers!server=alice/"]),
        "bob": hub.token("bob", ["access:servers!server=bob/"]),
        "alice-no-access": hub.token("alice", ["read:users:name!user=alice"]),
    }


def agent(hub: Hub, token: str, method: str, route: str, body: Any = None) -> tuple[int, Any]:
    return request(method, hub.server_url("alice") + route, body, token)


@contextlib.asynccontextmanager
async def mcp_session(hub: Hub, authorization: str) -> AsyncIterator[Any]:
    """The official MCP SDK client, initialized, on alice's server through the proxy."""
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    async with (
        create_mcp_http_client(headers={"Authorization": authorization}) as client,
        streamable_http_client(hub.server_url("alice") + "api/agent/mcp", http_client=client) as (
            read,
            write,
        ),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


def test_a_remote_agent_works_on_alices_server_through_the_proxy(hub: Hub, tokens: dict[str, str]) -> None:
    token = tokens["alice"]
    bobs_events = len(hub.events("bob"))
    status, answer = agent(
        hub, token, "POST", "api/agent/eval", {"cells": [{"code": "print(6 * 7)"}], "session": "s"}
    )
    assert status == 200 and answer["output"] == "42\n", answer
    status, answer = agent(
        hub, token, "POST", "api/agent/notebooks/a.ipynb", {"action": "insert", "content": "y = 2"}
    )
    assert status == 200, answer
    status, answer = agent(hub, token, "GET", "api/agent/notebooks/a.ipynb")
    sources = [c["source"] for c in answer["cells"]]
    assert status == 200 and sources[0] == "x = 1" and sources[-1] == "y = 2", answer
    status, listing = agent(hub, token, "GET", "api/agent/sessions")
    owners = {s["name"]: s["owner"] for s in listing["sessions"]}  # the module's other tests add theirs
    people = {owner for owner in owners.values() if not owner.startswith("agent:")}  # agents: tests below
    assert status == 200 and owners["s"] == "alice" and people == {"alice"}, owners
    # alice's audit events name the hub user
    events = hub.events("alice")
    by_schema = {e["__schema__"].split("/")[-2]: e for e in events}
    assert by_schema["execution"]["user"] == "alice" and by_schema["execution"]["session"] == "s", events
    assert (
        by_schema["notebook_change"]["user"] == "alice" and by_schema["notebook_change"]["path"] == "a.ipynb"
    )
    assert len(hub.events("bob")) == bobs_events  # nothing of alice's reached bob's server


def test_other_users_and_tokens_without_server_access_are_refused(hub: Hub, tokens: dict[str, str]) -> None:
    notebook = hub.home("alice") / "a.ipynb"
    before = notebook.read_bytes()
    _, listing = agent(hub, tokens["alice"], "GET", "api/agent/sessions")
    for name in ("bob", "alice-no-access"):
        for method, route, body in [
            ("GET", "api/agent/notebooks/a.ipynb", None),
            ("POST", "api/agent/notebooks/a.ipynb", {"action": "insert", "content": "stolen"}),
            ("POST", "api/agent/eval", {"cells": [{"code": "open('pwned', 'w').close()"}], "session": "x"}),
            ("POST", "api/agent/mcp", {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}),
            ("GET", "api/contents/a.ipynb", None),
        ]:
            status, answer = agent(hub, tokens[name], method, route, body)
            assert status == 403, (name, route, status, answer)
    assert notebook.read_bytes() == before
    assert not (hub.home("alice") / "pwned").exists()
    assert agent(hub, tokens["alice"], "GET", "api/agent/sessions")[1]["sessions"] == listing["sessions"]
    # bob's own token works on bob's server
    status, answer = request(
        "POST", hub.server_url("bob") + "api/agent/eval", {"cells": [{"code": "1"}]}, tokens["bob"]
    )
    assert status == 200, answer


def test_the_mcp_sdk_client_through_the_proxy(hub: Hub, tokens: dict[str, str]) -> None:
    async def run() -> tuple[Any, Any]:
        async with mcp_session(hub, f"token {tokens['alice']}") as session:
            ran = await session.call_tool("eval", {"cells": [{"code": "print('via mcp')"}], "session": "m"})
            read_back = await session.call_tool("notebook_read", {"path": "a.ipynb"})
            return ran, read_back

    ran, read_back = asyncio.run(run())
    assert not ran.is_error and "via mcp" in ran.content[0].text, ran
    assert not read_back.is_error and "x = 1" in read_back.content[0].text, read_back
    executions = [e for e in hub.events("alice") if e["__schema__"].endswith("/execution/v1")]
    assert executions[-1]["user"] == "alice" and executions[-1]["session"] == "m"


def test_the_cli_with_jupyterhub_api_token(hub: Hub, tokens: dict[str, str], tmp_path: Path) -> None:
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(PACKAGE_PARENT),
        "HOME": str(tmp_path),
        "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
        "JUPYTERHUB_API_TOKEN": tokens["alice"],
    }
    url = hub.server_url("alice")
    cli = [sys.executable, "-m", "jupyter_agent_tools.cli", "--url", url]
    ran = subprocess.run(
        [*cli, "eval", "-c", "print(6 * 7)"], capture_output=True, text=True, env=env, timeout=120
    )
    assert ran.returncode == 0 and ran.stdout == "42\n", ran.stderr
    shown = subprocess.run(
        [*cli, "nb", "show", "a.ipynb", "--json"], capture_output=True, text=True, env=env, timeout=120
    )
    assert shown.returncode == 0 and json.loads(shown.stdout)["cells"][0]["source"] == "x = 1", shown.stderr
    env["JUPYTERHUB_API_TOKEN"] = tokens["bob"]
    refused = subprocess.run([*cli, "sessions"], capture_output=True, text=True, env=env, timeout=120)
    assert refused.returncode == 3 and "403" in refused.stderr, refused.stderr


# -- agents as agents: agent tokens on the single-user servers ------------------------------------------


def make_agent_token(hub: Hub, token: str, body: dict[str, Any], server_name: str = "") -> dict[str, Any]:
    status, answer = request("POST", hub.server_url("alice", server_name) + "api/agent/tokens", body, token)
    assert status == 201, (status, answer)
    return dict(answer)


async def mcp_calls(hub: Hub, token: str) -> tuple[Any, Any, Any]:
    """An eval, a read inside the token's paths and one outside, through the official MCP SDK client."""
    async with mcp_session(hub, f"Bearer {token}") as session:
        ran = await session.call_tool("eval", {"cells": [{"code": "1"}], "session": "mcp-agent"})
        inside = await session.call_tool("notebook_read", {"path": "shared/s.ipynb"})
        outside = await session.call_tool("notebook_read", {"path": "a.ipynb"})
        return ran, inside, outside


def test_alice_makes_agent_tokens_and_an_agent_is_itself_on_her_server_only(
    hub: Hub, tokens: dict[str, str], tmp_path: Path
) -> None:
    """Made with alice's hub API token (the CLI, as the person), used through the proxy: the agent is
    ``agent:NAME`` with its scopes and paths; no request with its token reaches the hub's API; it is
    nothing on bob's server and on alice's other server."""
    (hub.home("alice") / "shared").mkdir(exist_ok=True)
    nbformat.write(
        new_notebook(cells=[new_code_cell("s = 1", id="s1")]), str(hub.home("alice") / "shared/s.ipynb")
    )
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(PACKAGE_PARENT),
        "HOME": str(tmp_path),
        "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
        "JUPYTERHUB_API_TOKEN": tokens["alice"],
    }
    cli = [sys.executable, "-m", "jupyter_agent_tools.cli", "--url", hub.server_url("alice"), "--json"]
    made = subprocess.run(
        [*cli, "token", "create", "reader", "--scopes", "read", "--paths", "shared/**"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert made.returncode == 0, made.stderr
    reader = json.loads(made.stdout)["token"]
    assert reader.startswith("jat_")
    # the admin's cap (docs' z2jh values: a day): no expiry asked -> the cap; longer -> 400 saying so
    expires = json.loads(made.stdout)["expires"]
    status, listing = agent(hub, tokens["alice"], "GET", "api/agent/tokens")
    assert status == 200 and [t["expires"] for t in listing["tokens"] if t["name"] == "reader"] == [expires]
    assert expires is not None
    status, answer = agent(
        hub,
        tokens["alice"],
        "POST",
        "api/agent/tokens",
        {"name": "long", "scopes": ["read"], "expires_in": 604800},
    )
    assert status == 400 and "max_token_lifetime" in answer["message"], answer
    asked_the_hub = hub.api_requests()
    notebook = hub.home("alice") / "shared/s.ipynb"
    before = notebook.read_bytes()

    status, answer = agent(hub, reader, "GET", "api/agent/notebooks/shared/s.ipynb")
    assert status == 200 and answer["cells"][0]["source"] == "s = 1", answer
    status, answer = agent(hub, reader, "GET", "api/me")
    assert status == 200 and answer["identity"]["username"] == "agent:reader", answer
    status, answer = agent(
        hub, reader, "POST", "api/agent/notebooks/shared/s.ipynb", {"action": "insert", "content": "x"}
    )
    assert status == 403 and "edit" in answer["message"], answer  # read-only cannot edit
    assert agent(hub, reader, "GET", "api/agent/notebooks/a.ipynb")[0] == 404  # outside its paths
    assert agent(hub, reader, "GET", "api/contents/a.ipynb")[0] == 404  # jupyter_server's own route too
    status, answer = agent(hub, reader, "POST", "api/agent/eval", {"cells": [{"code": "1"}], "session": "r"})
    assert status == 403, answer  # no execute scope
    assert notebook.read_bytes() == before
    # the official MCP SDK client and the CLI, with the agent token: the same agent, the same limits
    ran, read_back, outside = asyncio.run(mcp_calls(hub, reader))
    assert ran.is_error and "execute" in ran.content[0].text, ran
    assert not read_back.is_error and "s = 1" in read_back.content[0].text, read_back
    assert outside.is_error, outside
    as_agent = {**env, "JUPYTER_AGENT_TOKEN": reader}
    shown = subprocess.run(
        [*cli, "nb", "show", "shared/s.ipynb"], capture_output=True, text=True, env=as_agent, timeout=120
    )
    assert shown.returncode == 0 and json.loads(shown.stdout)["cells"][0]["source"] == "s = 1", shown.stderr
    refused = subprocess.run(
        [*cli, "eval", "-c", "1"], capture_output=True, text=True, env=as_agent, timeout=120
    )
    assert refused.returncode != 0 and "403" in refused.stderr, refused.stderr
    # the same token elsewhere: bob's server, alice's named server (each server has its own tokens)
    for url in (hub.server_url("bob"), hub.server_url("alice", "lab2")):
        status, answer = request("GET", url + "api/contents", None, reader)
        assert status == 403 and "not one of this server's" in answer["message"], (url, status, answer)
    # an agent token no server knows is refused by the server too, not asked of the hub
    status, _ = agent(hub, "jat_" + "x" * 43, "GET", "api/contents")
    assert status == 403
    assert hub.api_requests() == asked_the_hub  # none of those requests reached the hub's API
    # alice's hub token still works as alice, and the agent's reads are in her events as the agent
    fresh = hub.token(
        "alice", ["access:servers!server=alice/"]
    )  # not in the server's cache: the hub is asked
    assert agent(hub, fresh, "GET", "api/me")[1]["identity"]["username"] == "alice"
    assert hub.api_requests() > asked_the_hub  # (so the counter moves when the hub is asked)
    agents = [e for e in hub.events("alice") if e.get("user") == "agent:reader"]
    assert agents and all(e["on_behalf_of"] == "alice" for e in agents), hub.events("alice")[-5:]


def test_with_ask_execute_only_alices_browser_session_approves(hub: Hub, tokens: dict[str, str]) -> None:
    """An agent that must ask before executing waits; its own token, alice's hub API token (an agent may
    hold one) and bob cannot decide; alice, logged in through the hub, approves; the eval runs once."""
    runner = make_agent_token(
        hub, tokens["alice"], {"name": "runner", "scopes": ["read", "execute"], "ask": ["execute"]}
    )["token"]
    ran_file = hub.home("alice") / "ran.txt"
    answers: list[tuple[int, Any]] = []
    code = f"with open({str(ran_file)!r}, 'a') as f: f.write('ran\\n')\nprint('done')"
    waiting = threading.Thread(
        target=lambda: answers.append(
            agent(
                hub,
                runner,
                "POST",
                "api/agent/eval",
                {"cells": [{"code": code}], "session": "ask", "approval_wait": 120},
            )
        )
    )
    waiting.start()
    pending: list[dict[str, Any]] = []
    deadline = time.monotonic() + 60
    while not pending and time.monotonic() < deadline:
        pending = [
            a
            for a in agent(hub, tokens["alice"], "GET", "api/agent/approvals")[1]["pending"]
            if a["agent"] == "agent:runner"
        ]
        time.sleep(0.2)
    assert pending, "the agent's eval did not ask"
    decide = f"api/agent/approvals/{pending[0]['id']}"
    approve = {"decision": "approve"}
    status, answer = agent(hub, runner, "POST", decide, approve)
    assert status == 403, answer  # the agent itself
    status, answer = agent(hub, tokens["alice"], "POST", decide, approve)
    assert status == 403 and "Agents panel" in answer["message"], answer  # a bare hub API token of alice's
    status, answer = agent(hub, tokens["bob"], "POST", decide, approve)
    assert status == 403, answer
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(PACKAGE_PARENT),
        "JUPYTERHUB_API_TOKEN": tokens["alice"],
    }
    cli = [sys.executable, "-m", "jupyter_agent_tools.cli", "--url", hub.server_url("alice")]
    approving = [*cli, "approvals", "approve", str(pending[0]["id"])]
    refused = subprocess.run(approving, capture_output=True, text=True, env=env, timeout=120)
    assert refused.returncode != 0 and "Agents panel" in refused.stderr, refused  # says how to decide
    assert not ran_file.exists() and waiting.is_alive()
    browser, page_token = hub.login("alice")  # what JupyterLab's panel sends after the hub's login
    decided = browser.post(
        hub.server_url("alice") + decide,
        json=approve,
        headers={
            "Authorization": f"token {page_token}",
            "X-XSRFToken": next(
                c.value for c in browser.cookies if c.name == "_xsrf" and c.path.startswith("/user/alice")
            ),
        },
        timeout=60,
    )
    assert decided.status_code == 200, decided.text
    assert decided.json()["state"] == "approved" and decided.json()["decided_by"] == "alice", decided.json()
    waiting.join(120)
    assert answers and answers[0][0] == 200 and answers[0][1]["output"] == "done\n", answers
    assert ran_file.read_text() == "ran\n"  # once


def test_revoking_an_agent_token_on_the_hub_closes_its_websockets(hub: Hub, tokens: dict[str, str]) -> None:
    watcher = make_agent_token(hub, tokens["alice"], {"name": "watcher", "scopes": ["read"]})["token"]
    url = hub.server_url("alice").replace("http://", "ws://") + "api/events/subscribe"

    async def run() -> Any:
        connection = await websocket_connect(HTTPRequest(url, headers={"Authorization": f"token {watcher}"}))
        status, answer = agent(hub, tokens["alice"], "DELETE", "api/agent/tokens/watcher")
        assert status == 200 and answer["status"] == "revoked", answer
        return await asyncio.wait_for(connection.read_message(), 30)  # None: the server closed it

    assert asyncio.run(run()) is None
    status, _ = agent(hub, watcher, "GET", "api/contents")
    assert status == 403
    status, answer = agent(hub, tokens["alice"], "GET", "api/me")  # a hub token of alice's still works
    assert status == 200 and answer["identity"]["username"] == "alice", answer


@needs_chromium
def test_alice_approves_in_her_panel_after_the_hubs_login_in_chromium(
    hub: Hub, tokens: dict[str, str]
) -> None:
    """The person's side in a real browser: alice logs in on the hub's page, makes her agent's token in her
    JupyterLab's Agents panel (shown once, with configuration naming her server through the proxy); the
    panel shows the agent's waiting eval under the agent's name, she approves it there, it runs once, and the
    decision names her (screenshots: ``test-artifacts/hub_connect_agent.png``, ``hub_approval.png``)."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    code = "print('approved in the panel', 6 * 7)"
    panel, tab = "#jp-agent-activity", '.jp-SideBar [data-id="jp-agent-activity"]'
    with sync_api.sync_playwright() as playwright:
        browser = launch(playwright)
        try:
            page = browser.new_context(viewport={"width": 1400, "height": 860}).new_page()
            page.goto(f"{hub.url}hub/login", timeout=90_000)
            page.fill("#username_input", "alice")
            page.fill("#password_input", "any")
            with page.expect_navigation(timeout=60_000):  # to her server, or the hub's home
                page.click("#login_submit")
            page.goto(hub.server_url("alice") + "lab/tree/a.ipynb?reset", timeout=90_000)
            page.wait_for_function(
                "() => document.querySelector('.jp-Notebook')?.innerText.includes('x = 1')", timeout=90_000
            )
            page.locator(tab).click()
            page.wait_for_selector(f'{panel}[data-connected="true"]', state="visible", timeout=60_000)
            # She makes the agent's token in her panel: read and execute, asking her before it runs code.
            page.locator(f'{panel} button[data-action="connect"]').click()
            form = page.locator(".jp-Dialog")
            form.locator('input[data-field="name"]').fill("panel-bot")
            # the admin's cap (a day, the docs' z2jh values): the form offers nothing longer
            assert form.locator('select[data-field="expires"]').input_value() == "86400"
            form.locator('input[data-scope="execute"]').check()
            form.locator('input[data-ask="execute"]').check()
            form.locator("button.jp-mod-accept").click()
            shown = page.locator('.jp-Dialog [data-snippet="token"] pre')
            shown.wait_for(timeout=30_000)
            bot = shown.inner_text().strip()
            mcp = json.loads(page.locator('.jp-Dialog [data-snippet="mcp"] pre').inner_text())
            assert bot.startswith("jat_") and mcp["mcpServers"]["jupyter"]["url"] == (
                hub.server_url("alice") + "api/agent/mcp"
            ), mcp  # the configuration names her server as the browser reaches it: through the proxy
            page.screenshot(path=str(ARTIFACTS / "hub_connect_agent.png"))
            page.locator(".jp-Dialog button.jp-mod-accept").click()
            page.locator(f'{panel} [data-token="panel-bot"]').wait_for(timeout=30_000)
            with ThreadPoolExecutor(1) as pool:
                body = {"cells": [{"code": code}], "session": "panel", "approval_wait": 150}
                call = pool.submit(agent, hub, bot, "POST", "api/agent/eval", body)
                row = page.locator(
                    f'{panel} [data-section="waiting-for-you"] [data-approval-id]', has_text=code
                )
                row.wait_for(timeout=60_000)
                assert "agent:panel-bot" in row.inner_text()
                approval_id = row.get_attribute("data-approval-id")
                ARTIFACTS.mkdir(exist_ok=True)
                page.screenshot(path=str(ARTIFACTS / "hub_approval.png"))
                assert not call.done()
                row.locator('button[data-action="approve"]').click()
                status, answer = call.result(timeout=120)
        finally:
            browser.close()
    assert status == 200 and answer["output"] == "approved in the panel 42\n", answer
    decided = agent(hub, tokens["alice"], "GET", f"api/agent/approvals/{approval_id}")[1]
    assert decided["state"] == "approved" and decided["decided_by"] == "alice", decided


# -- MCP clients sign in at the hub's agent OAuth service (issue 45 B) -------------------------------------


class HubPerson:
    """alice at the hub's consent page, in her browser session (the hub's login, then its OAuth to the
    service): opens the authorize URL, answers the form with ``choice``."""

    def __init__(self, browser: Any, choices: list[dict[str, Any]]):
        self.browser, self.choices, self.location, self.page, self.pages = browser, choices, "", "", 0

    def _answer(self, url: str) -> None:
        page = self.browser.get(url, timeout=60)  # the service's login goes through the hub's OAuth
        assert page.status_code == 200, (page.status_code, page.url, page.text[:2000])
        assert "frame-ancestors 'none'" in page.headers["Content-Security-Policy"]  # no clickjacking
        self.page = page.text
        request_id = re.search(r'name="request" value="([^"]+)"', page.text)
        xsrf = re.search(r'name="_xsrf" value="([^"]+)"', page.text)
        assert request_id and xsrf, page.text[:2000]
        self.pages += 1
        form = {"request": request_id[1], **self.choices.pop(0)}
        forged = self.browser.post(page.url, data=form, allow_redirects=False, timeout=60)
        assert forged.status_code == 403, forged.status_code  # a cross-site form has no XSRF token
        form["_xsrf"] = xsrf[1]
        answered = self.browser.post(page.url, data=form, allow_redirects=False, timeout=60)
        assert answered.status_code == 302, (answered.status_code, answered.text[:2000])
        self.location = answered.headers["Location"]

    async def redirect(self, url: str) -> None:
        await asyncio.to_thread(self._answer, url)

    async def callback(self) -> Any:
        from mcp.client.auth import AuthorizationCodeResult

        query = parse_qs(urlsplit(self.location).query)
        assert "code" in query, self.location
        return AuthorizationCodeResult(code=query["code"][0], state=query["state"][0], iss=query["iss"][0])


class Memory:
    def __init__(self) -> None:
        self.tokens: Any = None
        self.client: Any = None

    async def get_tokens(self) -> Any:
        return self.tokens

    async def set_tokens(self, tokens: Any) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> Any:
        return self.client

    async def set_client_info(self, client_info: Any) -> None:
        self.client = client_info


INIT = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}


def mcp_call(hub: Hub, user: str, token: str) -> tuple[int, Any, str]:
    """A raw MCP initialize to ``user``'s server with a bearer token: (status, JSON, WWW-Authenticate)."""
    import httpx

    answer = httpx.post(
        hub.server_url(user) + "api/agent/mcp",
        json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": INIT},
        headers={"Authorization": f"Bearer {token}", "Accept": "application/json, text/event-stream"},
        timeout=60,
    )
    try:
        body = answer.json()
    except ValueError:
        body = answer.text
    return answer.status_code, body, answer.headers.get("WWW-Authenticate", "")


def test_an_mcp_client_signs_in_at_the_hub_for_alices_server_only(hub: Hub) -> None:
    """The official SDK's OAuthClientProvider: alice's server's 401 -> its metadata names the hub's service
    -> metadata at the hub's origin (the proxy's extra route) -> registration -> alice consents (read, under
    reports/) after the hub's login -> a signed token for her server's MCP URL. A read tool works there;
    the same token is refused on bob's server (audience), tampered or expired; its refresh token rotates,
    and reusing a spent one revokes the grant, which alice's server then refuses."""
    from mcp import ClientSession
    from mcp.client.auth import OAuthClientProvider
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client
    from mcp.shared.auth import OAuthClientMetadata

    (hub.home("alice") / "reports").mkdir(exist_ok=True)
    (hub.home("alice") / "reports" / "r.txt").write_text("report")
    browser, _ = hub.login("alice")
    choice = {"decision": "approve", "scope": ["read"], "paths": "reports/**", "ask": [], "lifetime": "1 day"}
    person = HubPerson(browser, [choice, {**choice, "scope": ["read", "execute"]}])
    storage = Memory()
    mcp_url = hub.server_url("alice") + "api/agent/mcp"
    metadata = OAuthClientMetadata(
        client_name="Hub Agent (SDK)",
        redirect_uris=["http://127.0.0.1:33418/callback"],
        token_endpoint_auth_method="none",
    )
    provider = OAuthClientProvider(mcp_url, metadata, storage, person.redirect, person.callback)

    async def signed_in() -> None:
        async with (
            create_mcp_http_client(auth=provider) as http,
            streamable_http_client(mcp_url, http_client=http) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            listed = await session.call_tool("file_list", {"path": "reports"})
            assert not listed.is_error and "r.txt" in str(listed.content), listed
            outside = await session.call_tool("file_list", {"path": ""})  # only reports/** was granted
            assert outside.is_error or "a.ipynb" not in str(outside.content), outside
            assert person.pages == 1 and storage.tokens.scope == "read"
            # eval needs execute: 403 insufficient_scope, alice is asked again (a step-up), and it runs
            ran = await session.call_tool("eval", {"cells": [{"code": "print(6 * 7)"}]})
            assert person.pages == 2 and not ran.is_error and "42" in str(ran.content), ran

    asyncio.run(signed_in())
    ran = [e for e in hub.events("alice") if e["__schema__"].endswith("/execution/v1")][-1]
    assert ran["user"].startswith("agent:oauth-hub-agent-sdk-") and ran["on_behalf_of"] == "alice", ran
    assert "Hub Agent (SDK)" in person.page and "alice" in person.page and "unverified app" in person.page
    tokens = storage.tokens
    assert tokens is not None and tokens.scope == "read execute" and tokens.refresh_token
    access = tokens.access_token
    assert access.startswith("eyJ") and access.count(".") == 2
    # the metadata the SDK found: the issuer is the hub's origin
    origin = hub.url.rstrip("/")
    status, found = request("GET", origin + "/.well-known/oauth-authorization-server")
    assert status == 200 and found["issuer"] == origin, found
    assert found["token_endpoint"] == origin + "/services/agent-oauth/token"
    assert found["code_challenge_methods_supported"] == ["S256"]
    status, resource = request(
        "GET", hub.server_url("alice") + ".well-known/oauth-protected-resource/api/agent/mcp"
    )
    assert status == 200 and resource["authorization_servers"] == [origin], resource
    assert resource["resource"] == mcp_url

    # the agent is itself on alice's server: its name, its scope (edit is refused)
    assert mcp_call(hub, "alice", access)[0] == 200
    # refused on bob's server: the token is for alice's (its audience)
    status, answer, challenge = mcp_call(hub, "bob", access)
    assert status == 401 and 'error="invalid_token"' in challenge, (status, answer, challenge)
    assert "not for this server" in answer["message"], answer
    # a tampered signature, and an expired token signed with the service's own key
    head, body, signature = access.split(".")
    flipped = signature[:-2] + ("A" if signature[-2] != "A" else "B") + signature[-1]
    status, answer, challenge = mcp_call(hub, "alice", f"{head}.{body}.{flipped}")
    assert status == 401 and "signature" in answer["message"], answer
    from jupyter_agent_tools.oauth import jwt

    key = jwt.load_private_key((hub.tmp / "jupyter-agent-oauth" / "signing_key.pem").read_bytes())
    claims = json.loads(jwt.b64decode(body))
    old = {**claims, "iat": claims["iat"] - 7200, "exp": claims["iat"] - 3600}
    status, answer, _ = mcp_call(hub, "alice", jwt.sign(old, key, jwt.public_jwk(key)["kid"]))
    assert status == 401 and "expired" in answer["message"], answer
    forged = jwt.sign({**claims, "aud": hub.server_url("bob") + "api/agent/mcp"}, key, "another-key")
    assert mcp_call(hub, "bob", forged)[0] == 401

    # refresh: rotation, and the reuse of a spent refresh token revokes the grant
    token_url = origin + "/services/agent-oauth/token"
    form = {
        "grant_type": "refresh_token",
        "refresh_token": tokens.refresh_token,
        "client_id": storage.client.client_id,
    }
    renewed = httpx_post(token_url, form)
    assert renewed.status_code == 200, renewed.text
    fresh = renewed.json()
    assert fresh["refresh_token"] != tokens.refresh_token and fresh["scope"] == "read execute"
    assert mcp_call(hub, "alice", fresh["access_token"])[0] == 200
    events_url = hub.server_url("alice").replace("http://", "ws://") + "api/events/subscribe"

    async def revoked_closes_its_websocket() -> Any:
        auth = {"Authorization": f"Bearer {fresh['access_token']}"}
        connection = await websocket_connect(HTTPRequest(events_url, headers=auth))
        reused = httpx_post(token_url, form)  # the spent refresh token again: the grant is revoked
        assert reused.status_code == 400 and reused.json()["error"] == "invalid_grant"
        return await asyncio.wait_for(connection.read_message(), 30)  # None: alice's server closed it

    assert asyncio.run(revoked_closes_its_websocket()) is None
    after = httpx_post(token_url, {**form, "refresh_token": fresh["refresh_token"]})
    assert after.status_code == 400 and after.json()["error"] == "invalid_grant", after.text
    status, revoked = request("GET", origin + "/services/agent-oauth/revoked")
    assert status == 200 and claims["grant"] in revoked["revoked"]
    deadline = time.monotonic() + 10  # alice's server reads the revocation list every second (the test's)
    while mcp_call(hub, "alice", fresh["access_token"])[0] == 200 and time.monotonic() < deadline:
        time.sleep(0.25)
    status, answer, _ = mcp_call(hub, "alice", fresh["access_token"])
    assert status == 401 and "revoked" in answer["message"], answer


def httpx_post(url: str, form: dict[str, str]) -> Any:
    import httpx

    return httpx.post(url, data=form, timeout=60)

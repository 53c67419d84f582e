"""The multi-user deployment, for real: a JupyterHub on 127.0.0.1 whose users' servers run this extension.

A remote agent reaches alice's server only through the hub's proxy (``/user/alice/...``), with a hub API
token owned by alice and scoped to her server: the REST routes, the MCP endpoint with the official MCP SDK
client, and ``jupyter agent --url .../user/alice/`` with ``JUPYTERHUB_API_TOKEN``. Bob's token and a token
of alice's without ``access:servers`` are refused and change nothing. What the agent did is in alice's
audit events under the hub's user name. Skipped (saying why) only when the proxy cannot be found.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
import pytest
from hub_harness import NO_PROXY_REASON, PROXY, Hub, request, running_hub
from nbformat.v4 import new_code_cell, new_notebook

from jupyter_agent_tools.testing.server import PACKAGE_PARENT

pytest.importorskip("jupyterhub", reason="JupyterHub is not installed (it is in the test extra)")
pytestmark = [
    pytest.mark.timeout(600),
    pytest.mark.skipif(shutil.which(PROXY) is None, reason=NO_PROXY_REASON),
]


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    with running_hub(tmp_path_factory.mktemp("hub")) as running:
        for name in ("alice", "bob"):
            running.add_user(name)
            running.start_server(name)
        nbformat.write(
            new_notebook(cells=[new_code_cell("x = 1", id="c1")]), str(running.home("alice") / "a.ipynb")
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
    assert status == 200 and owners["s"] == "alice" and set(owners.values()) == {"alice"}, owners
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
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    async def run() -> tuple[Any, Any]:
        headers = {"Authorization": f"token {tokens['alice']}"}
        async with (
            create_mcp_http_client(headers=headers) as client,
            streamable_http_client(hub.server_url("alice") + "api/agent/mcp", http_client=client) as (
                read,
                write,
            ),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
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

"""Share my focus (issue 48) through the real routes of one real server (a subprocess with agent tokens):
off by default (403 saying how to share), the person's tab publishes and agents read it within their
paths, another tab shared with other agents is never reported, stopping removes it at once, agents cannot
publish, UI actions reach the sharing tab, and MCP's ``jupyter://focus`` with ``resources/subscribe``
is told of each change it may see, pushed by the change, and of none it may not (the official MCP SDK client).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook
from tornado.websocket import websocket_connect

from jupyter_agent_tools.testing.server import Server, jupyter_server

pytestmark = pytest.mark.timeout(240)

TAB, OTHER_TAB, THIRD_TAB = "tab-aaaaaaaa", "tab-bbbbbbbb", "tab-cccccccc"
PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("root")
    config = root.parent / "rules.json"  # a rule on one notebook: the gate sees a focused call's path
    deny = {"who": "agent:gated", "actions": ["execute"], "paths": ["reports/this.ipynb"], "decision": "deny"}
    config.write_text(json.dumps({"ApprovalPolicy": {"rules": [deny]}}))
    for name in ("reports/a.ipynb", "secret.ipynb"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(new_notebook(cells=[new_code_cell("x = 1", id="c1")]), str(root / name))
    args = [
        "--ServerApp.identity_provider_class=jupyter_agent_tools.auth.AgentIdentityProvider",
        "--ServerApp.authorizer_class=jupyter_agent_tools.auth.AgentAuthorizer",
        "--KernelPool.size=0",
        "--FocusStore.max_output_chars=100",
        f"--config={config}",
    ]
    with jupyter_server(root_dir=Path(root), extra_args=args) as running:
        yield running


def call(
    server: Server, method: str, path: str, body: Any = None, token: str | None = None
) -> tuple[int, Any]:
    with server.client(timeout=60) as client:
        if token is not None:
            client.headers["Authorization"] = f"token {token}"
            client.close()  # (its connection is made again with the header)
        status, content = client.request(method, path, body)
    return status, json.loads(content) if content else None


@pytest.fixture(scope="module")
def tokens(server: Server) -> dict[str, str]:
    made = {}
    for name, paths in (("helper", None), ("reporter", ["reports/**"]), ("named", None)):
        body: dict[str, Any] = {"name": name, "scopes": ["read"]}
        if paths is not None:
            body["paths"] = paths
        status, answer = call(server, "POST", "api/agent/tokens", body)
        assert status == 201, answer
        made[name] = answer["token"]
    return made


@pytest.fixture(autouse=True)
def no_tab_shares(server: Server) -> None:
    """Each test starts with no tab sharing (a failed one may have left its tabs: not the next one's)."""
    for tab in (TAB, OTHER_TAB, THIRD_TAB):
        call(server, "DELETE", f"api/agent/focus/tabs/{tab}")


def focus_body(path: str, agents: Any = "all", source: str = "df.plot()") -> dict[str, Any]:
    return {
        "agents": agents,
        "path": path,
        "cell": {
            "id": "c1",
            "index": 0,
            "cell_type": "code",
            "source": source,
            "execution_count": 3,
            "outputs": [
                {"output_type": "stream", "name": "stdout", "text": "y" * 500},
                {
                    "output_type": "display_data",
                    "data": {"image/png": PNG, "text/plain": "<Figure>"},
                    "metadata": {},
                },
            ],
        },
        "selection": {"text": "plot", "start": {"line": 0, "column": 3}, "end": {"line": 0, "column": 7}},
        "kernel": {"name": "python3", "status": "idle"},
    }


def test_focus_is_off_by_default_then_read_within_paths_and_gone_at_once(
    server: Server, tokens: dict[str, str]
) -> None:
    # off: a clear 403 saying how the person shares it
    status, answer = call(server, "GET", "api/agent/focus", token=tokens["helper"])
    assert status == 403 and "Share my focus" in answer["message"], answer
    # agents cannot publish or stop a focus, whatever their scopes
    for method, body in (("PUT", focus_body("reports/a.ipynb")), ("DELETE", None)):
        status, answer = call(server, method, f"api/agent/focus/tabs/{TAB}", body, token=tokens["helper"])
        assert status == 403, (method, answer)
    # bad input: clear 400s
    assert call(server, "PUT", "api/agent/focus/tabs/x", focus_body("a.ipynb"))[0] == 400
    status, answer = call(server, "PUT", f"api/agent/focus/tabs/{TAB}", {"agents": "some"})
    assert status == 400 and "agents" in answer["message"], answer
    status, answer = call(server, "PUT", f"api/agent/focus/tabs/{TAB}", {"path": "../../etc/passwd"})
    assert status == 400 and "path" in answer["message"], answer

    # the person's tab shares with every agent: the agent reads it, cut and summarized
    status, answer = call(server, "PUT", f"api/agent/focus/tabs/{TAB}", focus_body("reports/a.ipynb"))
    assert status == 200 and answer["tab"] == TAB, answer
    status, focus = call(server, "GET", "api/agent/focus", token=tokens["helper"])  # at once: no waiting
    assert status == 200, focus
    assert (
        focus["path"] == "reports/a.ipynb" and focus["cell"]["id"] == "c1" and focus["shared_with"] == "all"
    )
    stream, image = focus["cell"]["outputs"]
    assert stream["text"].startswith("y" * 100) and "truncated 400 more characters" in stream["text"]
    assert image["text"] == "<Figure>" and image["data"] == [{"mime": "image/png", "bytes": 70}]
    assert focus["selection"]["text"] == "plot" and focus["kernel"] == {"name": "python3", "status": "idle"}
    assert call(server, "GET", "api/agent/focus", token=tokens["reporter"])[0] == 200  # inside its paths

    # a second tab shares only with "named", later: the others never see it, "named" does
    status, _ = call(
        server, "PUT", f"api/agent/focus/tabs/{OTHER_TAB}", focus_body("secret.ipynb", ["named"])
    )
    assert status == 200
    assert call(server, "GET", "api/agent/focus", token=tokens["helper"])[1]["tab"] == TAB
    assert call(server, "GET", "api/agent/focus", token=tokens["named"])[1]["tab"] == OTHER_TAB
    status, answer = call(server, "GET", "api/agent/focus", token=tokens["reporter"])
    assert status == 200 and answer["tab"] == TAB  # (OTHER_TAB: neither shared with it nor inside its paths)

    # the person moves to a notebook outside the reporter's paths: it sees nothing (the same 403 as off)
    assert call(server, "PUT", f"api/agent/focus/tabs/{TAB}", focus_body("secret.ipynb"))[0] == 200
    status, answer = call(server, "GET", "api/agent/focus", token=tokens["reporter"])
    assert status == 403 and "secret" not in json.dumps(answer), answer
    assert call(server, "GET", "api/agent/focus", token=tokens["helper"])[1]["path"] == "secret.ipynb"

    # toggled off: gone at once
    for tab in (TAB, OTHER_TAB):
        assert call(server, "DELETE", f"api/agent/focus/tabs/{tab}")[0] == 204
    for name in ("helper", "named"):
        assert call(server, "GET", "api/agent/focus", token=tokens[name])[0] == 403


def test_ui_actions_go_to_the_sharing_tab_allow_listed_and_within_paths(
    server: Server, tokens: dict[str, str]
) -> None:
    async def run() -> list[dict[str, Any]]:
        url = server.url.replace("http", "ws", 1) + "api/events/subscribe"
        ws = await websocket_connect(_request(url, server.token))
        try:
            assert (
                call(server, "PUT", f"api/agent/focus/tabs/{THIRD_TAB}", focus_body("reports/a.ipynb"))[0]
                == 200
            )
            action = {"action": "reveal_cell", "path": "reports/a.ipynb", "cell_id": "c1", "message": "here"}
            status, answer = call(server, "POST", "api/agent/focus/actions", action, token=tokens["reporter"])
            assert status == 200 and answer["delivered"] == "tab", answer
            assert call(server, "GET", "api/agent/focus", token=tokens["reporter"])[0] == 200
            # not in the allow-list, outside the agent's paths, missing what it needs: refused, nothing sent
            refused = [
                ({"action": "run_command", "command": "terminal:create-new"}, 400),
                ({"action": "open_notebook", "path": "secret.ipynb"}, 404),
                ({"action": "reveal_cell", "path": "reports/a.ipynb"}, 400),
            ]
            for body, code in refused:
                status, answer = call(
                    server, "POST", "api/agent/focus/actions", body, token=tokens["reporter"]
                )
                assert status == code and answer["message"], (body, answer)
            assert call(server, "DELETE", f"api/agent/focus/tabs/{THIRD_TAB}")[0] == 204
            status, answer = call(
                server,
                "POST",
                "api/agent/focus/actions",
                {"action": "open_approval", "approval_id": 7},
                token=tokens["reporter"],
            )
            assert status == 200 and answer["delivered"] == "notification", answer
            got = []
            with anyio.move_on_after(2):
                while len(got) < 3:
                    message = await ws.read_message()
                    event = json.loads(message)
                    if event["schema_id"].endswith("/focus/v1"):
                        got.append(event)
            return got
        finally:
            ws.close()

    events = anyio.run(run)
    actions = [e for e in events if e["event"] == "action"]
    assert (
        actions[0]["tab"] == THIRD_TAB
        and actions[0]["action"] == "reveal_cell"
        and actions[0]["cell_id"] == "c1"
    )
    assert actions[0]["user"] == "agent:reporter" and actions[0]["message"] == "here"
    assert actions[1]["tab"] is None and actions[1]["approval_id"] == 7
    reads = [e for e in events if e["event"] == "read"]
    assert reads and reads[0]["user"] == "agent:reporter" and reads[0]["tab"] == THIRD_TAB
    assert "source" not in json.dumps(events) and "df.plot" not in json.dumps(events)


def _request(url: str, token: str) -> Any:
    from tornado.httpclient import HTTPRequest

    return HTTPRequest(url, headers={"Authorization": f"token {token}"})


# resources/subscribe is the 2025 era's (the SDK warns that 2026-07-28 has subscriptions/listen instead)
@pytest.mark.filterwarnings("ignore:resources/subscribe is removed")
def test_mcp_focus_resource_and_subscribe_follow_each_change(server: Server, tokens: dict[str, str]) -> None:
    import httpx
    import mcp_types as types
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    url = server.url + "api/agent/mcp"
    person = {"Authorization": f"token {server.token}"}

    async def run() -> None:
        updates: list[float] = []
        arrived = anyio.Event()

        async def handler(message: Any) -> None:
            if (
                isinstance(message, types.ResourceUpdatedNotification)
                and message.params.uri == "jupyter://focus"
            ):
                updates.append(time.monotonic())
                arrived.set()

        async with (
            httpx.AsyncClient(base_url=server.url, headers=person, timeout=30) as browser,
            create_mcp_http_client(headers={"Authorization": f"token {tokens['reporter']}"}) as http,
            streamable_http_client(url, http_client=http) as (read, write),
            ClientSession(read, write, message_handler=handler) as session,
        ):
            init = await session.initialize()
            assert init.capabilities.resources is not None and init.capabilities.resources.subscribe
            with pytest.raises(Exception, match="Share my focus"):
                await session.read_resource("jupyter://focus")  # off: says how the person shares it
            await session.subscribe_resource("jupyter://focus")
            await anyio.sleep(0.5)  # the session's GET stream is open

            async def published(tab: str, body: dict[str, Any]) -> float:
                response = await browser.put(f"api/agent/focus/tabs/{tab}", json=body)
                assert response.status_code == 200, response.text
                return time.monotonic()

            # the person turns sharing on: the agent is told (pushed by the change: nothing came before
            # it, see below for changes it must not hear of) and reads it; how soon is a benchmark's, not
            # a test's (a loaded machine), so the wait is generous
            for path in ("reports/a.ipynb", "reports/b.ipynb"):
                assert updates == []
                arrived = anyio.Event()
                before = time.monotonic()
                await published(TAB, focus_body(path))
                with anyio.fail_after(10):
                    await arrived.wait()
                assert len(updates) == 1 and updates[0] >= before, updates
                updates.clear()
                read = await session.read_resource("jupyter://focus")
                assert json.loads(read.contents[0].text)["path"] == path
            # a tab shared with another agent, one outside its paths, a heartbeat: no update for this agent
            updates.clear()
            await published(OTHER_TAB, focus_body("reports/c.ipynb", ["named"]))
            await published(THIRD_TAB, focus_body("secret.ipynb"))
            await published(TAB, focus_body("reports/b.ipynb"))
            await anyio.sleep(0.6)
            assert updates == []
            # the person stops sharing: updated at once, and the read is refused
            arrived = anyio.Event()
            for tab in (TAB, OTHER_TAB, THIRD_TAB):
                assert (await browser.delete(f"api/agent/focus/tabs/{tab}")).status_code == 204
            with anyio.fail_after(10):
                await arrived.wait()
            with pytest.raises(Exception, match="Share my focus"):
                await session.read_resource("jupyter://focus")
            # the agent's token is revoked: its subscription ends with it (no update of a new focus)
            status, answer = call(server, "DELETE", "api/agent/tokens/reporter")
            assert status == 200 and answer["status"] == "revoked", answer
            updates.clear()
            await published(TAB, focus_body("reports/a.ipynb"))
            await anyio.sleep(0.6)
            assert updates == []

    anyio.run(run)


def test_mcp_2026_listen_follows_the_focus(server: Server, tokens: dict[str, str]) -> None:
    """The 2026-07-28 era has no resources/subscribe: ``subscriptions/listen`` (the SDK's Client.listen)."""
    import httpx
    from mcp.client.client import Client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.client.subscriptions import ResourceUpdated
    from mcp.shared._httpx_utils import create_mcp_http_client

    for tab in (TAB, OTHER_TAB, THIRD_TAB):
        assert call(server, "DELETE", f"api/agent/focus/tabs/{tab}")[0] == 204

    async def run() -> None:
        async with (
            httpx.AsyncClient(
                base_url=server.url, headers={"Authorization": f"token {server.token}"}
            ) as browser,
            create_mcp_http_client(headers={"Authorization": f"token {tokens['helper']}"}) as http,
            Client(streamable_http_client(server.url + "api/agent/mcp", http_client=http)) as client,
            client.listen(resource_subscriptions=["jupyter://focus"]) as subscription,
        ):
            assert subscription.honored.resource_subscriptions == ["jupyter://focus"]
            response = await browser.put(f"api/agent/focus/tabs/{TAB}", json=focus_body("reports/a.ipynb"))
            assert response.status_code == 200, response.text
            with anyio.fail_after(10):  # pushed by the change (how soon: not a test's to assert)
                event = await subscription.__anext__()
            assert isinstance(event, ResourceUpdated) and event.uri == "jupyter://focus"
            read = await client.read_resource("jupyter://focus")
            assert json.loads(read.contents[0].text)["path"] == "reports/a.ipynb"
            assert (await browser.delete(f"api/agent/focus/tabs/{TAB}")).status_code == 204

    anyio.run(run)


THIS = "reports/this.ipynb"


def this_cell_body(cell: dict[str, Any] | None, path: str = THIS) -> dict[str, Any]:
    return {"agents": "all", "path": path, "cell": cell, "kernel": {"name": "python3", "status": "idle"}}


def test_this_cell_the_notebook_tools_act_on_the_focused_cell(server: Server) -> None:
    """``focus: true`` on notebook_read, notebook_output_read, notebook_run and notebook_edit (MCP over HTTP,
    the SDK's client): off, a 403 saying how to share; on, the focused cell of the focused notebook, its
    path going through the agent's paths (outside them: the same not-shared 403, never the cell) and the
    approval gate (a rule on that path denies it) as a path the agent gives."""
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    cells = [
        new_code_cell("a = 1", id="c0"),
        new_code_cell("print(6 * 7)", id="c1"),
        new_code_cell("b = 2", id="c2"),
    ]
    nbformat.write(new_notebook(cells=cells), str(server.root_dir / THIS))
    made = {}
    for name, scopes, paths in (
        ("cell-agent", ["edit", "execute"], None),
        ("cell-reporter", ["read"], ["reports/**"]),
        ("gated", ["edit", "execute"], None),
    ):
        body: dict[str, Any] = {"name": name, "scopes": scopes}
        if paths is not None:
            body["paths"] = paths
        status, answer = call(server, "POST", "api/agent/tokens", body)
        assert status == 201, answer
        made[name] = answer["token"]
    for tab in (TAB, OTHER_TAB, THIRD_TAB):
        call(server, "DELETE", f"api/agent/focus/tabs/{tab}")
    focused = {"id": "c1", "index": 1, "cell_type": "code", "source": "print(6 * 7)", "outputs": []}

    async def run() -> None:
        import httpx

        async with contextlib.AsyncExitStack() as stack:
            browser = await stack.enter_async_context(
                httpx.AsyncClient(
                    base_url=server.url, headers={"Authorization": f"token {server.token}"}, timeout=30
                )
            )
            sessions = {}
            for name, token in made.items():
                http = await stack.enter_async_context(
                    create_mcp_http_client(headers={"Authorization": f"token {token}"})
                )
                read, write, *_ = await stack.enter_async_context(
                    streamable_http_client(server.url + "api/agent/mcp", http_client=http)
                )
                session = await stack.enter_async_context(ClientSession(read, write))
                await session.initialize()
                sessions[name] = session

            async def tool(
                name: str, arguments: dict[str, Any], who: str = "cell-agent"
            ) -> tuple[bool, str, Any]:
                result = await sessions[who].call_tool(name, arguments)
                text = "\n".join(c.text for c in result.content if c.type == "text")
                return result.is_error, text, result.structured_content

            async def publish(body: dict[str, Any]) -> None:
                response = await browser.put(f"api/agent/focus/tabs/{TAB}", json=body)
                assert response.status_code == 200, response.text

            # off: every notebook tool with focus answers the 403 that says how the person shares it
            for name, arguments in (
                ("notebook_read", {"focus": True}),
                ("notebook_output_read", {"focus": True, "output": 0}),
                ("notebook_run", {"focus": True}),
                ("notebook_edit", {"focus": True, "action": "edit", "content": "x"}),
            ):
                error, text, _ = await tool(name, arguments)
                assert error and "Share my focus" in text, (name, text)
            error, text, _ = await tool("notebook_read", {})
            assert error and "'path' is required (or focus: true" in text, text

            # on: notebook_read reads that cell alone, and the panel is told the agent read the focus
            ws = await websocket_connect(
                _request(server.url.replace("http", "ws", 1) + "api/events/subscribe", server.token)
            )
            stack.callback(ws.close)
            await publish(this_cell_body(focused))
            error, text, read = await tool("notebook_read", {"focus": True})
            assert not error and read["path"] == THIS, text
            with anyio.fail_after(5):
                while True:
                    event = json.loads(await ws.read_message())
                    if event["schema_id"].endswith("/focus/v1") and event.get("event") == "read":
                        break
            assert event["user"] == "agent:cell-agent" and event["path"] == THIS, event
            assert (
                [c["id"] for c in read["cells"]] == ["c1"] and "print(6 * 7)" in text and "b = 2" not in text
            )
            # another path than the focused notebook: 400 naming it
            error, text, _ = await tool("notebook_read", {"focus": True, "path": "reports/a.ipynb"})
            assert error and THIS in text and "leave 'path' out" in text, text
            error, text, _ = await tool("notebook_read", {"focus": True, "path": "./" + THIS})  # the same one
            assert not error, text

            # notebook_run runs that cell alone and writes its output into the notebook
            error, text, ran = await tool("notebook_run", {"focus": True})
            assert not error and "42" in text, text
            assert [(c["cell_id"], c["status"]) for c in ran["cells"]] == [("c1", "complete")], ran
            on_disk = nbformat.read(str(server.root_dir / THIS), as_version=4)
            assert on_disk.cells[1].outputs[0]["text"] == "42\n" and on_disk.cells[0].outputs == []
            error, text, _ = await tool("notebook_output_read", {"focus": True, "output": 0})
            assert not error and "42" in text, text
            # detached: the cell focused when the call came is the one that runs, though the focus moves on
            error, text, started = await tool("notebook_run", {"focus": True, "detach": True})
            assert not error and started["run_id"], text
            await publish(this_cell_body({**focused, "id": "c2", "index": 2, "source": "b = 2"}))
            error, text, status = await tool("run_status", {"run_id": started["run_id"], "wait": 60})
            assert not error and status["state"] == "complete", text
            assert [(c["cell_id"], c["status"]) for c in status["cells"]] == [("c1", "complete")], status
            await publish(this_cell_body(focused))

            # notebook_edit: one operation without a cell acts on it (insert: after it)
            error, text, _ = await tool(
                "notebook_edit", {"focus": True, "action": "replace", "old": "6", "new": "7"}
            )
            assert not error, text
            error, text, _ = await tool(
                "notebook_edit", {"focus": True, "action": "insert", "content": "c = 3"}
            )
            assert not error, text
            on_disk = nbformat.read(str(server.root_dir / THIS), as_version=4)
            assert [c.source for c in on_disk.cells] == ["a = 1", "print(7 * 7)", "c = 3", "b = 2"]
            error, text, _ = await tool("notebook_edit", {"focus": True, "action": "create"})
            assert error and "'create'" in text, text

            # the gate sees the focused notebook's path: a rule denying "gated" execute on it refuses
            error, text, _ = await tool("notebook_run", {"focus": True}, who="gated")
            assert error and f"denies agent:gated the 'execute' action on {THIS}" in text, text

            # no active cell: 409 saying so; the focus on a notebook outside the agent's paths: not shared
            await publish(this_cell_body(None))
            error, text, _ = await tool("notebook_read", {"focus": True})
            assert error and "no active cell" in text, text
            await publish(
                this_cell_body({**focused, "source": "x = 1", "id": "c1", "index": 0}, "secret.ipynb")
            )
            for arguments in ({"focus": True}, {"focus": True, "path": "secret.ipynb"}):
                error, text, _ = await tool("notebook_read", arguments, who="cell-reporter")
                assert error and "Share my focus" in text and "x = 1" not in text, text
                assert "secret" not in text, text
            error, text, read = await tool(
                "notebook_read", {"focus": True}
            )  # (an agent of all paths reads it)
            assert not error and read["path"] == "secret.ipynb", text
            assert (await browser.delete(f"api/agent/focus/tabs/{TAB}")).status_code == 204

    anyio.run(run)

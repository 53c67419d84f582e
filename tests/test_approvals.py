"""The approval gate on a real server with real kernels: the person decides over REST while the agent waits.

Agents are real agent tokens (the two documented server lines); the person is the server's own token.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import nbformat
import pytest
from mcp import ClientSession, types
from mcp.client.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError as McpError
from nbformat.v4 import new_code_cell, new_notebook
from tornado.httpclient import HTTPClientError

from jupyter_agent_tools.auth import AgentAuthorizer, AgentIdentityProvider

pytestmark = pytest.mark.timeout(300)

ASK_EXECUTE = [{"who": "agent:*", "actions": ["execute"], "decision": "ask"}]


def config(rules: list[dict[str, Any]], **policy: Any) -> dict[str, Any]:
    return {
        "ServerApp": {
            "jpserver_extensions": {"jupyter_agent_tools": True},
            "identity_provider_class": AgentIdentityProvider,
            "authorizer_class": AgentAuthorizer,
        },
        "KernelPool": {"size": 0},
        "ApprovalPolicy": {"rules": rules, **policy},
    }


@pytest.fixture
def jp_server_config(request: pytest.FixtureRequest) -> dict[str, Any]:
    marker = request.node.get_closest_marker("rules")
    rules = marker.args[0] if marker else ASK_EXECUTE
    return config(rules, **(marker.kwargs if marker else {}))


@pytest.fixture
def http(http_server_client: Any, jp_base_url: str, jp_serverapp: Any) -> Any:
    """``http(method, url, body=None, token=<the server's: the person>)`` -> (status, JSON, headers)."""

    async def call(method: str, url: str, body: Any = None, token: str | None = None) -> tuple[int, Any, Any]:
        response = await http_server_client.fetch(
            jp_base_url + url,
            method=method,
            body=json.dumps(body if body is not None else {}) if method in ("POST", "PUT") else None,
            headers={"Authorization": f"token {token or jp_serverapp.identity_provider.token}"},
            raise_error=False,
            request_timeout=120,
        )
        text = response.body.decode() if response.body else ""
        return response.code, json.loads(text) if text else None, response.headers

    return call


@pytest.fixture
def agent(http: Any) -> Any:
    """A new agent token (scopes read, edit, execute) and a call made with it."""

    async def make(name: str = "bot", scopes: tuple[str, ...] = ("read", "edit", "execute")) -> Any:
        status, answer, _ = await http("POST", "api/agent/tokens", {"name": name, "scopes": list(scopes)})
        assert status == 201, answer
        token = answer["token"]

        async def as_agent(method: str, url: str, body: Any = None) -> tuple[int, Any, Any]:
            return await http(method, url, body, token=token)

        as_agent.token = token  # type: ignore[attr-defined]
        return as_agent

    return make


def notebook(root: Path, name: str = "nb.ipynb") -> Path:
    path = root / name
    cells = [new_code_cell("x = 6", id="c1"), new_code_cell("print(x * 7)", id="c2")]
    nbformat.write(new_notebook(cells=cells), str(path))
    return path


async def pending_approval(http: Any, wait: float = 30) -> dict[str, Any]:
    """The first pending approval, once there is one (the person's list)."""
    for _ in range(int(wait * 20)):
        status, listing, _ = await http("GET", "api/agent/approvals")
        assert status == 200, listing
        if listing["pending"]:
            return dict(listing["pending"][0])
        await asyncio.sleep(0.05)
    raise AssertionError("no approval request appeared")


EVAL = {"cells": [{"code": "print('approved ran')"}], "session": "s"}


def approval_events(serverapp: Any) -> list[dict[str, Any]]:
    """The approval/v1 events the server tells from now on, as the Agents panel hears them."""
    told: list[dict[str, Any]] = []

    async def listen(logger: Any, schema_id: str, data: Any) -> None:
        told.append(dict(data))

    schema = "https://events.jupyter.org/jupyter_agent_tools/approval/v1"
    serverapp.event_logger.add_listener(schema_id=schema, listener=listen)
    return told


async def heard(told: list[dict[str, Any]], count: int) -> None:
    """Until ``count`` events were told (listeners run as tasks), at most 2 s."""
    for _ in range(100):
        if len(told) >= count:
            return
        await asyncio.sleep(0.02)


@pytest.mark.rules([])
async def test_without_rules_nothing_is_asked(http: Any, agent: Any) -> None:
    bot = await agent()
    status, answer, _ = await bot("POST", "api/agent/eval", EVAL)
    assert status == 200 and "approved ran" in answer["cells"][0]["output"]
    listing = (await http("GET", "api/agent/approvals"))[1]
    assert listing == {"pending": [], "recent": []}


async def test_the_eval_waits_and_runs_once_the_person_approves(http: Any, agent: Any) -> None:
    bot = await agent()
    call = asyncio.ensure_future(bot("POST", "api/agent/eval", EVAL))
    request = await pending_approval(http)
    assert request["agent"] == "agent:bot" and request["action"] == "execute" and request["door"] == "http"
    assert request["details"]["cells"][0]["code"] == "print('approved ran')"
    assert not call.done()  # nothing ran meanwhile
    status, decided, _ = await http("POST", f"api/agent/approvals/{request['id']}", {"decision": "approve"})
    assert status == 200 and decided["state"] == "approved" and decided["decided_by"] == "the server's owner"
    status, answer, _ = await call
    assert status == 200 and "approved ran" in answer["cells"][0]["output"]


async def test_the_event_bus_tells_requests_and_decisions(http: Any, agent: Any, jp_serverapp: Any) -> None:
    """The Agents panel learns of requests from the approval/v1 events (before: every one was refused by
    the schema, which names the agent 'user', and never reached the bus)."""
    told = approval_events(jp_serverapp)
    bot = await agent()
    call = asyncio.ensure_future(bot("POST", "api/agent/eval", EVAL))
    request = await pending_approval(http)
    assert (await http("POST", f"api/agent/approvals/{request['id']}", {"decision": "approve"}))[0] == 200
    assert (await call)[0] == 200
    await heard(told, 2)
    assert [(e["event"], e["approval_id"], e["user"]) for e in told] == [
        ("requested", request["id"], "agent:bot"),
        ("approved", request["id"], "agent:bot"),
    ], told
    assert told[0]["summary"] == "run 1 cell in session 's'" and told[0]["action"] == "execute"


async def test_a_denial_is_a_403_with_the_persons_reason(http: Any, agent: Any) -> None:
    bot = await agent()
    call = asyncio.ensure_future(bot("POST", "api/agent/eval", EVAL))
    request = await pending_approval(http)
    body = {"decision": "deny", "reason": "not on prod data"}
    assert (await http("POST", f"api/agent/approvals/{request['id']}", body))[0] == 200
    status, answer, _ = await call
    assert status == 403, answer
    assert answer["reason"] == "approval_denied" and answer["approval_id"] == request["id"]
    assert "not on prod data" in answer["message"]


async def test_an_agent_cannot_approve_and_deciding_twice_is_a_409(http: Any, agent: Any) -> None:
    bot = await agent()
    call = asyncio.ensure_future(bot("POST", "api/agent/eval", EVAL))
    request = await pending_approval(http)
    url = f"api/agent/approvals/{request['id']}"
    status, refused, _ = await bot("POST", url, {"decision": "approve"})
    assert status == 403, refused
    assert (await bot("GET", url))[0] == 200  # its own request: it may look
    assert (await http("POST", url, {"decision": "maybe"}))[0] == 400
    assert (await http("POST", "api/agent/approvals/9999", {"decision": "approve"}))[0] == 404
    assert (await http("POST", "api/agent/approvals/x", {"decision": "approve"}))[0] == 400
    assert (await http("POST", url, {"decision": "deny"}))[0] == 200
    status, again, _ = await http("POST", url, {"decision": "approve"})
    assert status == 409 and "already denied" in again["message"]
    assert (await call)[0] == 403


async def test_still_undecided_it_answers_202_and_runs_detached_once_approved(http: Any, agent: Any) -> None:
    bot = await agent()
    status, started, _ = await bot("POST", "api/agent/eval", {**EVAL, "approval_wait": 0.2})
    assert status == 202, started
    assert started["state"] == "awaiting_approval"
    approval_id = started["approval_id"]
    run_url = f"api/agent/runs/{started['run_id']}"
    for _ in range(100):
        run = (await bot("GET", run_url))[1]
        if run["state"] == "awaiting_approval":
            break
        await asyncio.sleep(0.05)
    assert run["state"] == "awaiting_approval" and run["approval_id"] == approval_id
    assert (await http("POST", f"api/agent/approvals/{approval_id}", {"decision": "approve"}))[0] == 200
    status, done, _ = await bot("GET", run_url + "?wait=60")
    assert status == 200 and done["state"] == "complete", done
    assert "approved ran" in done["result"]["cells"][0]["output"]


async def test_cancelling_a_run_awaiting_approval_withdraws_its_request(
    http: Any, agent: Any, jp_serverapp: Any
) -> None:
    told = approval_events(jp_serverapp)
    bot = await agent()
    status, started, _ = await bot("POST", "api/agent/eval", {**EVAL, "approval_wait": 0})
    assert status == 202, started
    approval_id, run_url = started["approval_id"], f"api/agent/runs/{started['run_id']}"
    assert (await http("GET", f"api/agent/approvals/{approval_id}"))[1]["state"] == "pending"
    assert (await bot("POST", run_url + "/cancel"))[0] == 200
    status, run, _ = await bot("GET", run_url + "?wait=60")
    assert status == 200 and run["state"] == "error" and run["cells_started"] == 0, run
    assert run["message"].endswith("nothing ran (the request is withdrawn)."), run
    status, request, _ = await http("GET", f"api/agent/approvals/{approval_id}")
    assert status == 200 and request["state"] == "withdrawn", request
    assert request["reason"] == "the run was cancelled while it waited for the person"
    listing = (await http("GET", "api/agent/approvals"))[1]
    assert listing["pending"] == [] and [r["state"] for r in listing["recent"]] == ["withdrawn"]
    status, refused, _ = await http("POST", f"api/agent/approvals/{approval_id}", {"decision": "approve"})
    assert status == 409 and f"Approval {approval_id} is already withdrawn" in refused["message"], refused
    await heard(told, 2)
    assert [(e["event"], e["approval_id"]) for e in told] == [
        ("requested", approval_id),
        ("withdrawn", approval_id),
    ], told


async def test_an_approved_run_refuses_cells_the_person_changed_since(
    http: Any, agent: Any, jp_root_dir: Path
) -> None:
    path = notebook(jp_root_dir)
    bot = await agent()
    call = asyncio.ensure_future(bot("POST", "api/agent/notebooks/nb.ipynb/run", {"all": True}))
    request = await pending_approval(http)
    assert [c["id"] for c in request["details"]["cells"]] == ["c1", "c2"]
    assert request["details"]["cells"][1]["source"] == "print(x * 7)"
    nb = nbformat.read(str(path), as_version=4)
    nb.cells[1].source = "print('not what was approved')"
    nbformat.write(nb, str(path))
    before = path.read_bytes()
    assert (await http("POST", f"api/agent/approvals/{request['id']}", {"decision": "approve"}))[0] == 200
    status, answer, _ = await call
    assert status == 409, answer
    assert answer["cells"] == ["c2"] and "c2" in answer["message"]
    assert path.read_bytes() == before  # nothing ran, nothing was written


@pytest.mark.rules([{"who": "agent:*", "actions": ["edit"], "decision": "ask"}])
async def test_an_edit_shows_its_diff_and_is_applied_once_approved(
    http: Any, agent: Any, jp_root_dir: Path
) -> None:
    path = notebook(jp_root_dir)
    bot = await agent()
    edit = {"action": "edit", "cell_id": "c2", "content": "print(x * 100)", "approval_wait": 0}
    status, pending, headers = await bot("POST", "api/agent/notebooks/nb.ipynb", edit)
    assert status == 202, pending
    assert headers["Location"].endswith(f"/api/agent/approvals/{pending['approval_id']}")
    status, shown, _ = await bot("GET", f"api/agent/approvals/{pending['approval_id']}")
    diff = shown["details"]["cells"][0]["diff"]
    assert "-print(x * 7)" in diff and "+print(x * 100)" in diff
    assert "x * 100" not in path.read_text()  # not before the person approves
    assert (await http("POST", f"api/agent/approvals/{pending['approval_id']}", {"decision": "approve"}))[
        0
    ] == 200
    for _ in range(100):
        shown = (await bot("GET", f"api/agent/approvals/{pending['approval_id']}"))[1]
        if shown["outcome"]:
            break
        await asyncio.sleep(0.05)
    assert shown["outcome"]["status"] == 200, shown
    assert nbformat.read(str(path), as_version=4).cells[1].source == "print(x * 100)"
    changes = (await http("GET", "api/agent/notebooks/nb.ipynb/changes"))[1]["changes"]
    assert changes[0]["user"] == "agent:bot" and changes[0]["approved_by"] == shown["decided_by"]


@pytest.mark.rules([{"who": "agent:*", "actions": ["execute"], "paths": ["secret/**"], "decision": "deny"}])
async def test_a_deny_rule_refuses_at_once_and_other_paths_pass(
    http: Any, agent: Any, jp_root_dir: Path
) -> None:
    (jp_root_dir / "secret").mkdir()
    notebook(jp_root_dir / "secret")
    notebook(jp_root_dir)
    bot = await agent()
    status, answer, _ = await bot("POST", "api/agent/notebooks/secret/nb.ipynb/run", {"all": True})
    assert status == 403 and answer["reason"] == "approval_denied", answer
    status, answer, _ = await bot("POST", "api/agent/notebooks/nb.ipynb/run", {"all": True})
    assert status == 200 and answer["cells"][1]["output"].strip() == "42", answer


@pytest.mark.rules(ASK_EXECUTE, max_pending_per_agent=1, timeout=0.5)
async def test_too_many_pending_is_429_and_an_undecided_request_expires(http: Any, agent: Any) -> None:
    bot = await agent()
    status, first, _ = await bot("POST", "api/agent/eval", {**EVAL, "approval_wait": 0})
    assert status == 202, first
    status, answer, _ = await bot("POST", "api/agent/eval", {**EVAL, "approval_wait": 0})
    assert status == 429, answer
    status, done, _ = await bot("GET", f"api/agent/runs/{first['run_id']}?wait=30")
    assert done["state"] == "error" and "in time" in done["message"], done
    status, shown, _ = await http("GET", f"api/agent/approvals/{first['approval_id']}")
    assert shown["state"] == "expired"


@pytest.mark.rules([{"who": "agent:gated", "actions": ["execute"], "decision": "ask"}])
async def test_a_gated_agent_finds_no_door_around_the_gate(http: Any, agent: Any, jp_ws_fetch: Any) -> None:
    gated, free = await agent("gated"), await agent("free")
    status, kernel, _ = await http("POST", "api/kernels", {})  # the person's kernel
    assert status == 201, kernel
    for method, url, body in [
        ("POST", "api/kernels", {}),
        ("POST", f"api/kernels/{kernel['id']}/interrupt", {}),
        ("POST", "api/sessions", {"path": "x.ipynb", "type": "notebook", "kernel": {"name": "python3"}}),
    ]:
        status, answer, _ = await gated(method, url, body)
        assert status == 403, (url, answer)
        assert "use the agent routes" in answer["message"], answer
    assert (await gated("GET", "api/kernels"))[0] == 200  # reading stays open
    with pytest.raises(HTTPClientError) as refused:  # its websocket to the kernel is refused too
        await jp_ws_fetch(
            "api", "kernels", kernel["id"], "channels", headers={"Authorization": f"token {gated.token}"}
        )
    assert refused.value.code == 403
    status, answer, _ = await free("POST", "api/kernels", {})
    assert status == 201, answer  # an agent the rules do not gate keeps its doors


# ------------------------------------------------------------------------------------------------- MCP


@contextlib.asynccontextmanager
async def legacy_mcp(url: str, token: str) -> AsyncIterator[ClientSession]:
    """The official SDK's ClientSession (initialize handshake, protocol 2025-11-25)."""
    async with (
        create_mcp_http_client(headers={"Authorization": f"token {token}"}) as http_client,
        streamable_http_client(url, http_client=http_client) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


@contextlib.asynccontextmanager
async def modern_mcp(url: str, token: str) -> AsyncIterator[Client]:
    """The official SDK's Client in its default mode (protocol 2026-07-28)."""
    async with (
        create_mcp_http_client(headers={"Authorization": f"token {token}"}) as http_client,
        Client(streamable_http_client(url, http_client=http_client)) as client,
    ):
        yield client


@pytest.fixture
def mcp_url(jp_serverapp: Any, http_server_client: Any, jp_http_port: int, jp_base_url: str) -> str:
    return f"http://127.0.0.1:{jp_http_port}{jp_base_url}api/agent/mcp"


@pytest.mark.parametrize("era", ["legacy", "modern"])
async def test_an_mcp_call_waits_for_the_person_in_both_protocol_eras(
    http: Any, agent: Any, mcp_url: str, era: str
) -> None:
    bot = await agent(f"mcp-{era}")
    connect = legacy_mcp if era == "legacy" else modern_mcp
    async with connect(mcp_url, bot.token) as session:
        call = asyncio.ensure_future(
            session.call_tool("eval", {"cells": [{"code": "print(6 * 7)"}], "session": era})
        )
        request = await pending_approval(http)
        assert request["door"] == "mcp" and request["agent"] == f"agent:mcp-{era}"
        assert (await http("POST", f"api/agent/approvals/{request['id']}", {"decision": "approve"}))[0] == 200
        result = await call
        assert not result.is_error and "42" in result.content[0].text
        call = asyncio.ensure_future(session.call_tool("eval", {"cells": [{"code": "print('no')"}]}))
        request = await pending_approval(http)
        body = {"decision": "deny", "reason": "enough"}
        assert (await http("POST", f"api/agent/approvals/{request['id']}", body))[0] == 200
        denied = await call
        assert denied.is_error and "enough" in denied.content[0].text


@pytest.mark.rules(ASK_EXECUTE, wait=0.3)
async def test_an_mcp_call_still_pending_goes_on_as_a_run_once_approved(
    http: Any, agent: Any, mcp_url: str
) -> None:
    bot = await agent()
    async with legacy_mcp(mcp_url, bot.token) as session:
        result = await session.call_tool("eval", {"cells": [{"code": "print('later')"}]})
        assert not result.is_error and "waits for the person" in result.content[0].text
        run = result.structured_content
        assert run["state"] in ("queued", "awaiting_approval") and run["approval_id"]
        assert (await http("POST", f"api/agent/approvals/{run['approval_id']}", {"decision": "approve"}))[
            0
        ] == 200
        status = await session.call_tool("run_status", {"run_id": run["run_id"], "wait": 60})
        assert "complete" in status.content[0].text and "later" in status.content[0].text


@contextlib.asynccontextmanager
async def modern_mcp_opening_urls(
    url: str, token: str, answer: Any, rounds: int = 10
) -> AsyncIterator[Client]:
    """The SDK's default Client with an elicitation callback (it declares URL-mode elicitation)."""
    async with (
        create_mcp_http_client(headers={"Authorization": f"token {token}"}) as http_client,
        Client(
            streamable_http_client(url, http_client=http_client),
            elicitation_callback=answer,
            input_required_max_rounds=rounds,
        ) as client,
    ):
        yield client


@pytest.mark.rules(ASK_EXECUTE, wait=0.2)
async def test_a_2026_client_still_waiting_opens_jupyterlab_at_the_request_and_goes_on_when_approved(
    http: Any, agent: Any, mcp_url: str, jp_root_dir: Path
) -> None:
    bot = await agent()
    asked: list[Any] = []

    async def open_in_browser(_context: Any, params: Any) -> Any:
        asked.append(params)  # (a person would open the URL; here the test decides as that person)
        assert (await http("POST", f"api/agent/approvals/{approval_id(params)}", {"decision": "approve"}))[
            0
        ] == 200
        return types.ElicitResult(action="accept")

    code = "with open('ran.txt', 'a') as f: f.write('x')"
    async with modern_mcp_opening_urls(mcp_url, bot.token, open_in_browser) as client:
        result = await client.call_tool("eval", {"cells": [{"code": code}, {"code": "print('went on')"}]})
    assert not result.is_error and "went on" in result.content[0].text, result
    assert (jp_root_dir / "ran.txt").read_text() == "x"  # once
    [params] = asked
    assert params.mode == "url" and "run" in params.message
    request = (await http("GET", f"api/agent/approvals/{approval_id(params)}"))[1]
    assert params.url.startswith(mcp_url.split("/api/agent/")[0] + "/lab?agent-approval=")
    assert request["state"] == "approved" and request["agent"] == "agent:bot"


def approval_id(params: Any) -> int:
    return int(params.url.rsplit("agent-approval=", 1)[1])


@pytest.mark.rules(ASK_EXECUTE, wait=0.1)
async def test_what_a_2026_client_answers_never_approves_and_its_state_is_checked(
    http: Any, agent: Any, mcp_url: str, jp_root_dir: Path
) -> None:
    from mcp.client._input_required import InputRequiredRoundsExceededError

    bot, other = await agent("bot"), await agent("other")

    async def accept_as_form(_context: Any, _params: Any) -> Any:  # an agent's client saying yes itself
        return types.ElicitResult(action="accept", content={"approve": True, "decision": "approve"})

    arguments = {"cells": [{"code": "open('forged.txt', 'w').write('ran')"}]}
    async with modern_mcp_opening_urls(mcp_url, bot.token, accept_as_form, rounds=3) as client:
        with pytest.raises(InputRequiredRoundsExceededError):
            await client.call_tool("eval", arguments)
        # Driven by hand: a forged or replayed state, another caller's state, a declined page.
        first = await client.session.call_tool("eval", arguments, allow_input_required=True)
        assert isinstance(first, types.InputRequiredResult) and first.input_requests, first
        state = first.request_state
        assert state
        forged = state[:-4] + ("AAAA" if not state.endswith("AAAA") else "BBBB")
        with pytest.raises(McpError, match="requestState"):
            await client.session.call_tool("eval", arguments, request_state=forged, allow_input_required=True)
        with pytest.raises(McpError, match="another call"):
            await client.session.call_tool(
                "eval", {"cells": [{"code": "print(1)"}]}, request_state=state, allow_input_required=True
            )
        again = await client.session.call_tool(
            "eval", arguments, request_state=state, allow_input_required=True
        )
        assert isinstance(again, types.InputRequiredResult) and not again.input_requests  # the state alone
        declined = await client.session.call_tool(
            "eval",
            arguments,
            input_responses={"approval": types.ElicitResult(action="decline")},
            request_state=state,
            allow_input_required=True,
        )
        assert isinstance(declined, types.CallToolResult) and declined.is_error
        assert "did not open approval" in declined.content[0].text
        # The declined request is withdrawn: gone from the person's list, never decided, its state refused.
        withdrawn = (await http("GET", f"api/agent/approvals/{approval_of(state)}"))[1]
        assert withdrawn["state"] == "withdrawn" and "(decline)" in withdrawn["reason"], withdrawn
        refused = await http("POST", f"api/agent/approvals/{approval_of(state)}", {"decision": "approve"})
        assert refused[0] == 409 and "already withdrawn" in refused[1]["message"], refused
        retried = await client.session.call_tool(
            "eval", arguments, request_state=state, allow_input_required=True
        )
        assert isinstance(retried, types.CallToolResult) and retried.is_error
        assert "was withdrawn" in retried.content[0].text
        asked_anew = await client.session.call_tool("eval", arguments, allow_input_required=True)
        assert isinstance(asked_anew, types.InputRequiredResult), asked_anew
        anew = asked_anew.request_state
        assert anew and approval_of(anew) != approval_of(state)
    async with modern_mcp_opening_urls(mcp_url, other.token, accept_as_form) as client:
        with pytest.raises(McpError, match="another caller"):
            await client.session.call_tool("eval", arguments, request_state=anew, allow_input_required=True)
    assert not (jp_root_dir / "forged.txt").exists()
    pending = (await http("GET", "api/agent/approvals"))[1]["pending"]
    assert len(pending) == 2 and all(p["agent"] == "agent:bot" for p in pending)
    assert approval_of(state) not in [p["id"] for p in pending]
    # Approved by the person, the state runs the call once; sent again, it is refused.
    approved = next(p for p in pending if p["id"] == approval_of(anew))
    assert (await http("POST", f"api/agent/approvals/{approved['id']}", {"decision": "approve"}))[0] == 200
    async with modern_mcp_opening_urls(mcp_url, bot.token, accept_as_form) as client:
        done = await client.session.call_tool(
            "eval", arguments, request_state=anew, allow_input_required=True
        )
        assert isinstance(done, types.CallToolResult) and not done.is_error, done
        replayed = await client.session.call_tool(
            "eval", arguments, request_state=anew, allow_input_required=True
        )
        assert isinstance(replayed, types.CallToolResult) and replayed.is_error
        assert "used by an earlier call" in replayed.content[0].text
    assert (jp_root_dir / "forged.txt").read_text() == "ran"


def approval_of(state: str) -> int:
    import base64

    payload = state.split(".")[1]
    return int(json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))["approval"])


@pytest.mark.rules([])
async def test_a_token_created_with_ask_asks_without_any_rule(http: Any) -> None:
    status, made, _ = await http(
        "POST", "api/agent/tokens", {"name": "careful", "scopes": ["execute", "read"], "ask": ["execute"]}
    )
    assert status == 201 and made["ask"] == ["execute"], made
    status, refused, _ = await http(
        "POST", "api/agent/tokens", {"name": "x", "scopes": ["read"], "ask": ["write"]}
    )
    assert status == 400 and "ask" in refused["message"], refused
    listed = (await http("GET", "api/agent/tokens"))[1]["tokens"]
    assert [t["ask"] for t in listed if t["name"] == "careful"] == [["execute"]]
    status, pending, _ = await http(
        "POST", "api/agent/eval", {**EVAL, "approval_wait": 0}, token=made["token"]
    )
    assert status == 202 and pending["approval_id"], pending
    status, other, _ = await http(  # reading is not asked for
        "GET", f"api/agent/approvals/{pending['approval_id']}", token=made["token"]
    )
    assert status == 200 and other["agent"] == "agent:careful"


async def test_an_mcp_task_waits_as_input_required_until_the_person_approves(
    http: Any, agent: Any, mcp_url: str
) -> None:
    from mcp import types
    from test_mcp_runs import call_as_task

    bot = await agent()
    headers = {"Authorization": f"token {bot.token}"}
    created = await call_as_task(mcp_url, headers, "eval", {"cells": [{"code": "print('as a task')"}]})
    task_id = types.CreateTaskResult.model_validate(created["result"]).task.task_id
    request = await pending_approval(http)
    async with legacy_mcp(mcp_url, bot.token) as session:
        got = await session.send_request(
            types.GetTaskRequest(params=types.GetTaskRequestParams(task_id=task_id)), types.GetTaskResult
        )
        assert got.status == "input_required", got
        assert (await http("POST", f"api/agent/approvals/{request['id']}", {"decision": "approve"}))[0] == 200
        result = await session.send_request(
            types.GetTaskPayloadRequest(params=types.GetTaskPayloadRequestParams(task_id=task_id)),
            types.CallToolResult,
        )
        assert not result.is_error and "as a task" in result.content[0].text


@pytest.mark.rules([{"who": "agent:*", "actions": ["edit"], "decision": "ask"}])
async def test_an_approved_edit_checks_the_cells_not_the_metadata(
    http: Any, agent: Any, jp_root_dir: Path
) -> None:
    path = notebook(jp_root_dir)
    bot = await agent()

    async def approved_outcome(edit: dict[str, Any], meanwhile: Any) -> dict[str, Any]:
        status, pending, _ = await bot("POST", "api/agent/notebooks/nb.ipynb", {**edit, "approval_wait": 0})
        assert status == 202, pending
        meanwhile()
        url = f"api/agent/approvals/{pending['approval_id']}"
        assert (await http("POST", url, {"decision": "approve"}))[0] == 200
        for _ in range(200):
            shown = (await bot("GET", url))[1]
            if shown["outcome"]:
                return dict(shown["outcome"])
            await asyncio.sleep(0.05)
        raise AssertionError("no outcome")

    def language_info() -> None:  # what JupyterLab writes when the notebook opens: not the cells
        nb = nbformat.read(str(path), as_version=4)
        nb.metadata["language_info"] = {"name": "python"}
        nbformat.write(nb, str(path))

    outcome = await approved_outcome({"action": "edit", "cell_id": "c1", "content": "x = 7"}, language_info)
    assert outcome["status"] == 200, outcome
    assert nbformat.read(str(path), as_version=4).cells[0].source == "x = 7"

    def person_edits_c2() -> None:
        nb = nbformat.read(str(path), as_version=4)
        nb.cells[1].source = "print('mine')"
        nbformat.write(nb, str(path))

    outcome = await approved_outcome(
        {"action": "edit", "cell_id": "c2", "content": "print(0)"}, person_edits_c2
    )
    assert outcome["status"] == 409 and outcome["cells"] == ["c2"], outcome
    assert nbformat.read(str(path), as_version=4).cells[1].source == "print('mine')"


async def test_a_read_only_path_limited_or_revoked_token_sees_no_other_agents_request(
    http: Any, agent: Any
) -> None:
    bot = await agent()
    call = asyncio.ensure_future(bot("POST", "api/agent/eval", EVAL))
    request = await pending_approval(http)
    body = {"name": "reader", "scopes": ["read"], "paths": ["reports/**"]}
    status, made, _ = await http("POST", "api/agent/tokens", body)
    assert status == 201, made
    reader = made["token"]
    listing = (await http("GET", "api/agent/approvals", token=reader))[1]
    assert listing == {"pending": [], "recent": []}  # another agent's request appears nowhere
    status, answer, _ = await http("GET", f"api/agent/approvals/{request['id']}", token=reader)
    assert status == 404 and "print(" not in json.dumps(answer), answer
    status, answer, _ = await http(
        "POST", f"api/agent/approvals/{request['id']}", {"decision": "approve"}, reader
    )
    assert status == 403, answer
    assert (await http("DELETE", "api/agent/tokens/reader"))[0] == 200
    for method, url, sent in [
        ("GET", "api/agent/approvals", None),
        ("POST", f"api/agent/approvals/{request['id']}", {"decision": "approve"}),
    ]:
        status, answer, _ = await http(method, url, sent, token=reader)
        assert status == 403 and "revoked" in answer["message"], answer
    assert (await http("GET", f"api/agent/approvals/{request['id']}"))[1]["state"] == "pending"
    assert (await http("POST", f"api/agent/approvals/{request['id']}", {"decision": "deny"}))[0] == 200
    assert (await call)[0] == 403

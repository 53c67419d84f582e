"""MCP calls under the approval gate, through the official SDK clients of both protocol eras: every gated
tool takes ``approval_wait`` (the gate's, never the tool's), and a call still pending after it answers in
the tool's own output schema, says how to wait, and its outcome can be learnt (``run_status``)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import nbformat
import pytest
import test_approvals
from jsonschema import Draft202012Validator
from test_approvals import config, legacy_mcp, modern_mcp, notebook, pending_approval

from jupyter_agent_tools.mcp.tools import TOOLS

pytestmark = pytest.mark.timeout(300)
agent, http, mcp_url = test_approvals.agent, test_approvals.http, test_approvals.mcp_url  # (fixtures)

GATED = ("eval", "notebook_edit", "notebook_run", "notebook_undo", "notebook_kernel", "session_delete")
ASK_ALL = [{"who": "agent:*", "actions": ["edit", "execute", "kernel"], "decision": "ask"}]
EDIT = {"path": "nb.ipynb", "action": "edit", "cell_id": "c2", "content": "print(x * 100)"}


@pytest.fixture
def jp_server_config(request: pytest.FixtureRequest) -> dict[str, Any]:
    marker = request.node.get_closest_marker("rules")
    return config(marker.args[0] if marker else ASK_ALL, **(marker.kwargs if marker else {}))


@pytest.mark.quick
def test_approval_wait_is_an_argument_of_every_gated_tool_and_of_no_other() -> None:
    by_name = {tool.name: tool for tool in TOOLS}
    for name, tool in by_name.items():
        declared = tool.input_schema["properties"].get("approval_wait")
        if name in GATED:
            assert declared is not None and declared["type"] == "number" and declared["minimum"] == 0, name
        else:
            assert declared is None, name


async def approve_when_asked(http: Any, decision: str = "approve") -> dict[str, Any]:
    request = await pending_approval(http)
    body = {"decision": decision, "reason": "not now"} if decision == "deny" else {"decision": decision}
    assert (await http("POST", f"api/agent/approvals/{request['id']}", body))[0] == 200
    return request


@pytest.mark.parametrize("era", ["legacy", "modern"])
async def test_approval_wait_is_taken_by_the_gate_and_the_call_runs_once_approved(
    http: Any, agent: Any, mcp_url: str, jp_root_dir: Path, era: str
) -> None:
    path = notebook(jp_root_dir)
    bot = await agent(f"wait-{era}")
    connect = legacy_mcp if era == "legacy" else modern_mcp
    code = "with open('ran.txt', 'a') as f: f.write('x')\nprint('ran')"
    async with connect(mcp_url, bot.token) as session:
        for name, arguments in (
            ("eval", {"cells": [{"code": code}], "session": era, "approval_wait": 60}),
            ("notebook_edit", {**EDIT, "approval_wait": 60}),
        ):
            call = asyncio.ensure_future(session.call_tool(name, arguments))
            request = await approve_when_asked(http)
            assert request["door"] == "mcp", request
            result = await call
            assert not result.is_error, (name, result.content[0].text)
    assert (jp_root_dir / "ran.txt").read_text() == "x"  # the approval was spent once, on the code shown
    assert nbformat.read(str(path), as_version=4).cells[1].source == "print(x * 100)"


@pytest.mark.parametrize("era", ["legacy", "modern"])
@pytest.mark.rules(ASK_ALL, timeout=120)
async def test_a_bad_approval_wait_is_refused_before_anything_is_asked(
    http: Any, agent: Any, mcp_url: str, jp_root_dir: Path, era: str
) -> None:
    notebook(jp_root_dir)
    bot = await agent(f"bad-{era}")
    connect = legacy_mcp if era == "legacy" else modern_mcp
    async with connect(mcp_url, bot.token) as session:
        for wait in (-1, 121, "10", True):
            result = await session.call_tool("notebook_edit", {**EDIT, "approval_wait": wait})
            assert result.is_error, wait
            assert "'approval_wait' must be a number of seconds between 0 and 120" in result.content[0].text
        result = await session.call_tool("notebook_read", {"path": "nb.ipynb", "approval_wait": 1})
        assert result.is_error and "unknown argument 'approval_wait'" in result.content[0].text
    listing = (await http("GET", "api/agent/approvals"))[1]
    assert listing == {"pending": [], "recent": []}


def output_schema_of(name: str) -> dict[str, Any] | None:
    return next(tool.output_schema for tool in TOOLS if tool.name == name)


async def test_a_call_still_pending_answers_in_the_tools_own_shape_and_its_outcome_can_be_learnt(
    http: Any, agent: Any, mcp_url: str, jp_root_dir: Path
) -> None:
    """Protocol 2025-11-25 (the SDK's ClientSession validates structured content against the tool's
    output schema): every gated tool's pending answer passes; run_status gives the outcome."""
    path = notebook(jp_root_dir)
    bot = await agent()
    person_edit = {"action": "edit", "cell_id": "c1", "content": "x = 7"}
    status, changed, _ = await http("POST", "api/agent/notebooks/nb.ipynb", person_edit)  # (never asked)
    assert status == 200, changed
    calls = {
        "notebook_edit": EDIT,
        "notebook_undo": {"path": "nb.ipynb", "change_id": changed["change_id"]},
        "notebook_kernel": {"path": "nb.ipynb", "action": "restart"},
        "session_delete": {"name": "nope"},
        "eval": {"cells": [{"code": "print(1)"}]},
        "notebook_run": {"path": "nb.ipynb", "all": True},
    }
    async with legacy_mcp(mcp_url, bot.token) as session:
        pending: dict[str, dict[str, Any]] = {}
        for name, arguments in calls.items():
            result = await session.call_tool(name, {**arguments, "approval_wait": 0})  # the SDK validates
            assert not result.is_error, (name, result.content[0].text)
            answer = result.structured_content
            assert answer is not None and answer["state"] == "awaiting_approval" and answer["approval_id"]
            schema = output_schema_of(name)
            if schema is not None:
                assert not list(Draft202012Validator(schema).iter_errors(answer)), name
            assert f"run_status with run_id '{answer['run_id']}'" in result.content[0].text, name
            pending[name] = answer
        assert "x * 100" not in path.read_text()  # nothing before the person decides

        edit = pending["notebook_edit"]
        assert (await http("POST", f"api/agent/approvals/{edit['approval_id']}", {"decision": "approve"}))[
            0
        ] == 200
        status = await session.call_tool("run_status", {"run_id": edit["run_id"], "wait": 60})
        assert status.structured_content["state"] == "complete", status.content[0].text
        assert "hash:" in status.content[0].text
        assert status.structured_content["result"]["structuredContent"]["hash"]
        assert nbformat.read(str(path), as_version=4).cells[1].source == "print(x * 100)"

        undo = pending["notebook_undo"]
        body = {"decision": "deny", "reason": "not that one"}
        assert (await http("POST", f"api/agent/approvals/{undo['approval_id']}", body))[0] == 200
        status = await session.call_tool("run_status", {"run_id": undo["run_id"], "wait": 60})
        assert status.structured_content["state"] == "error" and "not that one" in status.content[0].text

        kernel = pending["notebook_kernel"]
        cancelled = await session.call_tool("run_cancel", {"run_id": kernel["run_id"]})
        assert not cancelled.is_error
        shown = (await http("GET", f"api/agent/approvals/{kernel['approval_id']}"))[1]
        for _ in range(100):
            if shown["state"] != "pending":
                break
            await asyncio.sleep(0.05)
            shown = (await http("GET", f"api/agent/approvals/{kernel['approval_id']}"))[1]
        assert shown["state"] == "withdrawn", shown  # the agent stopped waiting: the person is not asked
        for name in ("session_delete", "eval", "notebook_run"):
            body = {"decision": "deny"}
            assert (await http("POST", f"api/agent/approvals/{pending[name]['approval_id']}", body))[0] == 200


@pytest.mark.rules([{"who": "agent:*", "actions": ["edit"], "decision": "ask"}])
async def test_a_2026_client_waits_across_retries_and_gets_the_tools_own_answer(
    http: Any, agent: Any, mcp_url: str, jp_root_dir: Path
) -> None:
    path = notebook(jp_root_dir)
    bot = await agent()
    async with modern_mcp(mcp_url, bot.token) as client:
        call = asyncio.ensure_future(client.call_tool("notebook_edit", {**EDIT, "approval_wait": 0.3}))
        await approve_when_asked(http)
        result = await call
    assert not result.is_error, result.content[0].text
    schema = output_schema_of("notebook_edit")
    assert not list(Draft202012Validator(schema).iter_errors(result.structured_content))
    assert result.structured_content["hash"] and "state" not in result.structured_content
    assert nbformat.read(str(path), as_version=4).cells[1].source == "print(x * 100)"

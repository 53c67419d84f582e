"""Detached runs over MCP, through the official SDK client: eval and notebook_run with detach answer a
run_id at once; run_status (with a bounded wait) gives the state and the output; run_cancel stops it."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import nbformat
import pytest
from mcp import ClientSession
from mcp.client.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def jp_server_config() -> dict[str, Any]:
    return {
        "ServerApp": {"jpserver_extensions": {"jupyter_agent_tools": True}},
        "KernelPool": {"size": 0},
        "RunRegistry": {"runs_db_path": ":memory:"},
    }


@pytest.fixture
def url(jp_serverapp: Any, http_server_client: Any, jp_http_port: int, jp_base_url: str) -> str:
    return f"http://127.0.0.1:{jp_http_port}{jp_base_url}api/agent/mcp"


@pytest.fixture
def headers(jp_serverapp: Any) -> dict[str, str]:
    return {"Authorization": f"token {jp_serverapp.identity_provider.token}"}


@contextlib.asynccontextmanager
async def legacy(url: str, headers: dict[str, str]) -> AsyncIterator[ClientSession]:
    async with (
        create_mcp_http_client(headers=headers) as http,
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


def text_of(result: Any) -> str:
    return "\n".join(block.text for block in result.content if block.type == "text")


async def test_detached_eval_then_run_status_with_wait(url: str, headers: dict[str, str]) -> None:
    async with legacy(url, headers) as session:
        code = "import time\nfor i in range(3):\n    print('step', i, flush=True)\n    time.sleep(0.2)"
        started = await session.call_tool("eval", {"cells": [{"code": code}], "detach": True})
        assert not started.is_error, text_of(started)
        run_id = started.structured_content["run_id"]
        assert f"run_status with run_id '{run_id}'" in text_of(started)
        status = await session.call_tool("run_status", {"run_id": run_id, "wait": 60})
        assert not status.is_error, text_of(status)
        assert status.structured_content["state"] == "complete"
        assert "step 2" in text_of(status) and text_of(status).startswith(f"Run {run_id}: complete")
        listing = await session.call_tool("run_status", {})
        assert run_id in [r["run_id"] for r in listing.structured_content["runs"]]
        missing = await session.call_tool("run_status", {"run_id": "nope"})
        assert missing.is_error and "Run not found" in text_of(missing)
        bad = await session.call_tool("run_status", {"run_id": run_id, "wait": -1})
        assert bad.is_error


async def test_detached_run_goes_on_after_the_mcp_client_left_and_can_be_cancelled(
    url: str, headers: dict[str, str], jp_root_dir: Path
) -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("import time; time.sleep(1); print('done')", id="a")]
    nbformat.write(nb, jp_root_dir / "mcp-detached.ipynb")
    async with legacy(url, headers) as session:
        started = await session.call_tool(
            "notebook_run", {"path": "mcp-detached.ipynb", "all": True, "detach": True}
        )
        run_id = started.structured_content["run_id"]
        long = await session.call_tool(
            "eval", {"cells": [{"code": "import time; time.sleep(60)"}], "timeout": 120, "detach": True}
        )
        long_id = long.structured_content["run_id"]
    # the client is gone (its session deleted): the runs went on
    async with legacy(url, headers) as session:
        status = await session.call_tool("run_status", {"run_id": run_id, "wait": 60})
        assert status.structured_content["state"] == "complete", text_of(status)
        saved = nbformat.read(jp_root_dir / "mcp-detached.ipynb", as_version=4)
        assert saved.cells[0].outputs[0]["text"] == "done\n"
        cancelled = await session.call_tool("run_cancel", {"run_id": long_id})
        assert not cancelled.is_error and "cancel requested" in text_of(cancelled)
        status = await session.call_tool("run_status", {"run_id": long_id, "wait": 30})
        assert status.structured_content["state"] == "cancelled"


async def test_modern_client_sees_the_tools(url: str, headers: dict[str, str]) -> None:
    async with (
        create_mcp_http_client(headers=headers) as http,
        Client(streamable_http_client(url, http_client=http)) as client,
    ):
        tools = {tool.name for tool in (await client.list_tools()).tools}
        assert {"run_status", "run_cancel"} <= tools


# -- MCP tasks (protocol 2025-11-25), through the SDK client's task types ---------------------------------

TASK_KEY = "io.modelcontextprotocol/related-task"


async def call_as_task(
    url: str, headers: dict[str, str], name: str, arguments: dict[str, Any]
) -> dict[str, Any]:
    """tools/call with 'task', as raw JSON-RPC in a session of its own: the SDK client (mcp 2.3.0) checks
    every tools/call answer as a CallToolResult, so it cannot receive a CreateTaskResult itself."""
    import httpx

    accept = {**headers, "Accept": "application/json, text/event-stream"}
    async with httpx.AsyncClient(timeout=60) as http:
        init = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-11-25",
                "capabilities": {},
                "clientInfo": {"name": "t", "version": "1"},
            },
        }
        answer = await http.post(url, json=init, headers=accept)
        sent = {
            **accept,
            "Mcp-Session-Id": answer.headers["Mcp-Session-Id"],
            "MCP-Protocol-Version": "2025-11-25",
        }
        await http.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=sent)
        params = {"name": name, "arguments": arguments, "task": {"ttl": 60_000}}
        answer = await http.post(
            url, json={"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": params}, headers=sent
        )
        body: dict[str, Any] = answer.json()
        return body


async def test_tools_run_as_tasks_through_the_sdk_client(url: str, headers: dict[str, str]) -> None:
    from mcp import types

    async with (
        create_mcp_http_client(headers=headers) as http,
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        initialized = await session.initialize()
        assert initialized.protocol_version == "2025-11-25"
        tasks = initialized.capabilities.tasks
        assert tasks is not None and tasks.requests is not None and tasks.requests.tools is not None
        tools = {tool.name: tool for tool in (await session.list_tools()).tools}
        assert tools["eval"].execution is not None and tools["eval"].execution.task_support == "optional"
        assert tools["notebook_read"].execution is None  # absent: forbidden
        code = (
            "import time\nfor i in range(3):\n    print('tick', i, flush=True)\n    time.sleep(0.3)\n'done'"
        )
        created = await call_as_task(url, headers, "eval", {"cells": [{"code": code}], "session": "tasks"})
        task = types.CreateTaskResult.model_validate(created["result"]).task  # the SDK's own model
        task_id = task.task_id
        assert task.status == "working" and task.poll_interval == 1000 and task.ttl == 3_600_000
        got = await session.send_request(
            types.GetTaskRequest(params=types.GetTaskRequestParams(task_id=task_id)), types.GetTaskResult
        )
        assert got.task_id == task_id and got.status in ("working", "completed")
        # tasks/result waits for the end and gives the tool call's own result
        result = await session.send_request(
            types.GetTaskPayloadRequest(params=types.GetTaskPayloadRequestParams(task_id=task_id)),
            types.CallToolResult,
        )
        assert not result.is_error and "tick 2" in text_of(result) and "'done'" in text_of(result)
        assert result.meta is not None and result.meta[TASK_KEY] == {"taskId": task_id}
        got = await session.send_request(
            types.GetTaskRequest(params=types.GetTaskRequestParams(task_id=task_id)), types.GetTaskResult
        )
        assert got.status == "completed"
        listed = await session.send_request(types.ListTasksRequest(), types.ListTasksResult)
        assert task_id in [task.task_id for task in listed.tasks]
        # cancel a long one
        created = await call_as_task(
            url, headers, "eval", {"cells": [{"code": "import time; time.sleep(60)"}], "timeout": 120}
        )
        long_id = created["result"]["task"]["taskId"]
        await anyio.sleep(1.5)  # until its cell runs
        cancelled = await session.send_request(
            types.CancelTaskRequest(params=types.CancelTaskRequestParams(task_id=long_id)),
            types.CancelTaskResult,
        )
        assert cancelled.task_id == long_id
        result = await session.send_request(
            types.GetTaskPayloadRequest(params=types.GetTaskPayloadRequestParams(task_id=long_id)),
            types.CallToolResult,
        )
        got = await session.send_request(
            types.GetTaskRequest(params=types.GetTaskRequestParams(task_id=long_id)), types.GetTaskResult
        )
        assert got.status == "cancelled", got
        assert result.structured_content["cancelled"] is True, result
        # a finished task cannot be cancelled; an unknown one is an error
        with pytest.raises(Exception, match="cannot be cancelled"):
            await session.send_request(
                types.CancelTaskRequest(params=types.CancelTaskRequestParams(task_id=task_id)),
                types.CancelTaskResult,
            )
        with pytest.raises(Exception, match="no task"):
            await session.send_request(
                types.GetTaskRequest(params=types.GetTaskRequestParams(task_id="nope")), types.GetTaskResult
            )
        # a tool without task support refuses 'task'
        refused = await call_as_task(url, headers, "notebook_read", {"path": "x.ipynb"})
        assert refused["error"]["code"] == -32601 and "does not run as a task" in refused["error"]["message"]
    # the task outlives the MCP session that started it: a new session reads its result
    async with legacy(url, headers) as session:
        got = await session.send_request(
            types.GetTaskRequest(params=types.GetTaskRequestParams(task_id=task_id)), types.GetTaskResult
        )
        assert got.status == "completed"

"""Detached runs over MCP, through the official SDK client: eval and notebook_run with detach answer a
run_id at once; run_status (with a bounded wait) gives the state and the output; run_cancel stops it."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

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
        "AgentToolsApp": {"per_call_pool_size": 0},
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

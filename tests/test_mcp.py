"""The MCP endpoint with real clients against a real server (pytest-jupyter, in process) and real kernels.

The official Python SDK client speaks both protocol eras: ``ClientSession.initialize()`` (the 2025-11-25
handshake) and ``Client(mode="auto")`` (``server/discover``, protocol 2026-07-28). Raw JSON-RPC covers
what no SDK sends: malformed messages, batches, older versions, mismatched headers. Every result is also
checked against the SDK's own wire types for its protocol version (``mcp_types.methods``).
"""

from __future__ import annotations

import base64
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from http.cookies import SimpleCookie
from pathlib import Path
from typing import Any, ClassVar

import anyio
import httpx2
import nbformat
import pytest
from jsonschema import Draft202012Validator
from jupyter_server.auth.authorizer import Authorizer
from mcp import ClientSession
from mcp.client.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp_types import methods as wire
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from jupyter_agent_tools.api_document import openapi_document, operations
from jupyter_agent_tools.mcp.server import LEGACY_VERSIONS, MODERN_VERSIONS
from jupyter_agent_tools.mcp.tool_schemas import component, portable, without_null
from jupyter_agent_tools.mcp.tools import TOOLS

pytestmark = pytest.mark.timeout(240)
PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
ACCEPT = "application/json, text/event-stream"
MODERN = MODERN_VERSIONS[-1]
LATEST_LEGACY = LEGACY_VERSIONS[-1]
# The route each tool wraps
ROUTES = {
    "eval": ("POST", "/api/agent/eval"),
    "notebook_read": ("GET", "/api/agent/notebooks/{path}"),
    "notebook_output_read": ("GET", "/api/agent/notebooks/{path}/cells/{cell}/outputs/{n}"),
    "notebook_edit": ("POST", "/api/agent/notebooks/{path}"),
    "notebook_run": ("POST", "/api/agent/notebooks/{path}/run"),
    "notebook_kernel": ("POST", "/api/agent/notebooks/{path}/kernel"),
    "session_list": ("GET", "/api/agent/sessions"),
    "session_interrupt": ("POST", "/api/agent/sessions/{name}/interrupt"),
    "session_delete": ("DELETE", "/api/agent/sessions/{name}"),
    "artifact_read": ("GET", "/api/agent/artifacts/{artifact_id}"),
    "file_list": ("GET", "/api/agent/files"),
    "notebook_changes": ("GET", "/api/agent/notebooks/{path}/changes"),
    "notebook_undo": ("POST", "/api/agent/notebooks/{path}/changes/{change_id}/undo"),
    "run_status": ("GET", "/api/agent/runs/{run_id}"),
    "run_cancel": ("POST", "/api/agent/runs/{run_id}/cancel"),
}
PAIRS = [("read", "contents"), ("write", "contents"), ("execute", "kernels"), ("read", "kernels")]


class DenyOne(Authorizer):
    """Allows everything except the (action, resource) pairs in ``denied``; records what it was asked."""

    denied: ClassVar[set[tuple[str, str]]] = set()
    asked: ClassVar[list[tuple[str, str]]] = []

    def is_authorized(self, handler: Any, user: Any, action: str, resource: str) -> bool:
        self.asked.append((action, resource))
        return (action, resource) not in self.denied


@pytest.fixture
def jp_server_config() -> dict[str, Any]:
    return {
        "ServerApp": {"jpserver_extensions": {"jupyter_agent_tools": True}, "authorizer_class": DenyOne},
        "AgentToolsApp": {"max_body_bytes": 64 * 1024, "stream_heartbeat_interval": 0.3},
        "EvalSessionManager": {"max_sessions": 3},
        "CellExecutor": {"max_output_bytes": 1024},
    }


@pytest.fixture(autouse=True)
def reset_authorizer() -> Any:
    DenyOne.denied, DenyOne.asked = set(), []
    yield
    DenyOne.denied, DenyOne.asked = set(), []


@pytest.fixture
def url(jp_serverapp: Any, http_server_client: Any, jp_http_port: int, jp_base_url: str) -> str:
    """The endpoint of the in-process server (http_server_client makes it listen)."""
    return f"http://127.0.0.1:{jp_http_port}{jp_base_url}api/agent/mcp"


@pytest.fixture
def notebook(jp_root_dir: Path) -> Path:
    nb = new_notebook(
        cells=[
            new_markdown_cell("# Title", id="m0"),
            new_code_cell(
                "print(1)",
                id="c1",
                execution_count=1,
                outputs=[
                    new_output("stream", name="stdout", text="1\n"),
                    new_output("display_data", data={"image/png": PNG, "text/plain": "<img>"}),
                ],
            ),
        ]
    )
    nb.nbformat_minor = 5
    path = jp_root_dir / "nb.ipynb"
    nbformat.write(nb, str(path))
    return path


@contextlib.asynccontextmanager
async def legacy(url: str, headers: dict[str, str]) -> AsyncIterator[ClientSession]:
    """The SDK's ClientSession after the initialize handshake (protocol 2025-11-25)."""
    async with (
        create_mcp_http_client(headers=headers) as http,
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


@contextlib.asynccontextmanager
async def modern(url: str, headers: dict[str, str]) -> AsyncIterator[Client]:
    """The SDK's Client in its default mode: server/discover, then protocol 2026-07-28 per request."""
    async with (
        create_mcp_http_client(headers=headers) as http,
        Client(streamable_http_client(url, http_client=http)) as client,
    ):
        yield client


Rpc = Callable[..., Awaitable[tuple[int, Any, httpx2.Headers]]]


def parse_sse(text: str) -> list[Any]:
    """The messages of an SSE body (None for a comment line: a keep-alive)."""
    events: list[Any] = []
    for block in text.split("\n\n"):
        lines = [line for line in block.splitlines() if line]
        if not lines:
            continue
        data = [line[5:].strip() for line in lines if line.startswith("data:")]
        events.append(json.loads("\n".join(data)) if data else None)
    return events


@pytest.fixture
def rpc(url: str, jp_auth_header: dict[str, str]) -> Rpc:
    """POST (or another method) to the endpoint with the token: (status, JSON or SSE messages, headers)."""

    async def call(
        body: Any = None,
        headers: dict[str, str] | None = None,
        *,
        raw: bytes | None = None,
        method: str = "POST",
        auth: bool = True,
    ) -> tuple[int, Any, httpx2.Headers]:
        sent = {"Accept": ACCEPT, "Content-Type": "application/json"}
        if auth:
            sent.update(jp_auth_header)
        sent.update(headers or {})
        content = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        async with httpx2.AsyncClient(timeout=120) as client:
            response = await client.request(method, url, content=content, headers=sent)
        text = response.text
        if response.headers.get("content-type", "").startswith("text/event-stream"):
            return response.status_code, parse_sse(text), response.headers
        return response.status_code, json.loads(text) if text else None, response.headers

    return call


async def open_session(rpc: Rpc, version: str = LATEST_LEGACY) -> dict[str, str]:
    """Raw initialize + initialized: the headers every later request of the session sends."""
    status, answer, headers = await rpc(request(0, "initialize", protocolVersion=version, capabilities={}))
    assert status == 200 and answer["result"]["protocolVersion"] == version, answer
    session = {"Mcp-Session-Id": headers["mcp-session-id"]}
    if version >= "2025-06-18":
        session["MCP-Protocol-Version"] = version
    status, _, _ = await rpc({"jsonrpc": "2.0", "method": "notifications/initialized"}, session)
    assert status == 202
    return session


def request(rid: Any, method: str, **params: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "method": method, "params": params}


def modern_request(rid: Any, method: str, **params: Any) -> tuple[dict[str, Any], dict[str, str]]:
    """A 2026-07-28 request: ``_meta`` with version and capabilities, and the mirrored headers."""
    meta = {
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientCapabilities": {},
        **params.pop("_meta", {}),
    }
    headers = {"MCP-Protocol-Version": MODERN, "Mcp-Method": method}
    if "name" in params:
        headers["Mcp-Name"] = params["name"]
    return request(rid, method, **params, _meta=meta), headers


def text_of(result: Any) -> str:
    return "\n".join(block.text for block in result.content if block.type == "text")


# -------------------------------------------------------------------------------- the tool table


def test_tools_wrap_their_routes_schemas_and_permissions() -> None:
    """Names, permissions (the route's x-authorization) and schemas (the route's, self-contained)."""
    assert [tool.name for tool in TOOLS] == list(ROUTES)
    documented = {}
    for method, path, op in operations(openapi_document()):
        needs = op.get("x-authorization")
        if needs is not None:
            needs = needs if isinstance(needs, list) else [needs]
            documented[(method, path)] = tuple((n["action"], n["resource"]) for n in needs)
    for tool in TOOLS:
        route = ROUTES[tool.name]
        assert tool.permissions == (documented[route] if route else (("read", "contents"),)), tool.name
        for schema in (tool.input_schema, tool.output_schema):
            if schema is None:
                continue
            Draft202012Validator.check_schema(schema)
            text = json.dumps(schema)
            assert '"$ref"' not in text and '"discriminator"' not in text and '"x-' not in text, tool.name
        assert tool.input_schema["type"] == "object", tool.name
        assert not {"oneOf", "anyOf", "allOf"} & set(tool.input_schema), tool.name  # refused by model APIs
        assert 20 < len(tool.description) < 600, tool.name
    by_name = {tool.name: tool for tool in TOOLS}
    eval_input = json.loads(json.dumps(by_name["eval"].input_schema))
    assert eval_input["properties"].pop("include_images")["type"] == "boolean"
    assert eval_input["properties"].pop("detach")["type"] == "boolean"  # described for MCP (run_status)
    assert eval_input["properties"].pop("approval_wait")["type"] == "number"  # the gate's (the route's too)
    route_input = without_null(component("EvalRequest"))
    del route_input["properties"]["detach"]
    assert eval_input == route_input
    assert by_name["notebook_read"].output_schema == portable(component("NotebookRead"))
    assert by_name["notebook_edit"].output_schema == portable(
        {
            "type": "object",
            "anyOf": [  # or, still waiting for the person, the run that goes on once approved
                component("NotebookChangeResult"),
                component("NotebookCreated"),
                component("RunSummary"),
            ],
        }
    )
    assert by_name["file_list"].output_schema == portable(component("FileList"))
    assert by_name["session_list"].output_schema == portable(component("SessionList"))


# What a model reads of tools/list (name, description, inputSchema of every tool), compact JSON: a budget, so
# a longer description or a new tool is a choice, not a drift (11,449 bytes for the 10 tools of 0.1.0;
# approval_wait on the six gated tools took it from 14,272 to 15,106; a session's owner on session_delete and
# session_interrupt to 15,238; focus ("this cell") on the four notebook tools to 15,658).
TOOLS_LIST_BUDGET = 15_700
# The MCP Inspector's schema portability rules (its CLI prints them with --strict): where subschemas are,
# the keywords that constrain a value, and the keywords a bare boolean is fine for.
SUBSCHEMA_MAPS = (
    "properties", "patternProperties", "dependentSchemas", "dependencies", "$defs", "definitions",
)  # fmt: skip
SUBSCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")
SUBSCHEMA_VALUES = (
    "items", "contains", "not", "propertyNames", "if", "then", "else", "additionalProperties",
    "unevaluatedProperties", "additionalItems", "unevaluatedItems", "contentSchema",
)  # fmt: skip
BOOLEAN_VALUED = {"additionalProperties", "unevaluatedProperties", "additionalItems", "unevaluatedItems"}
CONSTRAINING = {
    "type", "enum", "const", "multipleOf", "maximum", "exclusiveMaximum", "minimum", "exclusiveMinimum",
    "maxLength", "minLength", "pattern", "format", "contentMediaType", "contentEncoding", "contentSchema",
    "maxItems", "minItems", "uniqueItems", "maxContains", "minContains", "maxProperties", "minProperties",
    "required", "dependentRequired", "allOf", "anyOf", "oneOf", "not", "items", "prefixItems", "contains",
    "additionalItems", "unevaluatedItems", "properties", "patternProperties", "additionalProperties",
    "unevaluatedProperties", "propertyNames", "dependentSchemas", "dependencies", "$ref", "$dynamicRef",
    "$recursiveRef",
}  # fmt: skip


def portability_findings(schema: Any, path: str, keyword: str | None = None) -> list[str]:
    """What the MCP Inspector reports about a tool schema: type arrays, schemas that constrain nothing,
    bare booleans where a schema object is expected, references outside the document."""
    if isinstance(schema, bool):
        return [] if keyword in BOOLEAN_VALUED else [f"{path}: bare {schema}"]
    if not isinstance(schema, dict):
        return []
    found = []
    if isinstance(schema.get("type"), list):
        found.append(f"{path}: type is an array {schema['type']}")
    if isinstance(schema.get("$ref"), str) and not schema["$ref"].startswith("#"):
        found.append(f"{path}: remote $ref")
    pair = "if" in schema and ("then" in schema or "else" in schema)
    if not (CONSTRAINING & set(schema) or pair) and keyword != "not":
        found.append(f"{path}: constrains nothing")
    for key in SUBSCHEMA_MAPS:
        for name, sub in (schema.get(key) if isinstance(schema.get(key), dict) else {}).items():
            found += portability_findings(sub, f"{path}.{key}.{name}", key)
    for key in SUBSCHEMA_LISTS:
        for i, sub in enumerate(schema.get(key) if isinstance(schema.get(key), list) else []):
            found += portability_findings(sub, f"{path}.{key}[{i}]", key)
    for key in SUBSCHEMA_VALUES:
        if key in schema:
            subs = schema[key] if key == "items" and isinstance(schema[key], list) else [schema[key]]
            for sub in subs:
                found += portability_findings(sub, f"{path}.{key}", key)
    return found


async def test_tools_list_keeps_its_budget_and_the_inspectors_portability_rules(rpc: Rpc) -> None:
    """tools/list as sent: what a model reads stays within TOOLS_LIST_BUDGET, and no input or output
    schema has a finding of the Inspector's portability check (there were 42, all in outputSchema)."""
    session = await open_session(rpc)  # 2025-11-25: with outputSchema
    status, answer, _ = await rpc(request(1, "tools/list"), session)
    assert status == 200, answer
    tools = answer["result"]["tools"]
    assert all("outputSchema" in tool for tool in tools if tool["name"] != "session_delete")
    read = [{key: tool[key] for key in ("name", "description", "inputSchema")} for tool in tools]
    size = len(json.dumps(read, separators=(",", ":"), ensure_ascii=False).encode())
    assert size <= TOOLS_LIST_BUDGET, f"name, description and inputSchema of the tools: {size} bytes"
    findings = [
        finding
        for tool in tools
        for kind in ("inputSchema", "outputSchema")
        if kind in tool
        for finding in portability_findings(tool[kind], f"{tool['name']}.{kind}")
    ]
    assert findings == []


# ------------------------------------------------------------------------------- SDK, both eras


async def test_sdk_legacy_session_calls_every_tool(url, jp_auth_header, notebook, api, jp_root_dir) -> None:
    (jp_root_dir / ".hidden.ipynb").write_bytes(notebook.read_bytes())
    (jp_root_dir / "sub").mkdir()
    (jp_root_dir / "sub" / "data.csv").write_text("a,b\n")
    async with legacy(url, jp_auth_header) as session:
        assert session.protocol_version == LATEST_LEGACY
        assert session.server_info is not None and session.server_info.name == "jupyter-agent-tools"
        listed = await session.list_tools()
        assert [t.name for t in listed.tools] == list(ROUTES)

        files = await session.call_tool("file_list", {"recursive": True})
        assert not files.is_error, text_of(files)
        paths = [entry["path"] for entry in files.structured_content["entries"]]
        assert paths == ["nb.ipynb", "sub", "sub/data.csv"]  # hidden files are not listed
        assert "nb.ipynb (notebook" in text_of(files)

        read = await session.call_tool("notebook_read", {"path": "nb.ipynb"})
        status, route = await api("GET", "notebooks", "nb.ipynb")
        assert status == 200 and read.structured_content == route  # the route's answer, as is
        assert "# Title" in text_of(read) and f"hash {route['hash']}" in text_of(read)
        assert "[image/png image, 70 bytes: not attached" in text_of(read)
        assert [block.type for block in read.content] == ["text"]

        edit = await session.call_tool(
            "notebook_edit",
            {"path": "nb.ipynb", "action": "insert", "content": "x = 40", "expected_hash": route["hash"]},
        )
        assert not edit.is_error, text_of(edit)
        assert edit.structured_content["details"]["cellIndex"] == 2
        assert text_of(edit).startswith("Inserted code cell at index 2")
        assert nbformat.read(str(notebook), as_version=4).cells[2].source == "x = 40"
        stale = await session.call_tool(
            "notebook_edit", {"path": "nb.ipynb", "action": "delete", "cell_index": 0, "expected_hash": "0"}
        )
        assert stale.is_error and "Notebook changed since it was read" in text_of(stale)
        assert len(nbformat.read(str(notebook), as_version=4).cells) == 3

        progress: list[str | None] = []

        async def on_progress(value: float, total: float | None, message: str | None) -> None:
            progress.append(message)

        ran = await session.call_tool(
            "eval",
            {"cells": [{"code": "x = 41\nprint('a', flush=True)"}, {"code": "x + 1"}], "session": "s"},
            progress_callback=on_progress,
        )
        assert not ran.is_error, text_of(ran)
        assert ran.structured_content["output"] == text_of(ran) == "[1/2]\na\n\n[2/2]\n42"
        assert "".join(m for m in progress if m) == "a\n42\n"
        # the same session as the route's: the kernel state is shared
        status, answer = await api("POST", "eval", body={"cells": [{"code": "x"}], "session": "s"})
        assert status == 200 and answer["output"] == "41\n"

        listing = await session.call_tool("session_list", {})
        assert [s["name"] for s in listing.structured_content["sessions"]] == ["s"]
        interrupt = await session.call_tool("session_interrupt", {"name": "s"})
        assert interrupt.structured_content["interrupted"] is False
        deleted = await session.call_tool("session_delete", {"name": "s"})
        assert not deleted.is_error and deleted.structured_content is None
        assert (await api("GET", "sessions"))[1]["sessions"] == []
        again = await session.call_tool("session_delete", {"name": "s"})
        assert again.is_error and text_of(again) == "Session not found: s"

        # 4xx answers of the routes are tool errors with the route's message
        missing = await session.call_tool("notebook_read", {"path": "nope.ipynb"})
        assert missing.is_error and text_of(missing) == "Notebook not found: nope.ipynb"
        bad = await session.call_tool("eval", {"cells": []})
        status, route_error = await api("POST", "eval", body={"cells": []})
        assert bad.is_error and text_of(bad) == route_error["message"] and status == 400
        unknown = await session.call_tool("notebook_read", {"path": "nb.ipynb", "colour": 1})
        assert unknown.is_error and "unknown argument 'colour'" in text_of(unknown)
        hidden = await session.call_tool("file_list", {"path": ".git"})
        assert hidden.is_error and "Directory not found" in text_of(hidden)


async def test_sdk_reviews_and_undoes_changes(url, jp_auth_header, notebook, api) -> None:
    """notebook_changes and notebook_undo, and since on notebook_read, through the SDK's client."""
    original = notebook.read_bytes()
    async with legacy(url, jp_auth_header) as session:
        first = await session.call_tool("notebook_read", {"path": "nb.ipynb"})
        edit = await session.call_tool(
            "notebook_edit", {"path": "nb.ipynb", "action": "edit", "cell_id": "c1", "content": "print(2)"}
        )
        assert not edit.is_error and edit.structured_content["recorded"] is True, text_of(edit)
        change_id = edit.structured_content["change_id"]
        listing = await session.call_tool("notebook_changes", {"path": "nb.ipynb"})
        assert not listing.is_error, text_of(listing)
        [entry] = listing.structured_content["changes"]
        assert (entry["id"], entry["via"], entry["action"]) == (change_id, "mcp", "edit 1 cell")
        assert f"change {change_id} " in text_of(listing) and "c1 edited" in text_of(listing)
        detail = await session.call_tool("notebook_changes", {"path": "nb.ipynb", "change_id": change_id})
        assert "-print(1)\n+print(2)" in text_of(detail)
        since = await session.call_tool(
            "notebook_read", {"path": "nb.ipynb", "since": first.structured_content["hash"]}
        )
        [cell] = since.structured_content["changes_since"]["cells"]
        assert (cell["id"], cell["via"], cell["change_id"]) == ("c1", "mcp", change_id)
        assert "c1 edited (" in text_of(since) and f"via mcp, change {change_id})" in text_of(since)
        undone = await session.call_tool("notebook_undo", {"path": "nb.ipynb", "change_id": change_id})
        assert not undone.is_error, text_of(undone)
        assert undone.structured_content["undoes"] == change_id
        assert notebook.read_bytes() == original
        again = await session.call_tool("notebook_undo", {"path": "nb.ipynb", "change_id": change_id})
        assert again.is_error and "cell c1: its source changed since" in text_of(again)
        assert notebook.read_bytes() == original
        unknown = await session.call_tool("notebook_undo", {"path": "nb.ipynb", "change_id": "999"})
        assert unknown.is_error and text_of(unknown).startswith("No change 999 of nb.ipynb")


async def test_sdk_modern_client(url, jp_auth_header, notebook) -> None:
    async with modern(url, jp_auth_header) as client:
        assert client.session.protocol_version == MODERN
        assert [t.name for t in (await client.list_tools()).tools] == list(ROUTES)
        progress: list[str | None] = []

        async def on_progress(value: float, total: float | None, message: str | None) -> None:
            progress.append(message)

        code = "import time\nfor i in range(3):\n    print(i, flush=True)\n    time.sleep(0.1)"
        ran = await client.call_tool("eval", {"cells": [{"code": code}]}, progress_callback=on_progress)
        assert not ran.is_error and text_of(ran) == "0\n1\n2\n"
        assert "".join(m for m in progress if m) == "0\n1\n2\n"
        read = await client.call_tool("notebook_read", {"path": "nb.ipynb"})
        assert read.structured_content["cells"][1]["source"] == "print(1)"
        missing = await client.call_tool(
            "notebook_edit", {"path": "no.ipynb", "action": "delete", "cell_index": 0}
        )
        assert missing.is_error and text_of(missing) == "Notebook not found: no.ipynb"


async def test_sdk_modern_client_every_method(url, jp_auth_header, notebook) -> None:
    """The SDK's default Client (2026-07-28, which validates every result strictly) through every method
    this server answers: server/discover (on connect), tools/list and tools/call, resources/list,
    resources/templates/list and resources/read; prompts/list is a JSON-RPC error (no prompts)."""
    uri = "jupyter://notebooks/nb.ipynb"
    async with modern(url, jp_auth_header) as client:
        assert client.session.protocol_version == MODERN
        assert client.server_capabilities.resources is not None
        assert [t.name for t in (await client.list_tools()).tools] == list(ROUTES)
        listed = await client.list_resources()
        assert [(str(r.uri), r.name) for r in listed.resources] == [(uri, "nb.ipynb")]
        assert (listed.ttl_ms, listed.cache_scope) == (0, "private")  # notebooks change at any time
        templates = await client.list_resource_templates()
        assert {str(t.uri_template) for t in templates.resource_templates} == {
            "jupyter://notebooks/{+path}",
            "jupyter://notebooks/{+path}/cells/{cell}/outputs/{n}",
            "jupyter://focus",
        }
        notebook_text = await client.read_resource(uri)
        assert "# Title" in notebook_text.contents[0].text and notebook_text.ttl_ms == 0
        output = await client.read_resource(f"{uri}/cells/c1/outputs/1")
        assert {c.mime_type: getattr(c, "blob", None) for c in output.contents}["image/png"] == PNG
        # not cached: a change on disk shows in the next list and read
        nb = nbformat.read(str(notebook), as_version=4)
        nb.cells[0].source = "# Changed"
        nbformat.write(nb, str(notebook))
        (notebook.parent / "second.ipynb").write_bytes(notebook.read_bytes())
        assert len((await client.list_resources()).resources) == 2
        assert "# Changed" in (await client.read_resource(uri)).contents[0].text
        with pytest.raises(Exception, match=r"Notebook not found: nope\.ipynb") as missing:
            await client.read_resource("jupyter://notebooks/nope.ipynb")
        assert missing.value.error.code == -32002
        with pytest.raises(Exception, match="Method not found") as no_prompts:
            await client.list_prompts()
        assert no_prompts.value.error.code == -32601
        for name in ("session_list", "file_list", "run_status"):
            result = await client.call_tool(name, {})
            assert not result.is_error, (name, text_of(result))


async def test_a_cell_that_raised_is_a_tool_error(url, jp_auth_header, jp_root_dir) -> None:
    """eval and notebook_run whose cell raised answer isError: true (a model reads false as success); the
    traceback stays in the text and the route's answer in structuredContent."""
    nb = new_notebook(cells=[new_code_cell("x = 1", id="ok"), new_code_cell("1/0", id="bad")])
    nbformat.write(nb, str(jp_root_dir / "raises.ipynb"))
    async with modern(url, jp_auth_header) as client, legacy(url, jp_auth_header) as session:
        for call in (client.call_tool, session.call_tool):
            ran = await call("eval", {"cells": [{"code": "x = 1"}, {"code": "1/0"}]})
            assert ran.is_error, text_of(ran)
            assert "ZeroDivisionError" in text_of(ran) and "Fix only cell 2." in text_of(ran)
            assert [c["status"] for c in ran.structured_content["cells"]] == ["complete", "error"]
            fine = await call("eval", {"cells": [{"code": "x = 2"}]})
            assert not fine.is_error, text_of(fine)
        run = await session.call_tool("notebook_run", {"path": "raises.ipynb", "all": True})
        assert run.is_error and "ZeroDivisionError" in text_of(run), text_of(run)
        assert [c["status"] for c in run.structured_content["cells"]] == ["complete", "error"]
        in_notebook = await client.call_tool("eval", {"notebook": "raises.ipynb", "cells": [{"code": "1/0"}]})
        assert in_notebook.is_error and "ZeroDivisionError" in text_of(in_notebook)


async def test_sdk_legacy_session_every_method(url, jp_auth_header, notebook) -> None:
    """The older era through ClientSession (initialize, 2025-11-25): ping, tools, resources; prompts/list
    is a JSON-RPC error."""
    uri = "jupyter://notebooks/nb.ipynb"
    async with legacy(url, jp_auth_header) as session:
        await session.send_ping()
        assert [t.name for t in (await session.list_tools()).tools] == list(ROUTES)
        listed = await session.list_resources()
        assert [str(r.uri) for r in listed.resources] == [uri]
        templates = await session.list_resource_templates()
        assert len(templates.resource_templates) == 3
        read = await session.read_resource(uri)
        assert "# Title" in read.contents[0].text
        with pytest.raises(Exception, match="Method not found"):
            await session.list_prompts()


async def test_progress_heartbeat_during_silence(url, jp_auth_header) -> None:
    """With a progress token, 2 s of silence (heartbeat every 0.3 s) sends progress without a message."""
    async with legacy(url, jp_auth_header) as session:
        seen: list[tuple[float, str | None]] = []

        async def on_progress(value: float, total: float | None, message: str | None) -> None:
            seen.append((value, message))

        code = "import time\nprint('start', flush=True)\ntime.sleep(2)\nprint('end')"
        ran = await session.call_tool("eval", {"cells": [{"code": code}]}, progress_callback=on_progress)
        assert text_of(ran) == "start\nend\n"
        messages = [m for _, m in seen]
        assert [m for m in messages if m] == ["start\n", "end\n"]
        started, ended = messages.index("start\n"), messages.index("end\n")
        assert None in messages[started + 1 : ended]  # heartbeats while the kernel slept
        values = [v for v, _ in seen]
        assert values == sorted(set(values))  # progress only increases


# ----------------------------------------------------------------------------------- cancellation

SLOW = "import time\nprint('started', flush=True)\ntime.sleep(60)\nfinished = True"


async def _cancel_after_start(call: Callable[[Any], Awaitable[Any]]) -> None:
    """Run a call whose kernel prints 'started' and then sleeps; cancel it once it started."""
    started = anyio.Event()

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        if message and "started" in message:
            started.set()

    async with anyio.create_task_group() as group:
        scope = anyio.CancelScope()

        async def run() -> None:
            with scope:
                await call(on_progress)

        group.start_soon(run)
        with anyio.fail_after(90):
            await started.wait()
        scope.cancel()


async def _assert_interrupted(api: Any, session: str) -> None:
    """The session's next call runs (the cancelled one released it) and the sleep never finished."""
    status, answer = await api(
        "POST", "eval", body={"cells": [{"code": "'finished' in dir()"}], "session": session}
    )
    assert status == 200 and answer["output"] == "False\n", answer


async def test_cancel_legacy_notification_interrupts_the_kernel(url, jp_auth_header, api) -> None:
    """The SDK abandons the call and POSTs notifications/cancelled with its id: the kernel is interrupted."""
    async with legacy(url, jp_auth_header) as session:
        await _cancel_after_start(
            lambda on_progress: session.call_tool(
                "eval",
                {"cells": [{"code": SLOW}], "session": "c", "timeout": 120},
                progress_callback=on_progress,
            )
        )
        await _assert_interrupted(api, "c")


async def test_cancel_modern_closing_the_stream_interrupts_the_kernel(url, jp_auth_header, api) -> None:
    """At 2026-07-28 the SDK cancels by closing the request's SSE response: the kernel is interrupted."""
    async with modern(url, jp_auth_header) as client:
        await _cancel_after_start(
            lambda on_progress: client.call_tool(
                "eval",
                {"cells": [{"code": SLOW}], "session": "m", "timeout": 120},
                progress_callback=on_progress,
            )
        )
        await _assert_interrupted(api, "m")


async def test_delete_session_cancels_its_running_call(url, rpc, api) -> None:
    session = await open_session(rpc)
    body = request(7, "tools/call", name="eval", arguments={"cells": [{"code": SLOW}], "session": "d"})
    body["params"]["_meta"] = {"progressToken": "t"}
    async with anyio.create_task_group() as group:
        done: list[Any] = []

        async def run() -> None:
            done.append(await rpc(body, session))

        group.start_soon(run)
        with anyio.fail_after(90):
            while not (await api("GET", "sessions"))[1]["sessions"]:
                await anyio.sleep(0.05)
            while not (await api("GET", "sessions"))[1]["sessions"][0]["busy"]:
                await anyio.sleep(0.05)
        status, _, _ = await rpc(None, session, method="DELETE")
        assert status == 204
    status, events, _ = done[0]
    assert status == 200 and all(e is None or "method" in e for e in events)  # no response once cancelled
    await _assert_interrupted(api, "d")
    assert (await rpc(request(8, "tools/list"), session))[0] == 404


# ------------------------------------------------------------------------------------------ images


async def test_images_only_when_asked(url, jp_auth_header, notebook) -> None:
    code = "from IPython.display import Image, display\nimport base64\n"
    code += f"display(Image(base64.b64decode('{PNG}')))"
    async with legacy(url, jp_auth_header) as session:
        plain = await session.call_tool("eval", {"cells": [{"code": code}]})
        assert [block.type for block in plain.content] == ["text"]
        assert "cell 1: [image/png image, 70 bytes: not attached" in text_of(plain)
        assert plain.structured_content["cells"][0]["displays"] == [
            {"type": "image", "mime": "image/png", "bytes": 70}
        ]
        asked = await session.call_tool("eval", {"cells": [{"code": code}], "include_images": True})
        images = [block for block in asked.content if block.type == "image"]
        assert [(i.mime_type, i.data) for i in images] == [("image/png", PNG)]
        assert "attached as image 1" in text_of(asked)
        assert base64.b64decode(images[0].data).startswith(b"\x89PNG")

        read = await session.call_tool("notebook_read", {"path": "nb.ipynb", "include_images": True})
        assert [(b.type, getattr(b, "data", None)) for b in read.content[1:]] == [("image", PNG)]
        entry = read.structured_content["cells"][1]["outputs"][1]["data"][0]
        assert entry.pop("url").endswith("/outputs/1?mime=image/png")  # where notebook_output_read finds it
        assert entry == {"mime": "image/png", "bytes": 70}  # never base64 in the structured answer


async def test_notebook_run_attaches_images_only_when_asked(url, jp_auth_header, jp_root_dir) -> None:
    code = "from IPython.display import Image, display\nimport base64\n"
    code += f"display(Image(base64.b64decode('{PNG}')))"
    nb = new_notebook(cells=[new_code_cell(code, id="plot")])
    nb.nbformat_minor = 5
    nbformat.write(nb, str(jp_root_dir / "plot.ipynb"))
    placeholder = {"type": "image", "mime": "image/png", "bytes": 70}
    placeholder["url"] = "/api/agent/notebooks/plot.ipynb/cells/plot/outputs/0?mime=image/png"
    async with legacy(url, jp_auth_header) as session:
        plain = await session.call_tool("notebook_run", {"path": "plot.ipynb", "all": True})
        assert [block.type for block in plain.content] == ["text"]
        assert "cell plot: [image/png image, 70 bytes: not attached" in text_of(plain)
        assert plain.structured_content["cells"][0]["displays"] == [placeholder]
        arguments = {"path": "plot.ipynb", "all": True, "include_images": True}
        asked = await session.call_tool("notebook_run", arguments)
        assert [(b.type, getattr(b, "data", None)) for b in asked.content[1:]] == [("image", PNG)]
        assert "attached as image 1" in text_of(asked)
        assert asked.structured_content["cells"][0]["displays"] == [placeholder]  # never base64 in it


async def test_sdk_insert_and_run_eval_in_the_notebook_and_its_kernel(
    url, jp_auth_header, jp_root_dir
) -> None:
    nb = new_notebook(cells=[new_code_cell("base = 40", id="a")])
    nb.nbformat_minor = 5
    nbformat.write(nb, str(jp_root_dir / "mix.ipynb"))
    async with legacy(url, jp_auth_header) as session:
        ops = [{"action": "insert", "cell_id": "b", "content": "print(base + 2)"}]
        ran = await session.call_tool(
            "notebook_run", {"path": "mix.ipynb", "ops": ops, "cell_ids": ["a", "b"]}
        )
        assert not ran.is_error, text_of(ran)
        assert ran.structured_content["cells"][1]["output"] == "42\n"
        assert ran.structured_content["edit"]["results"][0]["details"]["cellId"] == "b"
        scratch = await session.call_tool("eval", {"cells": [{"code": "base * 2"}], "notebook": "mix.ipynb"})
        assert text_of(scratch) == "80\n" and scratch.structured_content["mode"] == "notebook"
        kernel = await session.call_tool("notebook_kernel", {"path": "mix.ipynb"})
        assert kernel.structured_content["kernel_id"] == scratch.structured_content["kernel_id"]
        assert "Kernel of mix.ipynb: idle" in text_of(kernel)
        listed = await session.call_tool("session_list", {})
        assert "(notebook mix.ipynb)" in text_of(listed)
        assert "- notebook mix.ipynb: kernel python3" in text_of(listed)
        restarted = await session.call_tool("notebook_kernel", {"path": "mix.ipynb", "action": "restart"})
        assert restarted.structured_content["state_lost"] is True and "state was lost" in text_of(restarted)
        bad = await session.call_tool("notebook_kernel", {"path": "mix.ipynb", "action": "explode"})
        assert bad.is_error and "'action' must be one of" in text_of(bad)
    assert "42" in json.dumps(nbformat.read(str(jp_root_dir / "mix.ipynb"), 4).cells[1].outputs)


async def test_eval_in_a_notebook_also_needs_read_on_contents(url, jp_auth_header, jp_root_dir, api) -> None:
    nb = new_notebook(cells=[new_code_cell("secret = 1", id="a")])
    nb.nbformat_minor = 5
    nbformat.write(nb, str(jp_root_dir / "private.ipynb"))
    DenyOne.denied = {("read", "contents")}
    body = {"cells": [{"code": "open('made.txt', 'w')"}], "notebook": "private.ipynb"}
    status, answer = await api("POST", "eval", body=body)
    assert status == 403 and "read on resource: contents" in answer["message"], answer
    async with legacy(url, jp_auth_header) as session:
        result = await session.call_tool("eval", body)
        assert result.is_error and "also needs 'read' on 'contents'" in text_of(result)
    assert not (jp_root_dir / "made.txt").exists()


# -------------------------------------------------------------------------------------- artifacts


async def test_artifact_read_pages_a_long_output(url, jp_auth_header, jp_fetch) -> None:
    code = "print(''.join(chr(0x41 + i % 26) + 'é€😀' for i in range(2000)))"  # 1, 2, 3, 4-byte characters
    async with legacy(url, jp_auth_header) as session:
        ran = await session.call_tool("eval", {"cells": [{"code": code}], "session": "art"})
        artifact = ran.structured_content["cells"][0]["artifact_id"]
        assert artifact and f"artifact://{artifact}" in text_of(ran)
        full = (await jp_fetch("api", "agent", "artifacts", artifact)).body.decode()
        pages: list[str] = []
        offset: int | None = 0
        while offset is not None:
            page = await session.call_tool("artifact_read", {"id": artifact, "offset": offset, "limit": 1000})
            assert not page.is_error, text_of(page)
            data = page.structured_content
            assert (
                data["offset"] == offset
                and data["bytes"] <= 1000
                and data["total_bytes"] == len(full.encode())
            )
            pages.append(data["text"])
            offset = data["next_offset"]
        assert "".join(pages) == full and len(pages) > 10
        inside = await session.call_tool("artifact_read", {"id": artifact, "offset": 2, "limit": 20})
        assert inside.structured_content["offset"] == 3  # 'A' then 'é' (2 bytes): byte 2 is inside it
        gone = await session.call_tool("artifact_read", {"id": "art.0123"})
        assert gone.is_error and text_of(gone).startswith("Artifact not found")


# --------------------------------------------------------------------------- authentication, authorization

TOOL_CALLS: dict[str, dict[str, Any]] = {
    "eval": {"cells": [{"code": "open('made.txt', 'w').close()"}], "session": "new"},
    "notebook_read": {"path": "nb.ipynb"},
    "notebook_output_read": {"path": "nb.ipynb", "cell": "c1", "output": 1},
    "notebook_edit": {"path": "nb.ipynb", "action": "insert", "content": "z = 0"},  # runs without error
    "notebook_run": {"path": "nb.ipynb", "all": True},
    "session_list": {},
    "session_interrupt": {"name": "keep"},
    "session_delete": {"name": "keep"},
    "artifact_read": {"id": "{artifact}"},
    "file_list": {},
    "notebook_changes": {"path": "nb.ipynb"},
    "notebook_undo": {"path": "nb.ipynb", "change_id": "1"},  # the markdown cell _keep_session inserts
    "run_status": {},
    "run_cancel": {"run_id": "0123456789abcdef"},  # no such run: refused first, else a 404 tool error
    "notebook_kernel": {"path": "nb.ipynb"},
}


async def _keep_session(api: Any) -> str:
    status, answer = await api(
        "POST", "notebooks", "nb.ipynb", body={"action": "insert", "content": "m", "cell_type": "markdown"}
    )
    assert status == 200 and answer["change_id"] == "1", answer
    status, answer = await api(
        "POST", "eval", body={"cells": [{"code": "print('y' * 2000)"}], "session": "keep"}
    )
    assert status == 200, answer
    return str(answer["cells"][0]["artifact_id"])


def _arguments(name: str, artifact: str) -> dict[str, Any]:
    return json.loads(json.dumps(TOOL_CALLS[name]).replace("{artifact}", artifact))


@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: f"deny-{p[0]}-{p[1]}")
async def test_denied_permission_is_a_tool_error_and_does_nothing(
    url, jp_auth_header, notebook, jp_serverapp, jp_root_dir, api, pair, agent_audit_events
) -> None:
    artifact = await _keep_session(api)
    kernels = set(jp_serverapp.kernel_manager.list_kernel_ids())
    before = notebook.read_bytes()
    DenyOne.denied = {pair}
    async with legacy(url, jp_auth_header) as session:
        for tool in TOOLS:
            if pair not in tool.permissions:
                continue
            DenyOne.asked = []
            result = await session.call_tool(tool.name, _arguments(tool.name, artifact))
            assert result.is_error, tool.name
            assert f"not authorized to {pair[0]} on resource: {pair[1]}" in text_of(result)
            assert f"The {tool.name} tool needs '{pair[0]}' on '{pair[1]}'" in text_of(result)
            assert DenyOne.asked[-1] == pair  # asked in order; nothing after the refusal
        assert notebook.read_bytes() == before
        assert set(jp_serverapp.kernel_manager.list_kernel_ids()) == kernels
        refusals = agent_audit_events("refusal")
        assert len(refusals) == sum(pair in tool.permissions for tool in TOOLS)
        assert {(r["route"], r["action"], r["resource"]) for r in refusals} == {("mcp", *pair)}
        assert all(r["user"] and r["user"] not in str(jp_auth_header) for r in refusals)
        assert not (jp_root_dir / "made.txt").exists()
        DenyOne.denied = set()
        assert [s["name"] for s in (await api("GET", "sessions"))[1]["sessions"]] == ["keep"]
        DenyOne.denied = {pair}
        for tool in TOOLS:  # every other tool still works
            if pair in tool.permissions or tool.name in ("session_delete", "run_cancel"):
                continue
            DenyOne.asked = []
            result = await session.call_tool(tool.name, _arguments(tool.name, artifact))
            assert not result.is_error, (tool.name, text_of(result))
            assert DenyOne.asked == list(tool.permissions), tool.name


async def test_handshake_and_listing_ask_no_permission(url, jp_auth_header) -> None:
    DenyOne.denied = set(PAIRS)
    async with legacy(url, jp_auth_header) as session:
        assert len((await session.list_tools()).tools) == len(ROUTES)
    async with modern(url, jp_auth_header) as client:
        assert len((await client.list_tools()).tools) == len(ROUTES)
    assert DenyOne.asked == []


async def test_unauthenticated_requests_are_refused_and_run_nothing(
    rpc, url, jp_serverapp, jp_root_dir
) -> None:
    session = await open_session(rpc)
    kernels = set(jp_serverapp.kernel_manager.list_kernel_ids())
    call = request(1, "tools/call", name="eval", arguments=TOOL_CALLS["eval"])
    for headers in ({}, {"Authorization": "token wrong"}, {"Authorization": "Bearer nope"}):
        for method, body in (("POST", call), ("GET", None), ("DELETE", None)):
            status, answer, _ = await rpc(body, {**session, **headers}, method=method, auth=False)
            assert status == 403, (method, headers, answer)
        body, modern_headers = modern_request(2, "tools/call", name="eval", arguments=TOOL_CALLS["eval"])
        assert (await rpc(body, {**modern_headers, **headers}, auth=False))[0] == 403
    assert set(jp_serverapp.kernel_manager.list_kernel_ids()) == kernels
    assert not (jp_root_dir / "made.txt").exists()
    assert (await rpc(request(3, "ping"), session))[0] == 200  # the session was not ended either


async def test_cookie_needs_xsrf_foreign_origin_refused_sessions_bound_to_their_owner(
    rpc, jp_serverapp, http_server_client, jp_base_url, jp_http_port
) -> None:
    jar: dict[str, str] = {}
    for path in (f"api/agent/sessions?token={jp_serverapp.identity_provider.token}", "login"):
        response = await http_server_client.fetch(
            jp_base_url + path, raise_error=False, follow_redirects=False
        )
        for header in response.headers.get_list("Set-Cookie"):
            jar.update({k: m.value for k, m in SimpleCookie(header).items()})
    cookie = {"Cookie": "; ".join(f"{k}={v}" for k, v in jar.items())}
    init = request(1, "initialize", protocolVersion=LATEST_LEGACY, capabilities={})
    status, answer, _ = await rpc(init, cookie, auth=False)
    assert status == 403 and "_xsrf" in answer["message"]
    with_xsrf = {**cookie, "X-XSRFToken": jar["_xsrf"]}
    host = f"127.0.0.1:{jp_http_port}"
    status, answer, _ = await rpc(init, {**with_xsrf, "Origin": "http://evil.example"}, auth=False)
    assert status == 403 and "Cross-origin" in answer["message"]
    status, answer, headers = await rpc(init, {**with_xsrf, "Origin": f"http://{host}"}, auth=False)
    assert status == 200, answer
    cookie_session = {"Mcp-Session-Id": headers["mcp-session-id"], "MCP-Protocol-Version": LATEST_LEGACY}
    assert (await rpc(request(2, "ping"), {**with_xsrf, **cookie_session}, auth=False))[0] == 200
    # the same session id with another credential is unknown
    status, answer, _ = await rpc(request(3, "ping"), cookie_session)
    assert status == 404 and answer["error"]["code"] == -32600


# ------------------------------------------------------------------------------ protocol, raw JSON-RPC


async def test_version_negotiation_and_results_per_version(rpc) -> None:
    for version in LEGACY_VERSIONS:
        status, answer, headers = await rpc(
            request(1, "initialize", protocolVersion=version, capabilities={})
        )
        assert status == 200 and answer["result"]["protocolVersion"] == version
        wire.validate_server_result("initialize", version, answer["result"])
        session = {"Mcp-Session-Id": headers["mcp-session-id"]}
        status, answer, _ = await rpc(request(2, "tools/list"), session)
        tools = answer["result"]["tools"]
        wire.validate_server_result("tools/list", version, answer["result"])
        assert ("annotations" in tools[0]) == (version >= "2025-03-26")
        assert ("outputSchema" in tools[0] and "title" in tools[0]) == (version >= "2025-06-18")
        status, answer, _ = await rpc(request(3, "tools/call", name="session_list", arguments={}), session)
        wire.validate_server_result("tools/call", version, answer["result"])
        assert ("structuredContent" in answer["result"]) == (version >= "2025-06-18")
    # a version the server does not speak: its newest (the client decides whether to go on)
    status, answer, _ = await rpc(request(1, "initialize", protocolVersion="2099-01-01", capabilities={}))
    assert answer["result"]["protocolVersion"] == LATEST_LEGACY
    status, answer, _ = await rpc(request(1, "initialize", protocolVersion=MODERN, capabilities={}))
    assert answer["result"]["protocolVersion"] == LATEST_LEGACY  # 2026-07-28 has no handshake
    initialized = answer["result"]["capabilities"]

    body, headers = modern_request(1, "server/discover")
    status, answer, _ = await rpc(body, headers)
    assert status == 200 and answer["result"]["supportedVersions"][0] == MODERN
    # the capabilities agree with initialize's: resource subscriptions (jupyter://focus) included
    discovered = answer["result"]["capabilities"]
    assert discovered["resources"] == initialized["resources"] == {"subscribe": True, "listChanged": False}
    assert discovered["tools"] == initialized["tools"]
    assert set(answer["result"]["supportedVersions"]) == {*LEGACY_VERSIONS, *MODERN_VERSIONS}
    wire.validate_server_result("server/discover", MODERN, answer["result"])
    for method, params in (("tools/list", {}), ("tools/call", {"name": "session_list", "arguments": {}})):
        body, headers = modern_request(2, method, **params)
        status, answer, response_headers = await rpc(body, headers)
        assert status == 200 and "mcp-session-id" not in response_headers
        wire.validate_server_result(method, MODERN, answer["result"])
        assert answer["result"]["resultType"] == "complete"


async def test_malformed_messages_get_json_rpc_errors_never_a_500(rpc) -> None:
    session = await open_session(rpc)
    cases: list[tuple[Any, dict[str, str], int, int]] = [
        # (body, extra headers, HTTP status, JSON-RPC code)
        (b"{not json", session, 400, -32700),
        (b"", session, 400, -32700),
        (b'{"a": NaN}', session, 400, -32700),
        (b"x" * (64 * 1024 + 1), session, 413, -32600),
        ([], session, 400, -32600),
        ("just a string", session, 400, -32600),
        ({"jsonrpc": "1.0", "id": 1, "method": "ping"}, session, 400, -32600),
        ({"id": 1, "method": "ping"}, session, 400, -32600),
        ({"jsonrpc": "2.0", "id": None, "method": "ping"}, session, 400, -32600),
        ({"jsonrpc": "2.0", "id": 1.5, "method": "ping"}, session, 400, -32600),
        ({"jsonrpc": "2.0", "id": True, "method": "ping"}, session, 400, -32600),
        ({"jsonrpc": "2.0", "id": 1}, session, 400, -32600),
        ({"jsonrpc": "2.0", "id": 1, "method": 5}, session, 400, -32600),
        ({"jsonrpc": "2.0", "method": "tools/call", "params": {"name": "eval"}}, session, 400, -32600),
        ({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": [1]}, session, 400, -32602),
        (request(1, "nope/method"), session, 200, -32601),
        (request(1, "tools/call", name=5), session, 200, -32602),
        (request(1, "tools/call", name="nope"), session, 200, -32602),
        (request(1, "tools/call", name="eval", arguments=[1]), session, 200, -32602),
        (request(1, "tools/list", cursor="x"), session, 200, -32602),
        (request(1, "initialize", protocolVersion=5), {}, 200, -32602),
        (request(1, "initialize", protocolVersion=LATEST_LEGACY, clientInfo="me"), {}, 200, -32602),
        ([request(1, "ping")], session, 400, -32600),  # batches are not part of 2025-11-25
        (request(1, "ping"), {}, 400, -32600),  # no session
        (request(1, "ping"), {"Mcp-Session-Id": "0" * 32}, 404, -32600),
        (request(1, "ping"), {**session, "MCP-Protocol-Version": "2025-06-18"}, 400, -32600),
    ]
    for body, headers, want_status, want_code in cases:
        raw = body if isinstance(body, bytes) else None
        status, answer, _ = await rpc(None if raw is not None else body, headers, raw=raw)
        assert (status, answer["error"]["code"]) == (want_status, want_code), (body, answer)
        assert answer["jsonrpc"] == "2.0" and isinstance(answer["error"]["message"], str)
    # nothing was broken: the session still answers
    assert (await rpc(request(9, "ping"), session))[1] == {"jsonrpc": "2.0", "id": 9, "result": {}}


async def test_resources_in_the_modern_era(rpc: Rpc, notebook: Path) -> None:
    """resources/* without a session (2026-07-28): server/discover names the capability; a read of a
    notebook and of one of its outputs (the image as a blob), with Mcp-Name mirroring the URI."""
    body, headers = modern_request(1, "server/discover")
    status, answer, _ = await rpc(body, headers)
    assert status == 200 and "resources" in answer["result"]["capabilities"], answer
    body, headers = modern_request(2, "resources/list")
    status, answer, _ = await rpc(body, headers)
    assert status == 200 and [r["name"] for r in answer["result"]["resources"]] == ["nb.ipynb"], answer
    assert answer["result"]["resultType"] == "complete"
    uri = "jupyter://notebooks/nb.ipynb/cells/c1/outputs/1"
    body, headers = modern_request(3, "resources/read", uri=uri)
    status, answer, _ = await rpc(body, {**headers, "Mcp-Name": uri})
    assert status == 200, answer
    blobs = {c["mimeType"]: c for c in answer["result"]["contents"]}
    assert blobs["image/png"]["blob"] == PNG and blobs["image/png"]["uri"] == uri
    DenyOne.denied = {("read", "contents")}
    body, headers = modern_request(4, "resources/list")
    status, answer, _ = await rpc(body, headers)
    assert "Permission denied" in answer["error"]["message"], answer


async def test_modern_header_rules(rpc) -> None:
    body, headers = modern_request(1, "tools/call", name="session_list", arguments={})
    cases: list[tuple[dict[str, Any], dict[str, str], int, int]] = [
        (body, {k: v for k, v in headers.items() if k != "MCP-Protocol-Version"}, 400, -32020),
        (body, {**headers, "Mcp-Method": "tools/list"}, 400, -32020),
        (body, {**headers, "Mcp-Name": "eval"}, 400, -32020),
        (body, {k: v for k, v in headers.items() if k != "Mcp-Name"}, 400, -32020),
        (body, {**headers, "MCP-Protocol-Version": "2099-01-01"}, 400, -32020),
        (
            modern_request(1, "tools/list", _meta={"io.modelcontextprotocol/protocolVersion": "2099-01-01"})[
                0
            ],
            {"MCP-Protocol-Version": "2099-01-01", "Mcp-Method": "tools/list"},
            400,
            -32022,
        ),
        (request(1, "tools/list"), {"MCP-Protocol-Version": MODERN, "Mcp-Method": "tools/list"}, 400, -32602),
        (modern_request(1, "ping")[0], modern_request(1, "ping")[1], 404, -32601),
        (modern_request(1, "prompts/list")[0], modern_request(1, "prompts/list")[1], 404, -32601),
        (
            {**body, "params": {**body["params"], "name": "nope"}},
            {**headers, "Mcp-Name": "nope"},
            400,
            -32602,
        ),
    ]
    for sent, sent_headers, want_status, want_code in cases:
        status, answer, _ = await rpc(sent, sent_headers)
        assert (status, answer["error"]["code"]) == (want_status, want_code), (sent, sent_headers, answer)
        if want_code == -32022:
            assert answer["error"]["data"]["supported"][0] == MODERN
    # a name outside plain ASCII travels base64-encoded in Mcp-Name
    encoded = "=?base64?" + base64.b64encode(b"session_list").decode() + "?="
    status, answer, _ = await rpc(body, {**headers, "Mcp-Name": encoded})
    assert status == 200 and not answer["result"]["isError"]
    # notifications are accepted and dropped; a GET has no stream; a DELETE needs a session
    cancelled = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1}}
    assert (await rpc(cancelled, {"MCP-Protocol-Version": MODERN}))[0] == 202
    status, answer, response_headers = await rpc(None, method="GET")
    assert status == 405 and response_headers["allow"] == "POST, DELETE" and answer["error"]["code"] == -32600
    status, answer, _ = await rpc(None, method="DELETE")
    assert status == 400 and answer["error"]["code"] == -32600


async def test_batches_in_a_2025_03_26_session(rpc) -> None:
    session = await open_session(rpc, "2025-03-26")
    batch = [
        request(1, "ping"),
        {"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progressToken": 1, "progress": 1}},
        request(2, "tools/call", name="session_list", arguments={}),
        {"jsonrpc": "2.0", "id": 3},  # neither request nor response
        request(4, "initialize", protocolVersion="2025-03-26"),
        request(5, "nope"),
    ]
    status, answer, _ = await rpc(batch, session)
    assert status == 200
    assert [(r["id"], "result" in r, r.get("error", {}).get("code")) for r in answer] == [
        (1, True, None),
        (2, True, None),
        (3, False, -32600),
        (4, False, -32600),
        (5, False, -32601),
    ]
    assert answer[1]["result"]["content"][0]["text"] == "No eval sessions."
    only_notifications = [{"jsonrpc": "2.0", "method": "notifications/initialized"}]
    assert (await rpc(only_notifications, session))[0] == 202


async def test_sse_only_when_progress_or_long_and_accepted(rpc) -> None:
    session = await open_session(rpc)
    quick = request(1, "tools/call", name="session_list", arguments={})
    quick["params"]["_meta"] = {"progressToken": "q"}
    status, answer, headers = await rpc(quick, session)  # nothing to report before the answer: JSON
    assert status == 200 and headers["content-type"].startswith("application/json")
    assert answer["result"]["content"][0]["text"] == "No eval sessions."
    # no progress token, but longer than the heartbeat interval (0.3 s): SSE with keep-alive comments
    slow = request(
        2, "tools/call", name="eval", arguments={"cells": [{"code": "import time; time.sleep(1.5)"}]}
    )
    status, events, headers = await rpc(slow, session)
    assert headers["content-type"] == "text/event-stream" and headers["x-accel-buffering"] == "no"
    assert events[0] is None and events[-1]["id"] == 2 and "result" in events[-1]
    # a client that does not accept SSE gets the JSON answer when it is ready
    status, answer, headers = await rpc({**slow, "id": 3}, {**session, "Accept": "application/json"})
    assert headers["content-type"].startswith("application/json") and answer["id"] == 3
    # with a progress token: progress notifications, valid for the protocol version, then the response
    slow["params"]["_meta"] = {"progressToken": "tok"}
    slow["params"]["arguments"] = {"cells": [{"code": "print('a', flush=True)\nimport time; time.sleep(1)"}]}
    status, events, _ = await rpc({**slow, "id": 4}, session)
    notifications = [e for e in events if e is not None and "method" in e]
    for event in notifications:
        wire.parse_server_notification(event["method"], LATEST_LEGACY, event["params"])
        assert event["params"]["progressToken"] == "tok"
    assert [n["params"]["message"] for n in notifications if "message" in n["params"]] == ["a\n"]
    assert events[-1]["id"] == 4


# ------------------------------------------------------------------------------ pure core, docs, deps


def test_progress_is_coalesced_and_bounded() -> None:
    from jupyter_agent_tools.mcp.server import MAX_PROGRESS_CHARS, _Progress

    progress = _Progress("t")
    chunks = [f"{i:07d}\n" for i in range(20_000)]  # 160 000 characters, faster than anyone reads them
    for chunk in chunks:
        progress.push(chunk)
    params = progress.take()["params"]
    head, _, tail = params["message"].partition("\n")
    assert head == f"[... {160_000 - MAX_PROGRESS_CHARS} characters not shown here]"
    assert tail == "".join(chunks)[-MAX_PROGRESS_CHARS:] and params["progress"] == 1
    assert progress.parts == [] and not progress.ready.is_set()
    progress.push("x")
    assert progress.take()["params"] == {"progressToken": "t", "progress": 2, "message": "x"}
    silent = _Progress(None)  # no token: nothing is kept, heartbeats are SSE comments
    silent.push("x")
    assert silent.parts == [] and silent.heartbeat() is None


async def test_legacy_sessions_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    from jupyter_agent_tools.mcp import server as core

    monkeypatch.setattr(core, "MAX_SESSIONS", 3)

    async def allow(action: str, resource: str) -> bool:
        return True

    mcp = core.McpServer(
        services=None,  # type: ignore[arg-type]  # no tool is called here
        heartbeat_interval=5.0,
        max_batch_items=100,
        max_batch_answer_bytes=1024 * 1024,
        max_sessions_per_identity=100,
    )
    ids = []
    for i in range(4):
        answer = await mcp.post(
            request(i, "initialize", protocolVersion=LATEST_LEGACY), core.HttpRequest({}, "me", allow)
        )
        ids.append(answer.headers["Mcp-Session-Id"])
    statuses = []
    for sid in ids:
        answer = await mcp.post(request(9, "ping"), core.HttpRequest({"mcp-session-id": [sid]}, "me", allow))
        statuses.append(answer.status)
    assert statuses == [404, 200, 200, 200]  # the least recently used went first
    other = await mcp.post(request(9, "ping"), core.HttpRequest({"mcp-session-id": [ids[-1]]}, "you", allow))
    assert other.status == 404


def test_docs_cover_the_endpoint_and_every_tool() -> None:
    docs = Path(__file__).resolve().parent.parent / "docs"
    guide = (docs / "mcp.md").read_text()
    for tool in TOOLS:
        assert f"`{tool.name}`" in guide, tool.name
    for version in (*LEGACY_VERSIONS, *MODERN_VERSIONS):
        assert version in guide, version
    assert "/api/agent/mcp" in (docs / "api.md").read_text()


async def test_the_python_example_of_the_mcp_guide_runs_as_written(url, jp_auth_header) -> None:
    """docs/mcp.md's Python SDK example, run as a user pastes it, with only the variables the export
    line of `dev.py serve` sets (JUPYTER_AGENT_URL, JUPYTER_AGENT_TOKEN): it printed a KeyError when it read
    JUPYTER_TOKEN."""
    import os
    import re
    import sys

    guide = (Path(__file__).resolve().parent.parent / "docs" / "mcp.md").read_text()
    example = re.search(r"\*\*Python SDK\*\*.*?```python\n(.*?)```", guide, re.S)
    assert example is not None
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER_TOKEN", "JUPYTER_AGENT"))}
    env["JUPYTER_AGENT_URL"] = url.removesuffix("/api/agent/mcp")  # as printed: no trailing slash
    env["JUPYTER_AGENT_TOKEN"] = jp_auth_header["Authorization"].removeprefix("token ")
    done = await anyio.run_process([sys.executable, "-c", example.group(1)], env=env, check=False)
    assert (done.returncode, done.stdout.decode().strip()) == (0, "42"), done.stderr.decode()[-2000:]


async def test_the_codex_configuration_of_the_guide_connects(url, jp_auth_header) -> None:
    """docs/mcp.md's Codex table, read as Codex reads it (TOML: url, and the token from the variable that
    bearer_token_env_var names, sent as Authorization: Bearer), reaches the server's tools."""
    import re

    import tomllib
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    guide = (Path(__file__).resolve().parent.parent / "docs" / "mcp.md").read_text()
    table = re.search(r"\*\*Codex\*\*.*?```toml\n(.*?)```", guide, re.S)
    assert table is not None
    server = tomllib.loads(table.group(1))["mcp_servers"]["jupyter"]
    assert set(server) == {"url", "bearer_token_env_var"}
    assert server["url"] == "http://127.0.0.1:8888/api/agent/mcp"  # the address dev.py serve prints
    env = {server["bearer_token_env_var"]: jp_auth_header["Authorization"].removeprefix("token ")}
    headers = {"Authorization": f"Bearer {env[server['bearer_token_env_var']]}"}
    endpoint = server["url"].replace("http://127.0.0.1:8888/api/agent/mcp", url)  # this test's server
    async with (
        create_mcp_http_client(headers=headers) as http,
        streamable_http_client(endpoint, http_client=http) as (read, write, *_),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        tools = await session.list_tools()
    assert "eval" in {tool.name for tool in tools.tools}


def test_the_server_never_imports_an_mcp_sdk_or_pydantic() -> None:
    """The endpoint is plain JSON (docs/mcp.md, "Dependencies"): nothing heavy loads into the server."""
    import os
    import subprocess
    import sys

    from jupyter_agent_tools.testing.server import PACKAGE_PARENT

    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(PACKAGE_PARENT), os.environ.get("PYTHONPATH")])),
    }
    code = (
        "import sys, jupyter_agent_tools.app, jupyter_agent_tools.handlers.mcp\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('mcp', 'mcp_types', 'pydantic', "
        "'starlette', 'uvicorn')))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


async def test_notebook_edit_takes_upgrade_and_repair(rpc: Rpc, jp_root_dir: Path) -> None:
    fixtures = Path(__file__).parent / "fixtures" / "notebooks"
    (jp_root_dir / "old.ipynb").write_bytes((fixtures / "v3_book.ipynb").read_bytes())
    (jp_root_dir / "stray.ipynb").write_bytes((fixtures / "stray_ids_44.ipynb").read_bytes())
    session = await open_session(rpc)
    edit = {"action": "edit", "cell_index": 2, "content": "x"}

    async def call(rid: int, arguments: dict[str, Any]) -> dict[str, Any]:
        status, answer, _ = await rpc(
            request(rid, "tools/call", name="notebook_edit", arguments=arguments), session
        )
        assert status == 200
        result: dict[str, Any] = answer["result"]
        return result

    status, answer, _ = await rpc(
        request(9, "tools/call", name="notebook_read", arguments={"path": "stray.ipynb"}), session
    )
    assert status == 200
    text = answer["result"]["content"][0]["text"]
    assert "# invalid as found (an edit must send repair: true): cells 1 and 3 have an 'id'" in text
    refused = await call(1, {"path": "old.ipynb", **edit})
    assert refused["isError"] and '"upgrade": true' in refused["content"][0]["text"]
    upgraded = await call(2, {"path": "old.ipynb", **edit, "upgrade": True})
    assert not upgraded.get("isError"), upgraded
    assert upgraded["structuredContent"]["upgraded_from"] == "3.0"
    assert "Upgraded the file from nbformat 3.0 to 4.5." in upgraded["content"][0]["text"]
    repaired = await call(3, {"path": "stray.ipynb", **edit, "repair": True})
    assert not repaired.get("isError"), repaired
    assert "repaired: cell 1: removed 'id' 'load-data' (not allowed in 4.4)" in repaired["content"][0]["text"]
    assert len(repaired["structuredContent"]["repairs"]) == 2


# ------------------------------------------------------------------------------ reading for a model


async def test_notebook_read_pages_and_one_output_with_its_image(url, jp_auth_header, notebook, api) -> None:
    async with legacy(url, jp_auth_header) as session:
        page = await session.call_tool("notebook_read", {"path": "nb.ipynb", "start": 1, "limit": 1})
        assert not page.is_error, text_of(page)
        assert page.structured_content["cell_count"] == 2
        assert [c["index"] for c in page.structured_content["cells"]] == [1]
        shown = text_of(page)
        assert "# cells 1-1 of 2\n" in shown and "### [1] code id=c1 exec=1\nprint(1)" in shown
        assert '# one output in full: notebook_output_read {"path": "nb.ipynb", "cell": ' in shown
        named = await session.call_tool("notebook_read", {"path": "nb.ipynb", "cell_ids": ["@1", "m0"]})
        assert [c["index"] for c in named.structured_content["cells"]] == [1, 0]
        bad = await session.call_tool("notebook_read", {"path": "nb.ipynb", "cell_ids": "m0"})
        assert bad.is_error and "'cell_ids' must be an array" in text_of(bad)
        missing = await session.call_tool("notebook_read", {"path": "nb.ipynb", "cell_ids": ["zz"]})
        assert missing.is_error and "No cell with id 'zz'" in text_of(missing)

        figure = await session.call_tool(
            "notebook_output_read", {"path": "nb.ipynb", "cell": "c1", "output": 1}
        )
        assert not figure.is_error, text_of(figure)
        assert [(b.type, getattr(b, "data", None)) for b in figure.content[1:]] == [("image", PNG)]
        assert "attached as image 1" in text_of(figure) and "[text/plain, 5 bytes]\n<img>" in text_of(figure)
        structured = figure.structured_content
        assert structured["output"]["data"] == {
            "text/plain": "<img>"
        }  # never base64 in the structured answer
        status, route = await api("GET", "notebooks", "nb.ipynb", "cells", "c1", "outputs", "1")
        assert status == 200 and {**route, "output": structured["output"]} == structured
        stream = await session.call_tool(
            "notebook_output_read", {"path": "nb.ipynb", "cell": "@1", "output": 0}
        )
        assert text_of(stream).endswith("[text/plain, 2 bytes]\n1") and len(stream.content) == 1
        gone = await session.call_tool(
            "notebook_output_read", {"path": "nb.ipynb", "cell": "c1", "output": 5}
        )
        assert gone.is_error and "there is no output 5" in text_of(gone)


async def test_notebook_read_text_names_the_tool_that_reads_one_output(
    url, jp_auth_header, jp_root_dir
) -> None:
    """Over MCP the text says how to call notebook_output_read (with which arguments), not an HTTP route."""
    long = "".join(f"line {i}\n" for i in range(5000))
    cell = new_code_cell("x", id="c1", outputs=[new_output("stream", name="stdout", text=long)])
    nbformat.write(new_notebook(cells=[cell]), str(jp_root_dir / "long.ipynb"))
    async with legacy(url, jp_auth_header) as session:
        shown = text_of(await session.call_tool("notebook_read", {"path": "long.ipynb"}))
        header = shown.splitlines()[2]
        assert header == (
            '# one output in full: notebook_output_read {"path": "long.ipynb", "cell": "<id or @index>", '
            '"output": <n>}'
        )
        assert '\n[full: notebook_output_read {"cell": "c1", "output": 0}]\n' in shown
        assert "GET " not in shown and "/api/agent/" not in shown and "?mime=" not in shown
        arguments = {"path": "long.ipynb", "cell": "c1", "output": 0}
        full = await session.call_tool("notebook_output_read", arguments)
        assert text_of(full).endswith("\nline 4999")


async def test_tool_calls_are_audited_with_the_requests_user(rpc, agent_audit_events, notebook) -> None:
    """The user a tool call's audit events name is the one jupyter_server resolved for that request."""
    session = await open_session(rpc)
    body = request(1, "tools/call", name="eval", arguments={"cells": [{"code": "1 + 1"}], "session": "m"})
    status, answer, _ = await rpc(body, session)
    assert status == 200, answer
    edit = {"path": "nb.ipynb", "ops": [{"action": "insert", "cell_index": 0, "content": "y = 2"}]}
    status, answer, _ = await rpc(request(2, "tools/call", name="notebook_edit", arguments=edit), session)
    assert status == 200, answer
    (run,) = agent_audit_events("execution")
    (change,) = agent_audit_events("notebook_change")
    (created,) = [e for e in agent_audit_events("session") if e["action"] == "created"]
    assert run["status"] == "ok" and run["session"] == "m"
    assert change["actions"] == ["insert"] and change["path"] == "nb.ipynb"
    for event in (run, change, created):
        assert isinstance(event["user"], str) and event["user"]

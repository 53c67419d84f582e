"""The published API contract: a valid OpenAPI 3.1 document, served as packaged, covering every route,
agreeing with the request parsers, and describing the answers real calls get (real server, real kernels).
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import nbformat
import pytest
from contract import JSON, NDJSON, Contract
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output
from tornado.httpclient import HTTPClientError

from jupyter_agent_tools.api_document import openapi_document, operations
from jupyter_agent_tools.errors import BadRequest
from jupyter_agent_tools.execution.request import parse_eval_request
from jupyter_agent_tools.handlers.openapi import UnknownRouteHandler
from jupyter_agent_tools.notebook.create import parse_create_request
from jupyter_agent_tools.notebook.operations import parse_edit_request
from jupyter_agent_tools.schemas import SCHEMAS, is_create_request, notebook_request_schema
from jupyter_agent_tools.validation import first_error

pytestmark = pytest.mark.timeout(240)
REPO = Path(__file__).resolve().parent.parent
NB = "/api/agent/notebooks/{path}"
EVAL = "/api/agent/eval"
DOC = openapi_document()
CONTRACT = Contract(DOC)
from samples import PNG_1PX as PNG  # noqa: E402


@pytest.fixture
def jp_server_config() -> dict[str, Any]:
    return {
        "ServerApp": {"jpserver_extensions": {"jupyter_agent_tools": True}},
        "AgentToolsApp": {"max_body_bytes": 64 * 1024, "stream_heartbeat_interval": 0.2},
        "EvalSessionManager": {"max_sessions": 2},
        "CellExecutor": {"max_output_bytes": 1024},
    }


# ------------------------------------------------------------------------------------- the document


def test_document_is_valid_openapi_3_1() -> None:
    from openapi_spec_validator import OpenAPIV31SpecValidator

    errors = [str(e.message) for e in OpenAPIV31SpecValidator(DOC).iter_errors()]
    assert errors == []
    assert DOC["openapi"].startswith("3.1")


def test_every_schema_is_valid_json_schema_2020_12() -> None:
    from jsonschema import Draft202012Validator

    invalid = {}
    for name, schema in DOC["components"]["schemas"].items():
        errors = list(Draft202012Validator(Draft202012Validator.META_SCHEMA).iter_errors(schema))
        if errors:
            invalid[name] = [e.message for e in errors]
    assert invalid == {}


def test_every_error_answer_is_the_error_shape_and_403_is_everywhere() -> None:
    for method, path, op in operations(DOC):
        statuses = set(op["responses"])
        assert "403" in statuses, (method, path)
        for status, response in op["responses"].items():
            if int(status) >= 400:
                assert response["content"] == {JSON: {"schema": {"$ref": "#/components/schemas/Error"}}}, (
                    method,
                    path,
                    status,
                )
        if "requestBody" in op:
            assert {"400", "413"} <= statuses, (method, path)


async def test_served_document_equals_packaged(api, jp_serverapp) -> None:
    status, served = await api("GET", "openapi.json")
    assert status == 200
    assert served == openapi_document(jp_serverapp.base_url)
    assert served["servers"][0]["url"] == jp_serverapp.base_url
    served["servers"][0]["url"] = "/"
    assert served == DOC


def _example_url(path: str) -> str:
    for name, value in (("{path}", "dir/nb.ipynb"), ("{name}", "s1"), ("{artifact_id}", "a.b")):
        path = path.replace(name, value)
    return path.replace("{cell}", "c1").replace("{n}", "0")


# The MCP endpoint speaks JSON-RPC (MCP's Streamable HTTP transport): its contract is MCP's own (the
# tools/list answer, checked by tests/test_mcp.py against the SDK's wire types), not this document, and
# the OpenAPI fuzzer has nothing to generate for it.
NOT_IN_OPENAPI = {r"/api/agent/mcp"}
# OAuth sign-in (form-encoded, defined by RFC 6749, 7009, 7591; docs/api.md lists them): see test_oauth
OAUTH_ROUTES = "/api/agent/oauth/"


def test_every_route_and_method_is_documented(jp_serverapp) -> None:
    """Each handler of the extension matches exactly the documented paths, with the same methods (but the
    last one, which answers a JSON 404 for every other path under /api/agent)."""
    app = jp_serverapp.web_app.settings["jupyter_agent_tools"]
    documented: dict[str, set[str]] = {}
    for method, path, _op in operations(DOC):
        documented.setdefault(path, set()).add(method)
    *every, (last_pattern, last_handler) = app.handlers
    # MCP: JSON-RPC, see test_mcp; jupyter_server's own routes (served by subclasses) are in its own spec
    routes = [
        (p, h)
        for p, h, *_ in every
        if p not in NOT_IN_OPENAPI and p.startswith("/api/agent") and not p.startswith(OAUTH_ROUTES)
    ]
    assert last_handler is UnknownRouteHandler
    assert all(re.fullmatch(last_pattern, _example_url(p)) for p in documented)
    served: dict[int, str] = {}
    for path, documented_methods in documented.items():
        # Tornado serves a URL with the first route that matches it, as here.
        first = next(i for i, (pattern, _) in enumerate(routes) if re.fullmatch(pattern, _example_url(path)))
        handler = routes[first][1]
        methods = {
            m.upper()
            for m in ("get", "post", "put", "patch", "delete")
            if any(
                m in vars(klass) for klass in handler.__mro__ if klass.__module__.startswith("jupyter_agent")
            )
        }
        assert documented_methods == methods, (path, documented_methods, methods)
        assert first not in served, (path, served[first])  # one route, one documented path
        served[first] = path
    assert sorted(served) == list(range(len(routes)))  # every route is documented


def test_discriminated_branches_pin_the_discriminator() -> None:
    """validation._one_of checks only the branch a discriminator names: right only if no other can match."""
    for name, schema in SCHEMAS.items():
        if "discriminator" not in schema:
            continue
        prop, mapping = schema["discriminator"]["propertyName"], schema["discriminator"]["mapping"]
        assert sorted(ref["$ref"] for ref in schema["oneOf"]) == sorted(mapping.values()), name
        for value, target in mapping.items():
            branch = SCHEMAS[target.rsplit("/", 1)[1]]
            assert branch["type"] == "object" and prop in branch["required"], (name, value)
            assert branch["properties"][prop] == {"const": value}, (name, value)


def test_api_reference_covers_the_document() -> None:
    """docs/api.md is checked against the document: operations, request fields, statuses, events."""
    text = (REPO / "docs" / "api.md").read_text()
    sections = re.split(r"\n(?=## )", text)
    for method, path, op in operations(DOC):
        heading = f"`{method} {path.replace('{artifact_id}', '{id}')}`"
        section = next((s for s in sections if s.startswith("## ") and heading in s.splitlines()[0]), None)
        assert section is not None, f"docs/api.md has no '## ...{heading}' section"
        for status in op["responses"]:
            assert re.search(rf"\b{status}\b", section), f"{heading}: status {status} not in docs/api.md"
        if "requestBody" in op:
            for field in _request_fields(op["requestBody"]["content"][JSON]["schema"]):
                assert f"`{field}`" in section, f"{heading}: request field {field!r} not in docs/api.md"
    for name, schema in SCHEMAS.items():
        if name.endswith("Event"):
            kind = schema.get("properties", {}).get("type", {}).get("const")
            if kind:
                assert f"`{kind}`" in text, f"event {kind!r} not in docs/api.md"


def _request_fields(schema: dict[str, Any], seen: set[str] | None = None) -> set[str]:
    seen = set() if seen is None else seen
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[1]
        if name in seen:
            return set()
        seen.add(name)
        schema = SCHEMAS[name]
    fields: set[str] = set()
    for sub in schema.get("oneOf", []) + schema.get("anyOf", []):
        fields |= _request_fields(sub, seen)
    for field, sub in schema.get("properties", {}).items():
        fields.add(field)
        fields |= _request_fields(sub, seen)
    if isinstance(schema.get("items"), dict):
        fields |= _request_fields(schema["items"], seen)
    return fields


# ------------------------------------------------------- one source of truth: schema == parser


def _accepts(parse: Any, body: Any) -> bool:
    try:
        parse(body)
    except BadRequest:
        return False
    return True


def parse_notebook_body(body: Any) -> Any:
    if is_create_request(body):  # the route's dispatch: {"action": "create"} creates the notebook
        return parse_create_request(body, max_cells=10**6)
    return parse_edit_request(body, max_ops=10**6)


def parse_eval_body(body: Any) -> Any:
    return parse_eval_request(body, max_cells=10**6)


VALID_NOTEBOOK_BODIES = [
    {"action": "edit", "cell_index": 0, "content": "x"},
    {"action": "edit", "cell_id": "a", "content": "", "cell_type": "markdown", "expected_hash": "h"},
    {"action": "insert", "content": "x"},
    {"action": "insert", "cell_index": 2, "cell_id": "new-1", "content": "x", "cell_type": "raw"},
    {"action": "delete", "cell_index": 3},
    {"action": "delete", "cell_id": "b", "cell_index": 1},
    {"action": "move", "cell_index": 0, "to_index": 2},
    {"action": "move", "cell_id": "c", "to_index": 0, "expected_hash": ""},
    {"ops": [{"action": "insert", "content": "x"}, {"action": "delete", "cell_index": 0}]},
    {"ops": [{"action": "move", "cell_id": "q", "to_index": 1}], "expected_hash": "h"},
    {"action": "replace", "cell_index": 0, "old": "a", "new": ""},
    {"action": "replace", "cell_id": "c", "old": "a", "new": "b", "all": True, "expected_hash": "h"},
    {"ops": [{"action": "replace", "cell_id": "q", "old": "x", "new": "y", "all": False}]},
    {"action": "create"},
    {
        "action": "create",
        "cells": [{"source": "1"}, {"cell_type": "markdown", "source": ""}],
        "parents": True,
    },
    {"action": "create", "kernel_name": "python3", "parents": False, "cells": []},
]
VALID_EVAL_BODIES = [
    {"cells": [{"code": "1"}]},
    {
        "cells": [{"code": "1", "title": "t"}, {"code": "", "title": None}],
        "session": "a.b-c_d",
        "mode": "per-call",
        "reset": True,
        "timeout": 0.5,
        "cwd": "sub/dir",
        "env": {"A_1": "x", "_B": ""},
        "session_file": "/tmp/s.jsonl",
        "kernel_name": "python3",
    },
    {"cells": [{"code": "1"}], "cwd": None, "env": None, "session_file": None, "kernel_name": None},
]
FIELD_POOL = [
    "action",
    "cell_index",
    "cell_id",
    "content",
    "cell_type",
    "to_index",
    "expected_hash",
    "ops",
    "cells",
    "code",
    "title",
    "session",
    "mode",
    "reset",
    "timeout",
    "cwd",
    "env",
    "session_file",
    "kernel_name",
    "old",
    "new",
    "all",
    "parents",
    "source",
    "colour",
]
VALUE_POOL = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    st.sampled_from([1.5, -0.25]),  # integral floats (1.0) are the one documented deviation
    st.sampled_from([10**400, -(10**400), float("inf"), float("-inf")]),  # JSON numbers have no bound
    st.sampled_from(["", "x", "edit", "insert", "delete", "move", "code", "raw", "a b", "s", "per-call"]),
    st.sampled_from(["replace", "create", "markdown"]),
    st.sampled_from(["\x00", "A\x00", "python3", "..", "a" * 65]),
    st.lists(st.integers(0, 2), max_size=2),
    st.sampled_from([{}, {"A": "x"}, {"code": "1"}, {"action": "insert", "content": "x"}, {"1A": "x"}]),
).map(copy.deepcopy)


@st.composite
def mutated(draw: Any, seeds: list[Any]) -> Any:
    """A valid body with a few random changes: a field removed, added, or given another value."""
    body = json.loads(json.dumps(draw(st.sampled_from(seeds))))
    for _ in range(draw(st.integers(1, 3))):
        # descend to a random object inside the body (the body, an op, a cell, env)
        target = body
        while True:
            children = [
                v
                for v in (target.values() if isinstance(target, dict) else target)
                if isinstance(v, dict | list)
            ]
            if not children or draw(st.booleans()):
                break
            target = draw(st.sampled_from(children))
        kind = draw(st.sampled_from(["remove", "add", "replace", "whole"]))
        if kind == "whole":
            return draw(VALUE_POOL) if draw(st.booleans()) else body
        if isinstance(target, list):
            if kind == "remove" and target:
                target.pop(draw(st.integers(0, len(target) - 1)))
            else:
                target.append(draw(VALUE_POOL))
        elif kind == "remove" and target:
            target.pop(draw(st.sampled_from(sorted(target))))
        elif kind == "add" or not target:
            target[draw(st.sampled_from(FIELD_POOL))] = draw(VALUE_POOL)
        else:
            target[draw(st.sampled_from(sorted(target)))] = draw(VALUE_POOL)
    return body


@settings(max_examples=600, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(body=mutated(VALID_NOTEBOOK_BODIES))
def test_notebook_parser_accepts_exactly_the_schema_valid_bodies(body: Any) -> None:
    valid = CONTRACT.request_valid("POST", NB, body)
    assert _accepts(parse_notebook_body, body) == valid, body
    if not valid:
        assert first_error(notebook_request_schema(body), body)


@settings(max_examples=600, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(body=mutated(VALID_EVAL_BODIES))
def test_eval_parser_accepts_exactly_the_schema_valid_bodies(body: Any) -> None:
    assert _accepts(parse_eval_body, body) == CONTRACT.request_valid("POST", EVAL, body), body


def test_seed_bodies_are_valid_and_accepted() -> None:
    for body in VALID_NOTEBOOK_BODIES:
        assert CONTRACT.request_valid("POST", NB, body) and _accepts(parse_notebook_body, body), body
    for body in VALID_EVAL_BODIES:
        assert CONTRACT.request_valid("POST", EVAL, body) and _accepts(parse_eval_body, body), body


def test_route_error_cases_are_schema_invalid_or_semantic() -> None:
    """The bad bodies of the route tests: schema-invalid ones are exactly those the parser refuses."""
    from test_notebook_routes import ERROR_CASES

    for body, message in ERROR_CASES:
        valid = CONTRACT.request_valid("POST", NB, body)
        assert _accepts(parse_notebook_body, body) == valid, (body, message)


def test_integral_floats_are_refused_as_documented() -> None:
    body = {"action": "delete", "cell_index": 1.0}
    assert "not 1.0" in DOC["info"]["description"].replace("`", "")
    with pytest.raises(BadRequest, match="'cell_index' must be an integer, got float"):
        parse_notebook_body(body)


# -------------------------------------------------------------------- real answers conform


def _notebook() -> nbformat.NotebookNode:
    nb = new_notebook(
        cells=[
            new_markdown_cell("# T", id="m0"),
            new_code_cell(
                "print(1)",
                id="c1",
                execution_count=1,
                outputs=[
                    new_output("stream", name="stdout", text="1\n"),
                    new_output("display_data", data={"image/png": PNG, "text/plain": "<img>"}),
                    new_output("execute_result", execution_count=1, data={"text/html": "<b>x</b>"}),
                    new_output("error", ename="E", evalue="v", traceback=["\x1b[31mE\x1b[0m: v"]),
                ],
            ),
        ]
    )
    nb.nbformat_minor = 5
    return nb


async def test_notebook_answers_conform(api, jp_root_dir) -> None:
    nbformat.write(_notebook(), str(jp_root_dir / "c.ipynb"))
    nbformat.write(nbformat.v4.new_notebook(), str(jp_root_dir / "old.ipynb"))

    async def call(method: str, body: Any = None, path: str = "c.ipynb", **kw: Any) -> tuple[int, Any]:
        status, answer = await api(method, "notebooks", path, body=body, **kw)
        CONTRACT.assert_response(method, NB, status, answer)
        return status, answer

    status, read = await call("GET")
    url = "/api/agent/notebooks/c.ipynb/cells/c1/outputs/1?mime=image/png"
    assert read["cells"][1]["outputs"][1]["data"] == [{"mime": "image/png", "bytes": 70, "url": url}]
    assert status == 200 and read["cell_count"] == 2
    status, _ = await call("GET", params={"include_binary": "true"})
    assert status == 200
    params = {"include": "tags,metadata,attachments", "start": "1", "limit": "1", "include_binary": "1"}
    status, page = await call("GET", params=params)
    assert status == 200 and page["next_start"] is None and page["cells"][0]["tags"] == []
    status, named = await call("GET", params={"cell_ids": "c1"})
    assert status == 200 and named["start"] is None
    for params in ({"start": "-1"}, {"cell_ids": "nope"}, {"include": "x"}):
        assert (await call("GET", params=params))[0] in (400, 404)
    out = f"{NB}/cells/{{cell}}/outputs/{{n}}"
    cases = (("c1", "1", 200), ("@1", "0", 200), ("c1", "9", 404), ("c1", "-1", 400), ("x", "0", 404))
    for cell, n, want in cases:
        status, answer = await api("GET", "notebooks", "c.ipynb", "cells", cell, "outputs", n)
        assert status == want, answer
        CONTRACT.assert_response("GET", out, status, answer)
        if status == 200:
            assert list(CONTRACT.component("NotebookOutput").iter_errors(answer)) == []
    for body in [
        {"action": "insert", "content": "a\nb", "cell_type": "markdown"},
        {"action": "edit", "cell_id": "c1", "content": "x", "cell_type": "raw"},
        {"action": "move", "cell_index": 0, "to_index": 1},
        {"ops": [{"action": "insert", "content": "y"}, {"action": "delete", "cell_index": 0}]},
    ]:
        status, answer = await call("POST", body)
        assert status == 200, answer
    expected = {
        400: [{"action": "delete", "cell_index": 99}, {"action": "nope"}],
        404: [{"action": "insert", "content": "x"}],
        409: [{"action": "insert", "content": "x", "expected_hash": "0"}],
        413: [{"action": "insert", "content": "x" * 70000}],
    }
    for want, bodies in expected.items():
        for body in bodies:
            path = "missing.ipynb" if want == 404 else "c.ipynb"
            status, answer = await call("POST", body, path=path)
            assert status == want, answer
    assert (await call("GET", path="c.txt"))[0] == 400
    assert (await call("GET", path="nope.ipynb"))[0] == 404


async def test_eval_answers_conform(api, jp_fetch) -> None:
    code = (
        "from IPython.display import JSON, Image, display, publish_display_data\n"
        "import base64\n"
        f"display(Image(data=base64.b64decode('{PNG}')))\n"
        "display(JSON({'a': [1, 2]}))\n"
        "publish_display_data({'application/x-omp-status': {'event': 'step', 'n': 1}})\n"
        "print('x' * 3000)"
    )
    body = {"cells": [{"code": code, "title": "shows"}, {"code": "1/0"}], "session": "contract"}
    status, result = await api("POST", "eval", body=body)
    CONTRACT.assert_response("POST", EVAL, status, result)
    cell = result["cells"][0]
    assert [d["type"] for d in cell["displays"]] == ["image", "json", "status"]
    assert cell["truncated"] is True and cell["artifact_id"]
    assert result["cells"][1]["error"]["ename"] == "ZeroDivisionError"

    response = await jp_fetch("api", "agent", "artifacts", cell["artifact_id"])
    assert response.headers["Content-Type"].startswith("text/plain")
    CONTRACT.assert_response(
        "GET", "/api/agent/artifacts/{artifact_id}", 200, response.body.decode(), "text/plain"
    )
    whole = response.body
    assert response.headers["Accept-Ranges"] == "bytes"
    size = len(whole)
    for asked, first, last in (
        ("bytes=10-19", 10, 19),
        ("bytes=-5", size - 5, size - 1),
        ("bytes=20-", 20, size - 1),
    ):
        ranged = await jp_fetch("api", "agent", "artifacts", cell["artifact_id"], headers={"Range": asked})
        assert ranged.code == 206 and ranged.body == whole[first : last + 1], asked
        assert ranged.headers["Content-Range"] == f"bytes {first}-{last}/{size}", asked
        CONTRACT.assert_response(
            "GET", "/api/agent/artifacts/{artifact_id}", 206, ranged.body.decode(), "text/plain"
        )
    ignored = await jp_fetch(
        "api", "agent", "artifacts", cell["artifact_id"], headers={"Range": "bytes=0-1,5-6"}
    )
    assert ignored.code == 200 and ignored.body == whole
    with pytest.raises(HTTPClientError) as past:
        await jp_fetch(
            "api", "agent", "artifacts", cell["artifact_id"], headers={"Range": f"bytes={len(whole)}-"}
        )
    assert past.value.code == 416
    assert past.value.response.headers["Content-Range"] == f"bytes */{len(whole)}"
    assert "Range not satisfiable" in json.loads(past.value.response.body)["message"]
    CONTRACT.assert_response(
        "GET", "/api/agent/artifacts/{artifact_id}", 416, json.loads(past.value.response.body)
    )
    status, missing = await api("GET", "artifacts", "contract.0123")
    CONTRACT.assert_response("GET", "/api/agent/artifacts/{artifact_id}", status, missing)
    assert status == 404

    status, answer = await api("POST", "eval", body={"cells": [{"code": "input()"}], "session": "contract"})
    CONTRACT.assert_response("POST", EVAL, status, answer)
    assert answer["cells"][0]["stdin_requested"] is True
    status, answer = await api("POST", "eval", body={"cells": [{"code": "1"}], "mode": "per-call"})
    CONTRACT.assert_response("POST", EVAL, status, answer)
    assert answer["session"] is None and answer["mode"] == "per-call"
    for bad, want in (({"cells": []}, 400), ({"cells": [{"code": "1"}], "cwd": "nowhere"}, 400)):
        status, answer = await api("POST", "eval", body=bad)
        CONTRACT.assert_response("POST", EVAL, status, answer)
        assert status == want

    status, listing = await api("GET", "sessions")
    CONTRACT.assert_response("GET", "/api/agent/sessions", status, listing)
    assert [s["name"] for s in listing["sessions"]] == ["contract"]
    status, answer = await api("POST", "sessions", "contract", "interrupt", body={})
    CONTRACT.assert_response("POST", "/api/agent/sessions/{name}/interrupt", status, answer)
    assert status == 200 and answer["interrupted"] is False
    for method, parts, route in (
        ("DELETE", ("sessions", "contract"), "/api/agent/sessions/{name}"),
        ("DELETE", ("sessions", "contract"), "/api/agent/sessions/{name}"),
        ("POST", ("sessions", "nope", "interrupt"), "/api/agent/sessions/{name}/interrupt"),
        ("POST", ("sessions", "not a session!", "interrupt"), "/api/agent/sessions/{name}/interrupt"),
    ):
        status, answer = await api(method, *parts, body={} if method == "POST" else None)
        CONTRACT.assert_response(method, route, status, answer)
    assert status == 404


async def test_stream_events_conform(jp_fetch) -> None:
    lines: list[bytes] = []
    code = "import time\nprint('a', flush=True)\ntime.sleep(0.6)\nfrom IPython.display import JSON\nJSON([1])"
    response = await jp_fetch(
        "api",
        "agent",
        "eval",
        method="POST",
        body=json.dumps({"cells": [{"code": code}, {"code": "2"}], "session": "stream"}),
        headers={"Accept": NDJSON},
        streaming_callback=lines.append,
        request_timeout=120,
    )
    assert response.code == 200 and response.headers["Content-Type"] == NDJSON
    events = [json.loads(line) for line in b"".join(lines).splitlines()]
    for event in events:
        CONTRACT.assert_response("POST", EVAL, 200, event, NDJSON)
    kinds = {e["type"] for e in events}
    assert {"cell_start", "chunk", "heartbeat", "display", "cell_end", "result"} <= kinds
    assert events[-1]["type"] == "result"
    CONTRACT.assert_response("POST", EVAL, 200, events[-1]["result"])


async def test_restart_event_conforms(jp_fetch) -> None:
    lines: list[bytes] = []
    response = await jp_fetch(
        "api",
        "agent",
        "eval",
        method="POST",
        body=json.dumps({"cells": [{"code": "import os; os._exit(1)"}], "session": "dies"}),
        headers={"Accept": NDJSON},
        streaming_callback=lines.append,
        request_timeout=180,
    )
    assert response.code == 200
    events = [json.loads(line) for line in b"".join(lines).splitlines()]
    for event in events:
        CONTRACT.assert_response("POST", EVAL, 200, event, NDJSON)
    assert "restart" in {e["type"] for e in events}
    assert events[-1]["type"] == "result" and events[-1]["result"]["restarted"] is True

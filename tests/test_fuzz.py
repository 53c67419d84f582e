"""Property-based fuzzing of every route with schemathesis, against the document the server serves.

A real server subprocess with real kernels. For every operation, schema-valid (positive) and
schema-breaking (negative) requests are generated from the served OpenAPI document; every answer must be
no 5xx, a documented status with a documented content type, and match its documented schema. A request
with a body the schema refuses must be refused (4xx), and no request that was refused may change any
notebook (the bytes of every notebook under the root are compared before and after).

Bounded for CI: ``FUZZ_EXAMPLES`` (default 25) examples per operation and mode, no deadline per example.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
import pytest
import requests
from contract import Contract
from hypothesis import HealthCheck, given, settings
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output
from samples import PNG

schemathesis = pytest.importorskip("schemathesis")
from schemathesis import GenerationMode  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.core import NOT_SET  # noqa: E402
from schemathesis.specs.openapi.checks import (  # noqa: E402
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from jupyter_agent_tools.testing.server import Server, jupyter_server  # noqa: E402

pytestmark = pytest.mark.timeout(300)
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "25"))
TARGET = "fuzz/target.ipynb"
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("fuzz-root")
    (root / "fuzz").mkdir()
    (root / "work").mkdir()
    for name in (TARGET, "work/other.ipynb"):
        outputs = [
            new_output("stream", name="stdout", text="1\n"),
            new_output("display_data", data={"image/png": PNG, "text/html": "<b>x</b>", "text/plain": "x"}),
        ]
        code = new_code_cell("x = 1", id="c", execution_count=1, outputs=outputs)
        nb = new_notebook(cells=[new_markdown_cell("# t", id="m"), code])
        nb.nbformat_minor = 5
        nbformat.write(nb, str(root / name))
    (root / "fuzz" / "notes.txt").write_text("not a notebook")
    with jupyter_server(
        root,
        extra_args=[
            "--EvalSessionManager.max_sessions=2",
            "--AgentToolsApp.max_body_bytes=65536",
            "--CellExecutor.interrupt_grace=5",
            # agent tokens on, so the token routes are fuzzed for real
            "--ServerApp.identity_provider_class=jupyter_agent_tools.auth.AgentIdentityProvider",
            "--ServerApp.authorizer_class=jupyter_agent_tools.auth.AgentAuthorizer",
        ],
    ) as running:
        yield running


@pytest.fixture(scope="module")
def served(server: Server) -> tuple[Any, Contract, dict[str, str]]:
    auth = {"Authorization": f"token {server.token}"}
    doc = requests.get(server.url + "api/agent/openapi.json", headers=auth, timeout=30).json()
    return schemathesis.openapi.from_dict(doc), Contract(doc), auth


# The characters tornado.httputil refuses in a header value (a generated Range header may hold them).
NOT_HTTP = re.compile(r"[\x00-\x08\x0A-\x1F\x7F]")


def _notebooks(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*.ipynb"))
        if ".ipynb_checkpoints" not in p.parts
    }


OPERATIONS = [
    ("GET", "/api/agent/notebooks/{path}"),
    ("GET", "/api/agent/notebooks/{path}/cells/{cell}/outputs/{n}"),
    ("POST", "/api/agent/notebooks/{path}"),
    ("POST", "/api/agent/notebooks/{path}/run"),
    ("POST", "/api/agent/eval"),
    ("GET", "/api/agent/sessions"),
    ("DELETE", "/api/agent/sessions/{name}"),
    ("POST", "/api/agent/sessions/{name}/interrupt"),
    ("GET", "/api/agent/artifacts/{artifact_id}"),
    ("GET", "/api/agent/openapi.json"),
    ("GET", "/api/agent/tokens"),
    ("POST", "/api/agent/tokens"),
    ("DELETE", "/api/agent/tokens/{name}"),
    ("GET", "/api/agent/notebooks/{path}/changes"),
    ("GET", "/api/agent/notebooks/{path}/changes/{change_id}"),
    ("POST", "/api/agent/notebooks/{path}/changes/{change_id}/undo"),
    ("GET", "/api/agent/changes"),
    ("GET", "/api/agent/files"),
    ("GET", "/api/agent/runs"),
    ("GET", "/api/agent/runs/{run_id}"),
    ("GET", "/api/agent/runs/{run_id}/events"),
    ("POST", "/api/agent/runs/{run_id}/cancel"),
    ("GET", "/api/agent/notebooks/{path}/kernel"),
    ("POST", "/api/agent/notebooks/{path}/kernel"),
    ("GET", "/api/agent/approvals"),
    ("GET", "/api/agent/approvals/{approval_id}"),
    ("POST", "/api/agent/approvals/{approval_id}"),
    ("GET", "/api/agent/focus"),
    ("PUT", "/api/agent/focus/tabs/{tab}"),
    ("DELETE", "/api/agent/focus/tabs/{tab}"),
    ("POST", "/api/agent/focus/actions"),
]
CASES = [
    pytest.param(method, path, mode, fixed, id=f"{method} {path} {mode.value}{' target' if fixed else ''}")
    for method, path in OPERATIONS
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
    for fixed in ((False, True) if "{path}" in path else (False,))
]


def test_operations_are_all_fuzzed(served: Any) -> None:
    _schema, contract, _auth = served
    documented = {
        (m.upper(), p) for p, item in contract.doc["paths"].items() for m in item if m != "parameters"
    }
    assert documented == set(OPERATIONS)


@pytest.mark.parametrize(("method", "path", "mode", "fixed"), CASES)
def test_fuzz(server: Server, served: Any, method: str, path: str, mode: GenerationMode, fixed: bool) -> None:
    schema, contract, auth = served
    operation = schema[path][method]
    # With a fixed path the generated requests hit a real notebook, so edits really apply (or are refused).
    path_parameters: dict[str, str] | None = {"path": TARGET} if fixed else None
    if fixed and "{cell}" in path:
        path_parameters = {"path": TARGET, "cell": "c"}  # a cell with outputs: n and mime are generated
    seen: dict[int, int] = {}

    @given(case=operation.as_strategy(generation_mode=mode, path_parameters=path_parameters))
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def run(case: Any) -> None:
        if any(NOT_HTTP.search(str(value)) for value in (case.headers or {}).values()):
            return  # a header HTTP forbids: Tornado's parser answers 400 with no body before any route
        before = _notebooks(server.root_dir)
        response = case.call(base_url=server.url, headers=auth, timeout=120)
        seen[response.status_code] = seen.get(response.status_code, 0) + 1
        case.validate_response(response, checks=CHECKS, headers=auth)
        if response.status_code == 202:  # "detach": true: let the run end before the next case
            run = requests.get(
                server.url.rstrip("/") + response.json()["location"] + "?wait=300",
                headers=auth,
                timeout=360,
            )
            assert run.status_code == 200 and run.json()["state"] not in ("queued", "running"), run.text
        takes_body = (
            method == "POST" and path != "/api/agent/sessions/{name}/interrupt" and "/runs/" not in path
        )
        if takes_body and case.body is not NOT_SET and not contract.request_valid(method, path, case.body):
            assert 400 <= response.status_code < 500, (case.body, response.status_code, response.text)
        if response.status_code >= 400:
            assert _notebooks(server.root_dir) == before, (case.body, response.status_code, response.text)

    run()
    assert sum(seen.values()) > 0
    assert all(status < 500 for status in seen)

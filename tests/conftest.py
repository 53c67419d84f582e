"""Test harness: a real Jupyter server (pytest-jupyter) with the extension enabled."""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

import pytest

pytest_plugins = ["jupyter_server.pytest_plugin"]

# Every server of the suite (in-process or a subprocess, which inherits TMPDIR) keeps its temporary files,
# the default artifacts directory included, in a private directory: a test that goes wrong can never
# touch the system's temp directory or other programs' files.
PRIVATE_TMP = tempfile.mkdtemp(prefix="jupyter-agent-tools-tests-")
os.environ["TMPDIR"] = PRIVATE_TMP
tempfile.tempdir = PRIVATE_TMP


# The fast tier (python3 dev.py test --quick): pure core and fast route tests, well under a minute.
QUICK_MODULES = {
    "test_docs",
    "test_hostile",
    "test_messages",
    "test_notebook_routes",
    "test_operations",
    "test_sink",
    "test_text",
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        module = getattr(item, "module", None)
        if module is not None and module.__name__.rsplit(".", 1)[-1] in QUICK_MODULES:
            item.add_marker(pytest.mark.quick)


@pytest.fixture
def jp_server_config() -> dict[str, Any]:
    return {"ServerApp": {"jpserver_extensions": {"jupyter_agent_tools": True}}}


@pytest.fixture
def api(jp_fetch):
    """Call an agent route and return (status, parsed JSON body); never raises on HTTP errors."""

    async def call(
        method: str,
        *parts: str,
        body: Any = None,
        raw: bytes | None = None,
        params: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ):
        kwargs: dict[str, Any] = {"method": method, "raise_error": False}
        if raw is not None:
            kwargs["body"] = raw
        elif body is not None:
            kwargs["body"] = json.dumps(body)
        elif method in ("POST", "PUT", "PATCH"):
            kwargs["body"] = b""
        if params:
            kwargs["params"] = params
        if headers:
            kwargs["headers"] = headers
        response = await jp_fetch("api", "agent", *parts, **kwargs)
        text = response.body.decode() if response.body else ""
        return response.code, (json.loads(text) if text else None)

    return call


@pytest.fixture
def evaluate(api):
    """POST an eval of code cells (other fields as keywords), assert the status, return the answer."""

    async def call(*codes: str, expect: int = 200, **fields: Any) -> dict[str, Any]:
        body = {"cells": [{"code": c} for c in codes], **fields}
        status, answer = await api("POST", "eval", body=body)
        assert status == expect, answer
        return answer

    return call

"""pytest fixtures for testing against a Jupyter server with jupyter_agent_tools.

Use it the way jupyter_server's own plugin is used::

    pytest_plugins = ["jupyter_server.pytest_plugin", "jupyter_agent_tools.pytest_plugin"]

- ``agent_api``: call an agent route of the in-process test server (pytest-jupyter's ``jp_fetch``) and
  get ``(status, parsed JSON)``, never raising on HTTP errors; enable the extension in
  ``jp_server_config`` (``{"ServerApp": {"jpserver_extensions": {"jupyter_agent_tools": True}}}``).
- ``agent_evaluate``: POST an eval of code cells and return the answer, asserting its status.
- ``agent_server``: a factory of real server subprocesses (:func:`jupyter_agent_tools.testing.server.
  jupyter_server`), for tests that kill, limit or measure the server process itself.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from .testing.server import jupyter_server

ApiCall = Callable[..., Awaitable[tuple[int, Any]]]


@pytest.fixture
def agent_api(jp_fetch: Any) -> ApiCall:
    """Call an agent route and return (status, parsed JSON body); never raises on HTTP errors."""

    async def call(
        method: str,
        *parts: str,
        body: Any = None,
        raw: bytes | None = None,
        params: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, Any]:
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
def agent_evaluate(agent_api: ApiCall) -> Callable[..., Awaitable[dict[str, Any]]]:
    """POST an eval of code cells (other fields as keywords), assert the status, return the answer."""

    async def call(*codes: str, expect: int = 200, **fields: Any) -> dict[str, Any]:
        body = {"cells": [{"code": c} for c in codes], **fields}
        status, answer = await agent_api("POST", "eval", body=body)
        assert status == expect, answer
        return dict(answer)

    return call


@pytest.fixture
def agent_server() -> Any:
    """``jupyter_server(root_dir=None, extra_args=(), env=None, ...)``: a context manager that starts a
    real server subprocess with the extension and stops it on exit."""
    return jupyter_server

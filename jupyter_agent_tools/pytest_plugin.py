"""pytest fixtures for testing against a Jupyter server with jupyter_agent_tools.

Use it the way jupyter_server's own plugin is used::

    pytest_plugins = ["jupyter_server.pytest_plugin", "jupyter_agent_tools.pytest_plugin"]

- ``agent_api``: call an agent route of the in-process test server (pytest-jupyter's ``jp_fetch``) and
  get ``(status, parsed JSON)``, never raising on HTTP errors; enable the extension in
  ``jp_server_config`` (``{"ServerApp": {"jpserver_extensions": {"jupyter_agent_tools": True}}}``).
- ``agent_evaluate``: POST an eval of code cells and return the answer, asserting its status.
- ``agent_audit_events``: the audit events (:mod:`jupyter_agent_tools.audit`) the in-process test server
  emitted since the fixture was set up, read through a handler on the server's own event logger:
  ``agent_audit_events("recovery")`` lists the data of the ``recovery`` events.
- ``agent_server``: a factory of real server subprocesses (:func:`jupyter_agent_tools.testing.server.
  jupyter_server`), for tests that kill, limit or measure the server process itself.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest

from .testing.server import jupyter_server

ApiCall = Callable[..., Awaitable[tuple[int, Any]]]
# Seconds the client waits for an answer: longer than the server's own bound on a kernel start
# (KernelService.ready_timeout, 60 s), so a slow start is answered by the server, not cut by the client.
REQUEST_TIMEOUT = 90.0


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
        timeout: float = REQUEST_TIMEOUT,
    ) -> tuple[int, Any]:
        kwargs: dict[str, Any] = {"method": method, "raise_error": False, "request_timeout": timeout}
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


class EventLines(logging.Handler):
    """A logging handler that keeps what it is given (formatted: jupyter_events' JSON lines) in ``lines``."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


@pytest.fixture
def agent_audit_events(jp_serverapp: Any) -> Iterator[Callable[[str | None], list[dict[str, Any]]]]:
    """``events(name=None)``: the data of the extension's audit events emitted so far (of one schema:
    ``notebook_change``, ``execution``, ``session``, ``recovery``, ``refusal``), oldest first."""
    from .audit.events import SCHEMA_BASE

    handler = EventLines()
    event_logger = jp_serverapp.event_logger
    event_logger.register_handler(handler)

    def events(name: str | None = None) -> list[dict[str, Any]]:
        found = []
        for line in handler.lines:
            record = json.loads(line)
            schema = record["__schema__"]
            if schema.startswith(SCHEMA_BASE + "/") and (name is None or schema.split("/")[-2] == name):
                found.append({k: v for k, v in record.items() if not k.startswith("__")})
        return found

    yield events
    event_logger.remove_handler(handler)


@pytest.fixture
def agent_server() -> Any:
    """``jupyter_server(root_dir=None, extra_args=(), env=None, ...)``: a context manager that starts a
    real server subprocess with the extension and stops it on exit."""
    return jupyter_server

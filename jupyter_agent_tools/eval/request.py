"""Parse and validate an eval request body (pure: no I/O)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from ..errors import BadRequest

MODES = ("session", "per-call")
EVAL_FIELDS = (
    "cells",
    "session",
    "mode",
    "reset",
    "timeout",
    "cwd",
    "env",
    "session_file",
    "kernel_name",
)
CELL_FIELDS = ("code", "title")
SESSION_NAME = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
MIN_TIMEOUT, MAX_TIMEOUT, DEFAULT_TIMEOUT = 1.0, 600.0, 30.0


@dataclass(frozen=True)
class Cell:
    """One piece of code to run, with an optional title for the combined output."""

    code: str
    title: str | None = None


@dataclass(frozen=True)
class EvalRequest:
    """A validated eval request."""

    cells: list[Cell]
    session: str = "default"
    mode: str = "session"
    reset: bool = False
    timeout: float = DEFAULT_TIMEOUT
    cwd: str = ""
    env: dict[str, str] = field(default_factory=dict)
    session_file: str | None = None
    kernel_name: str | None = None


def _type_error(name: str, expected: str, value: Any) -> BadRequest:
    return BadRequest(f"'{name}' must be {expected}, got {type(value).__name__}")


def parse_eval_request(body: Any, max_cells: int = 100) -> EvalRequest:
    """Validate an eval body and return an :class:`EvalRequest`; 400 naming the bad field otherwise."""
    if not isinstance(body, dict):
        raise BadRequest('Request body must be a JSON object like {"cells": [{"code": "1+1"}]}')
    unknown = sorted(set(body) - set(EVAL_FIELDS))
    if unknown:
        raise BadRequest(f"unknown field {unknown[0]!r} (allowed: {', '.join(EVAL_FIELDS)})")
    raw_cells = body.get("cells")
    if raw_cells is None:
        raise BadRequest('\'cells\' is required: a non-empty array of {"code": str, "title"?: str}')
    if not isinstance(raw_cells, list) or not raw_cells:
        raise BadRequest('\'cells\' must be a non-empty array of {"code": str, "title"?: str}')
    if len(raw_cells) > max_cells:
        raise BadRequest(f"'cells' has {len(raw_cells)} cells; at most {max_cells} are allowed")
    cells = []
    for i, raw in enumerate(raw_cells):
        if not isinstance(raw, dict):
            raise BadRequest(f'cells[{i}] must be an object like {{"code": "1+1"}}')
        extra = sorted(set(raw) - set(CELL_FIELDS))
        if extra:
            raise BadRequest(f"cells[{i}]: unknown field {extra[0]!r} (allowed: code, title)")
        code = raw.get("code")
        if not isinstance(code, str):
            if code is None:
                raise BadRequest(f"cells[{i}]: 'code' is required")
            raise _type_error(f"cells[{i}].code", "a string", code)
        title = raw.get("title")
        if title is not None and not isinstance(title, str):
            raise _type_error(f"cells[{i}].title", "a string", title)
        cells.append(Cell(code=code, title=title))

    session = body.get("session", "default")
    if not isinstance(session, str):
        raise _type_error("session", "a string", session)
    if not SESSION_NAME.match(session):
        raise BadRequest("'session' must be 1-64 characters of letters, digits, '.', '_' or '-'")
    mode = body.get("mode", "session")
    if mode not in MODES:
        raise BadRequest(f"'mode' must be one of: {', '.join(MODES)} (got {mode!r})")
    reset = body.get("reset", False)
    if not isinstance(reset, bool):
        raise _type_error("reset", "a boolean", reset)
    timeout = body.get("timeout", DEFAULT_TIMEOUT)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise _type_error("timeout", "a number of seconds", timeout)
    if timeout != timeout:  # NaN
        raise BadRequest("'timeout' must be a number of seconds")
    timeout = min(max(float(timeout), MIN_TIMEOUT), MAX_TIMEOUT)
    cwd = body.get("cwd", "")
    if cwd is None:
        cwd = ""
    if not isinstance(cwd, str):
        raise _type_error("cwd", "a path relative to the server root", cwd)
    if "\0" in cwd:
        raise BadRequest("'cwd' must not contain NUL characters")
    env = body.get("env") or {}
    if not isinstance(env, dict):
        raise _type_error("env", "an object of string keys to string values", env)
    for key, value in env.items():
        if not ENV_NAME.match(key):
            raise BadRequest(f"env: {key!r} is not a valid environment variable name")
        if not isinstance(value, str):
            raise _type_error(f"env.{key}", "a string", value)
        if "\0" in value:
            raise BadRequest(f"env.{key} must not contain NUL characters")
    session_file = body.get("session_file")
    if session_file is not None and not isinstance(session_file, str):
        raise _type_error("session_file", "a string", session_file)
    kernel_name = body.get("kernel_name")
    if kernel_name is not None and not isinstance(kernel_name, str):
        raise _type_error("kernel_name", "a string", kernel_name)
    return EvalRequest(
        cells=cells,
        session=session,
        mode=mode,
        reset=reset,
        timeout=timeout,
        cwd=cwd.strip("/"),
        env=dict(env),
        session_file=session_file,
        kernel_name=kernel_name or None,
    )

"""Parse and validate an eval request body (pure: no I/O)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import BadRequest
from ..schemas import EVAL_MODES
from ..validation import check

MODES = EVAL_MODES
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


def parse_eval_request(body: Any, max_cells: int = 100) -> EvalRequest:
    """Validate an eval body and return an :class:`EvalRequest`; 400 naming the bad field otherwise.

    The shape is checked against the published ``EvalRequest`` schema (one source of truth with the
    OpenAPI document); what depends on configuration (``max_cells``) and what JSON Schema cannot say
    (a NaN timeout) is checked here, and defaults are applied.
    """
    check("EvalRequest", body)
    raw_cells = body["cells"]
    if len(raw_cells) > max_cells:
        raise BadRequest(f"'cells' has {len(raw_cells)} cells; at most {max_cells} are allowed")
    cells = [Cell(code=raw["code"], title=raw.get("title")) for raw in raw_cells]
    timeout = body.get("timeout", DEFAULT_TIMEOUT)
    if timeout != timeout:  # NaN (Python's json module accepts it; the handler refuses it earlier)
        raise BadRequest("'timeout' must be a number of seconds")
    return EvalRequest(
        cells=cells,
        session=body.get("session", "default"),
        mode=body.get("mode", "session"),
        reset=body.get("reset", False),
        timeout=min(max(float(timeout), MIN_TIMEOUT), MAX_TIMEOUT),
        cwd=(body.get("cwd") or "").strip("/"),
        env=dict(body.get("env") or {}),
        session_file=body.get("session_file"),
        kernel_name=body.get("kernel_name") or None,
    )

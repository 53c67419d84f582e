"""Parse and validate an eval request body (pure: no I/O)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import BadRequest
from ..schemas import EVAL_MODES, MAX_RUN_CELLS
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


RUN_MAX_TIMEOUT = 3600.0


@dataclass(frozen=True)
class RunRequest:
    """A validated notebook run request: which cells (ids, indices or all), budget, error policy."""

    cell_ids: tuple[str, ...] | None = None
    cell_indices: tuple[int, ...] | None = None
    all: bool = False
    timeout: float = DEFAULT_TIMEOUT
    stop_on_error: bool = True
    expected_hash: str | None = None


def parse_run_request(body: Any) -> RunRequest:
    """Validate a notebook run body against the published ``NotebookRunRequest`` schema."""
    if isinstance(body, dict):
        for name in ("cell_ids", "cell_indices"):
            value = body.get(name)
            if isinstance(value, list) and len(value) > MAX_RUN_CELLS:  # before validating each element
                raise BadRequest(f"'{name}' has {len(value)} cells; at most {MAX_RUN_CELLS} are allowed")
    check("NotebookRunRequest", body)
    ids, indices = body.get("cell_ids"), body.get("cell_indices")
    return RunRequest(
        cell_ids=tuple(ids) if ids is not None else None,
        cell_indices=tuple(indices) if indices is not None else None,
        all=bool(body.get("all", False)),
        timeout=_clamped_timeout(body.get("timeout", DEFAULT_TIMEOUT), RUN_MAX_TIMEOUT),
        stop_on_error=body.get("stop_on_error", True),
        expected_hash=body.get("expected_hash"),
    )


def _clamped_timeout(value: Any, maximum: float) -> float:
    """A timeout in seconds clamped to 1..maximum; huge numbers clamp instead of overflowing."""
    if isinstance(value, int) and not isinstance(value, bool):
        return float(min(max(value, int(MIN_TIMEOUT)), int(maximum)))
    if value != value:  # NaN
        raise BadRequest("'timeout' must be a number of seconds")
    return min(max(float(value), MIN_TIMEOUT), maximum)

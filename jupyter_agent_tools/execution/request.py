"""Parse and validate an eval request body (pure: no I/O)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ..errors import BadRequest
from ..schemas import MAX_ENV_BYTES, MAX_ENV_VARS, MAX_RUN_CELLS
from ..validation import check

MIN_TIMEOUT, MAX_TIMEOUT, DEFAULT_TIMEOUT = 1.0, 600.0, 30.0
NO_TIMEOUT = math.inf  # a detached call without a 'timeout': the point of detaching is long work


def _timeout(body: dict[str, Any], most: float) -> float:
    """The call's timeout in seconds: the body's, clamped to ``MIN_TIMEOUT..most``; without one
    ``DEFAULT_TIMEOUT``, or none at all (:data:`NO_TIMEOUT`) for a detached call."""
    if "timeout" not in body:
        return NO_TIMEOUT if body.get("detach") is True else DEFAULT_TIMEOUT
    timeout = body["timeout"]
    if timeout != timeout:  # NaN (Python's json module accepts it; the handler refuses it earlier)
        raise BadRequest("'timeout' must be a number of seconds")
    # Clamped before float(): JSON integers have any length (float(10**400) overflows); 1e400 is inf.
    return float(min(max(timeout, MIN_TIMEOUT), most))


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
    notebook: str | None = None  # run in this notebook's own kernel (no session of its own)


# What only a session or per-call kernel has: refused next to 'notebook'.
NOT_WITH_NOTEBOOK = ("session", "mode", "reset", "cwd", "env", "session_file", "kernel_name")


def parse_eval_request(body: Any, max_cells: int = 100) -> EvalRequest:
    """Validate an eval body and return an :class:`EvalRequest`; 400 naming the bad field otherwise.

    The shape is checked against the published ``EvalRequest`` schema (one source of truth with the
    OpenAPI document); what depends on configuration (``max_cells``) and what JSON Schema cannot say
    (a NaN timeout, the total size of ``env``) is checked here, and defaults are applied. Counts and
    sizes are checked first: the schema check of each of 700,000 cells would take seconds.
    """
    if isinstance(body, dict):
        _check_sizes(body, max_cells)
    check("EvalRequest", body)
    if "notebook" in body:
        extra = [name for name in NOT_WITH_NOTEBOOK if name in body]
        if extra:
            raise BadRequest(
                f"'{extra[0]}' does not apply with 'notebook': the code runs in the notebook's own kernel "
                "(its kernelspec, its working directory, its variables)"
            )
    cells = [Cell(code=raw["code"], title=raw.get("title")) for raw in body["cells"]]
    return EvalRequest(
        cells=cells,
        session=body.get("session", "default"),
        mode=body.get("mode", "session"),
        reset=body.get("reset", False),
        timeout=_timeout(body, MAX_TIMEOUT),
        cwd=(body.get("cwd") or "").strip("/"),
        env=dict(body.get("env") or {}),
        session_file=body.get("session_file"),
        kernel_name=body.get("kernel_name") or None,
        notebook=body.get("notebook"),
    )


def _check_sizes(body: dict[str, Any], max_cells: int) -> None:
    raw_cells = body.get("cells")
    if isinstance(raw_cells, list) and len(raw_cells) > max_cells:
        raise BadRequest(f"'cells' has {len(raw_cells)} cells; at most {max_cells} are allowed")
    env = body.get("env")
    if not isinstance(env, dict):
        return
    if len(env) > MAX_ENV_VARS:
        raise BadRequest(f"'env' has {len(env)} variables; at most {MAX_ENV_VARS} are allowed")
    size = sum(_utf8_len(name) + _utf8_len(value) for name, value in env.items() if isinstance(value, str))
    if size > MAX_ENV_BYTES:
        raise BadRequest(
            f"'env' has {size} bytes of names and values; at most {MAX_ENV_BYTES} are allowed in total"
        )


def _utf8_len(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


RUN_MAX_TIMEOUT = 3600.0


@dataclass(frozen=True)
class RunRequest:
    """A validated notebook run request: which cells (ids, indices or all), budget, error policy, and
    whether the answer carries images' base64."""

    cell_ids: tuple[str, ...] | None = None
    cell_indices: tuple[int, ...] | None = None
    all: bool = False
    timeout: float = DEFAULT_TIMEOUT
    stop_on_error: bool = True
    expected_hash: str | None = None
    include_images: bool = False
    ops: tuple[dict[str, Any], ...] = ()  # an edit batch applied first (same save, same expected_hash)


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
        timeout=_timeout(body, RUN_MAX_TIMEOUT),
        stop_on_error=body.get("stop_on_error", True),
        expected_hash=body.get("expected_hash"),
        include_images=body.get("include_images", False),
        ops=tuple(body.get("ops") or ()),
    )

"""The answers of an eval call and a notebook run, typed as the stream's events are
(:mod:`.stream_events`), each built once where its call ends: what docs/api.md and the OpenAPI document's
``EvalResult`` and ``NotebookRunResult`` describe. Pure: types only."""

from __future__ import annotations

from typing import Any, TypedDict


class CellError(TypedDict):
    """The error a cell raised (traceback without ANSI escapes)."""

    ename: str
    evalue: str
    traceback: list[str]


class CellResult(TypedDict):
    """One cell of an eval answer."""

    index: int
    title: str | None
    status: str  # complete | error | cancelled
    output: str
    exit_code: int
    error: CellError | None
    displays: list[dict[str, Any]]
    duration_ms: int
    stdin_requested: bool
    truncated: bool
    total_bytes: int
    total_lines: int
    output_bytes: int
    output_lines: int
    artifact_id: str | None


class _EvalAnswer(TypedDict):
    session: str | None
    mode: str
    kernel_id: str | None
    cancelled: bool
    timed_out: bool
    restarted: bool
    session_lost: dict[str, Any] | None
    error: str | None
    output: str
    cells: list[CellResult]


class EvalAnswer(_EvalAnswer, total=False):
    """The answer of an eval call (in a session, per call, or in a notebook's kernel: ``notebook``);
    ``kernel_start_seconds`` when the call started a kernel."""

    notebook: str
    kernel_start_seconds: float


class _RunAnswer(TypedDict):
    path: str
    kernel_id: str | None
    hash: str | None
    cancelled: bool
    timed_out: bool
    restarted: bool
    error: str | None
    output: str
    outputs_error: str | None
    cells: list[dict[str, Any]]


class RunAnswer(_RunAnswer, total=False):
    """The answer of a notebook run: ``edit`` when it applied ops first; the change ledger's fields
    (``change_id``, ``recorded``, ``undoable``, ``note``) once its writes were grouped into one change."""

    edit: dict[str, Any]
    change_id: str | None
    recorded: bool
    undoable: bool
    note: str

"""An eval call's cells as the cell loop runs them, and its answer built from what the loop did (in a
session, per call, or in a notebook's kernel)."""

from __future__ import annotations

from typing import Any, cast

from ..answers import CellResult, EvalAnswer
from ..audit.events import ExecutionRecord
from .cells import Cell, Ran
from .kernel_session import KernelSession
from .messages import answer_text
from .request import EvalRequest, parse_eval_request

# Iopub messages were dropped past what the connection holds (or by a gateway), seen as dropped or as an
# end-of-output status that never came: what the answer and the artifact hold may lack part of the output.
OUTPUT_MAY_BE_INCOMPLETE = (
    "[Output messages of the kernel were dropped on their way to the server (more than it holds for a "
    "reader was waiting): part of the output may be missing from this answer and its artifact.]"
)


def parse_recorded(body: Any, max_cells: int, record: ExecutionRecord) -> EvalRequest:
    """An eval body parsed, its record filled in as far as it is known (mode, code, session)."""
    if isinstance(body, dict) and body.get("mode") in ("session", "per-call"):
        record.mode = body["mode"]
    request = parse_eval_request(body, max_cells)
    record.code = [cell.code for cell in request.cells]
    record.session = request.session if request.mode == "session" else None
    return request


def eval_cells(request: EvalRequest) -> list[Cell]:
    """An eval request's cells, as the loop runs them."""
    return [Cell(index, cell.code, cell.title) for index, cell in enumerate(request.cells)]


def eval_answer(
    session: KernelSession,
    request: EvalRequest,
    ran: list[Ran],
    notices: list[str],
    *,
    restarted: bool,
    cancelled: bool = False,
    error: str | None = None,
    session_lost: dict[str, Any] | None = None,
    notebook: str | None = None,
    start_seconds: float | None = None,
) -> EvalAnswer:
    """The answer of an eval request (in a session, per-call or in a notebook's kernel: ``notebook``);
    ``start_seconds``: how long the call's kernel start took, when it started one (not in its timeout)."""
    cell_results = []
    outcomes = []
    for r in ran:
        title = request.cells[r.cell.index].title
        fields = {"index": r.cell.index, "title": title, **r.execution.result_fields()}
        cell_results.append(cast(CellResult, fields))
        outcomes.append(r.execution.outcome(r.cell.index, title))
    if any(r.execution.idle_missing or r.execution.output_lost for r in ran):
        notices = [*notices, OUTPUT_MAY_BE_INCOMPLETE]
    output = answer_text(outcomes, len(request.cells), notices, error)
    if cancelled and not ran:
        output = "(cancelled before it started)"
    answer: EvalAnswer = {
        "session": session.name if session.mode == "session" else None,
        "mode": session.mode,
        "kernel_id": session.kernel_id,
        "cancelled": cancelled or any(r.execution.cancelled for r in ran),
        "timed_out": any(r.execution.timed_out for r in ran),
        "restarted": restarted,
        "session_lost": session_lost,
        "error": error,
        "output": output,
        "cells": cell_results,
    }
    if notebook is not None:
        answer["notebook"] = notebook
    if start_seconds is not None:
        answer["kernel_start_seconds"] = round(start_seconds, 3)
    return answer

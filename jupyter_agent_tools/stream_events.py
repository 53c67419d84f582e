"""The events of a streamed eval or notebook run, as they travel (pure typing, no I/O).

One event per NDJSON line of an attached stream (``Accept: application/x-ndjson``), of a detached run's
events route (there each with its ``seq``), and what the services emit to the MCP tools' progress. Each
is a plain dict with a ``type``; these TypedDicts say which fields each type carries, so consumers narrow
on ``event["type"]`` and mypy checks what they read. The wire shape is the dict itself: docs/api.md
("The event stream") documents the same fields (tests/test_docs.py keeps them in step).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal, TypedDict

# (An event's optional fields are those of a ``total=False`` subclass: NotRequired is Python 3.11's.)


class _CellStart(TypedDict):
    type: Literal["cell_start"]
    index: int
    title: str | None


class CellStart(_CellStart, total=False):
    """A cell starts."""

    cell_id: str | None  # a notebook run's cell


class Chunk(TypedDict):
    """Output text as it arrives; ``name``: stdout, stderr, result, display or error."""

    type: Literal["chunk"]
    index: int
    name: str
    text: str


class Gap(TypedDict):
    """``bytes`` of cell ``index``'s ``name`` text that were not sent (the reader fell behind)."""

    type: Literal["gap"]
    index: int
    name: str
    bytes: int


class DisplayEvent(TypedDict):
    """A structured output (``{"type": "json" | "image" | "status", ...}``, as in the answer's displays)."""

    type: Literal["display"]
    index: int
    display: dict[str, Any]


class _CellEnd(TypedDict):
    type: Literal["cell_end"]
    index: int
    status: str
    exit_code: int | None
    duration_ms: int


class CellEnd(_CellEnd, total=False):
    """A cell ended."""

    cell_id: str | None  # a notebook run's cell
    execution_count: int | None  # a notebook run's cell


class Heartbeat(TypedDict):
    """Nothing else was sent for a while (the stream's heartbeat interval)."""

    type: Literal["heartbeat"]
    elapsed_ms: int


class Restart(TypedDict):
    """The session's kernel was replaced during the call: its state is lost."""

    type: Literal["restart"]
    session: str
    message: str


class _Approval(TypedDict):
    type: Literal["approval"]
    state: Literal["pending", "approved"]


class Approval(_Approval, total=False):
    """The call waits for the person (``pending``), or the person approved it (``approved``)."""

    approval_id: int  # (an MCP task's wait has none)
    summary: str  # pending
    decided_by: str | None  # approved


class Result(TypedDict):
    """The last event of a call that answered: the JSON answer."""

    type: Literal["result"]
    result: Mapping[str, Any]  # an EvalAnswer, a RunAnswer (jupyter_agent_tools.answers)


class _Error(TypedDict):
    type: Literal["error"]
    status: int
    message: str


class Error(_Error, total=False):
    """The last event of a call that failed after the stream started; the JSON error answer's
    ``reason``, ``approval_id`` and ``cells`` when it has them (a denial by the person)."""

    reason: str
    approval_id: int
    cells: list[str]


class Lost(TypedDict):
    """A detached run's events route only (no ``seq``): events from_seq..to_seq were not kept."""

    type: Literal["lost"]
    from_seq: int
    to_seq: int
    message: str


StreamEvent = (
    CellStart | Chunk | Gap | DisplayEvent | CellEnd | Heartbeat | Restart | Approval | Result | Error
)
"""What a call emits (and an attached stream sends)."""

RunEvent = StreamEvent | Lost
"""What a detached run's events route sends (each event with its ``seq``, besides)."""

Emit = Callable[[StreamEvent], None]
"""Where a call sends its events as they happen."""

"""What the client's calls answer and raise: typed answers and :class:`AgentAPIError`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypedDict

from ..answers import CellError as CellError
from ..answers import CellResult as CellResult
from ..answers import EvalAnswer
from ..stream_events import RunEvent


class AgentAPIError(Exception):
    """A call failed: ``status`` is the HTTP status (``None`` when the server could not be reached or
    did not answer in time), ``message`` the route's message, ``reason`` its short reason if any."""

    def __init__(self, status: int | None, message: str, reason: str | None = None, url: str = ""):
        super().__init__(f"HTTP {status}: {message}" if status is not None else message)
        self.status = status
        self.message = message
        self.reason = reason
        self.url = url

    @property
    def timed_out(self) -> bool:
        """No answer came in time (``httpx`` timed out), as opposed to a refused connection."""
        return self.status is None and self.reason == "timeout"


class ApprovalDenied(AgentAPIError):
    """The person denied the call (or nobody decided in time, or the server's policy denies it): the
    ``message`` says who and why; ``approval_id`` is the request's id (None for a deny rule)."""

    def __init__(self, status: int | None, message: str, url: str = "", approval_id: int | None = None):
        super().__init__(status, message, "approval_denied", url)
        self.approval_id = approval_id


class Cell(TypedDict, total=False):
    code: str
    title: str | None


# What the server answers, typed once for the server and this client (jupyter_agent_tools.answers).
EvalResult = EvalAnswer


class NotebookCell(TypedDict, total=False):
    index: int
    id: str | None
    cell_type: str
    source: str
    execution_count: int | None
    outputs: list[dict[str, Any]]


class _NotebookAnswer(TypedDict):
    path: str
    nbformat: int
    nbformat_minor: int | None
    hash: str
    cell_count: int
    start: int | None
    next_start: int | None
    cells: list[NotebookCell]


class NotebookAnswer(_NotebookAnswer, total=False):
    converted_from: str  # an nbformat 3 file, shown converted
    problems: list[str]  # a notebook invalid as found


class _EditAnswer(TypedDict):
    message: str
    details: dict[str, Any]
    hash: str
    results: list[dict[str, Any]]


class EditAnswer(_EditAnswer, total=False):
    repairs: list[str]  # with repair=True
    upgraded_from: str  # with upgrade=True on an nbformat 3 file


# One NDJSON event, typed by its "type" (docs/api.md, "The event stream"); a run's events also carry "seq".
EvalEvent = RunEvent
CellsArg = str | Sequence[str | Cell | Mapping[str, Any]]
Op = Mapping[str, Any]

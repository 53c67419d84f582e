"""Exit codes of ``jupyter agent``, from a run's result or from a failed call."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..client import AgentAPIError
from ..schemas import REFUSED_MISSING_SCOPE, REFUSED_NOT_FOR_AGENTS

OK = 0  # every cell complete (or the command did what it was asked)
FAILED = 1  # a cell failed, the call itself failed, or the server failed (5xx)
USAGE = 2  # bad usage, or the server answered 4xx
UNREACHABLE = 3  # no server found, server unreachable, or the token refused (wrong, expired, revoked)
REFUSED = 4  # the agent token is valid but lacks the scope this needs (or no agent token may do it)
TIMED_OUT = 124  # the run ran out of its timeout (as timeout(1) exits)
CANCELLED = 130  # cancelled: Ctrl-C (128 + SIGINT), or the session was interrupted
DENIED = 6  # the person denied it (the approval gate), or nobody decided in time


def for_result(result: Mapping[str, Any]) -> int:
    """The exit code of a finished run (an eval or notebook-run answer)."""
    if result.get("timed_out"):
        return TIMED_OUT
    if result.get("cancelled"):
        return CANCELLED
    if result.get("error") or any(cell.get("status") == "error" for cell in result.get("cells") or []):
        return FAILED
    return OK


def for_error(error: AgentAPIError) -> int:
    """The exit code of a call that failed."""
    if error.status is None:
        return TIMED_OUT if error.timed_out else UNREACHABLE
    if error.reason == "approval_denied":
        return DENIED
    if refused_scope(error):
        return REFUSED
    if error.status in (401, 403):
        return UNREACHABLE
    if 400 <= error.status < 500:
        return USAGE
    return FAILED


def refused_scope(error: AgentAPIError) -> bool:
    """Whether the server refused a valid agent token for what it asked (a 403 whose reason says so)."""
    return error.status == 403 and error.reason in (REFUSED_MISSING_SCOPE, REFUSED_NOT_FOR_AGENTS)

"""Exit codes of ``jupyter agent``, from a run's result or from a failed call."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..client import AgentAPIError
from ..wire import REFUSED_MISSING_SCOPE, REFUSED_NOT_FOR_AGENTS

OK = 0  # every cell complete (or the command did what it was asked)
FAILED = 1  # a cell failed, the call itself failed, or the server failed (5xx)
USAGE = 2  # bad usage, or the server answered 4xx
UNREACHABLE = 3  # no server found, server unreachable, or the token refused (wrong, expired, revoked)
REFUSED = 4  # the agent token is valid but lacks the scope this needs (or no agent token may do it)
TIMED_OUT = 124  # the run ran out of its timeout (as timeout(1) exits)
CANCELLED = 130  # cancelled: Ctrl-C (128 + SIGINT), or the session was interrupted
DENIED = 6  # the person denied it (the approval gate), or a rule of the server's denies it
EXPIRED = 7  # nobody decided the approval request in time, or it was withdrawn: nothing was done
PENDING = 8  # still waiting for the person when the command stopped waiting: it is done once approved


def for_result(result: Mapping[str, Any]) -> int:
    """The exit code of a finished run (an eval or notebook-run answer)."""
    if result.get("timed_out"):
        return TIMED_OUT
    if result.get("cancelled"):
        return CANCELLED
    if result.get("error") or any(cell.get("status") == "error" for cell in result.get("cells") or []):
        return FAILED
    return OK


def for_approval(state: str | None) -> int:
    """The exit code of a call the person had to decide, from its approval request's state (None: not
    known, as for a call a rule denies)."""
    if state == "pending":
        return PENDING
    if state in ("expired", "withdrawn"):
        return EXPIRED
    return OK if state == "approved" else DENIED


def for_error(error: AgentAPIError, approval_state: str | None = None) -> int:
    """The exit code of a call that failed (``approval_state``: its approval request's, when refused)."""
    if error.status is None:
        return TIMED_OUT if error.timed_out else UNREACHABLE
    if error.reason == "approval_denied":
        return for_approval(approval_state if approval_state != "approved" else None)
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

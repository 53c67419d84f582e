"""Errors raised by the services and the pure core, carrying the HTTP status they map to.

The core never imports Tornado; handlers turn an :class:`AgentToolsError` into an ``HTTPError``.
"""

from __future__ import annotations

# Retry-After values (seconds), each chosen for what the caller waits for:
RETRY_AFTER_BUSY_SESSIONS = 5  # every session runs a call; most calls take seconds
RETRY_AFTER_KERNEL_START = 5  # a kernel manager or gateway that failed to start a kernel
RETRY_AFTER_MOMENT = 1  # a transient state: a room loading, a kernel that died while starting


class AgentToolsError(Exception):
    """An expected failure with an HTTP status and a message that tells the caller what to fix."""

    status: int = 400

    def __init__(
        self,
        message: str,
        status: int | None = None,
        *,
        retry_after: int | None = None,
        extra: dict[str, object] | None = None,
    ):
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status
        self.retry_after = retry_after
        self.extra = extra or {}  # more fields of the JSON error answer (an undo's conflicts)


class BadRequest(AgentToolsError):
    """The request cannot be applied as sent (400)."""

    status = 400


class NotFound(AgentToolsError):
    """The addressed notebook, session or artifact does not exist (404)."""

    status = 404


class Conflict(AgentToolsError):
    """The target changed since the caller read it (409)."""

    status = 409


class Unavailable(AgentToolsError):
    """A resource is exhausted or busy; the caller may retry later (503)."""

    status = 503

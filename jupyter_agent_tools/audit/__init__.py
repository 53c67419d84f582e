"""Audit events (jupyter_events, through the server's event logger) and Prometheus metrics."""

from .context import current_user, set_user
from .events import NO_AUDIT, Audit

__all__ = ["NO_AUDIT", "Audit", "current_user", "set_user"]

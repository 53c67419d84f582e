"""Audit events (jupyter_events, through the server's event logger) and Prometheus metrics."""

from .context import current_user, current_via, set_user, set_via
from .events import NO_AUDIT, Audit

__all__ = ["NO_AUDIT", "Audit", "current_user", "current_via", "set_user", "set_via"]

"""The event feed (``/api/events/subscribe``): which events a subscriber receives, and how much may wait.

jupyter_server sends every event of its event logger to every subscriber. Through this feed an agent
token receives only events about itself and about notebooks inside its paths; everyone else (the
person's Agents panel, JupyterLab's ``serviceManager.events``) still receives every event. Each
subscriber has at most ``max_pending_bytes`` of events waiting to be sent: one that does not read is
closed (1008, the reason says why) instead of growing the server. No Tornado here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from traitlets import Int, validate

from ..auth.paths import PathScope
from ..service import Service, in_range
from .events import EXECUTION, LEDGER_CHANGE, NOTEBOOK_CHANGE, RECOVERY, REFUSAL, SESSION

CONTENTS = "https://events.jupyter.org/jupyter_server/contents_service/v1"


@dataclass(frozen=True)
class Subscriber:
    """An agent subscribed to the feed: its username and path globs (None: no path limit)."""

    user: str
    paths: PathScope | None = None
    root_dir: str | None = None

    def reaches(self, path: Any) -> bool:
        return isinstance(path, str) and (self.paths is None or self.paths.allows(path, self.root_dir))

    def own(self, data: dict[str, Any], key: str = "user") -> bool:
        return data.get(key) is not None and data.get(key) == self.user


# schema id -> whether an agent receives an event of it; schemas not listed are never an agent's
# (jupyter_server's kernel_actions and gateway_client events, other extensions' events).
RULES: dict[str, Callable[[Subscriber, dict[str, Any]], bool]] = {
    NOTEBOOK_CHANGE: lambda s, d: s.reaches(d.get("path")),
    LEDGER_CHANGE: lambda s, d: s.reaches(d.get("path")),
    EXECUTION: lambda s, d: s.own(d),
    SESSION: lambda s, d: s.own(d, "owner") if d.get("notebook") is None else s.reaches(d["notebook"]),
    RECOVERY: lambda s, d: s.own(d),
    REFUSAL: lambda s, d: s.own(d),
    CONTENTS: lambda s, d: (
        s.reaches(d.get("path")) and (d.get("source_path") is None or s.reaches(d["source_path"]))
    ),
}


class EventFeed(Service):
    """What each subscriber of ``/api/events/subscribe`` receives, and how much may wait for it."""

    max_pending_bytes = Int(
        1024 * 1024,
        help="Bytes of events that may wait for one subscriber of /api/events/subscribe. A subscriber "
        "that does not read them is closed (code 1008, saying so); JupyterLab's and the Agents panel's "
        "event streams reconnect.",
    ).tag(config=True)

    @validate("max_pending_bytes")
    def _valid_pending(self, proposal: Any) -> int:
        return in_range(proposal, 64 * 1024, 1024**3)

    def receives(self, subscriber: Subscriber | None, schema_id: str, data: dict[str, Any]) -> bool:
        """Whether ``subscriber`` (None: not an agent) receives an event of ``schema_id``."""
        if subscriber is None:
            return True
        rule = RULES.get(schema_id)
        return rule is not None and bool(rule(subscriber, data))

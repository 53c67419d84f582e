"""Approval requests: the record, and their SQLite file (one worker thread; the event loop never waits on it).

Every request is kept (pending, approved, denied, expired, withdrawn) with who decided and why: the history
survives a restart, and a request still pending when the server stopped is marked ``expired`` when it starts
again (nothing runs unapproved after a restart). The file is created 0600: it holds the code agents asked
to run.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from typing import Any

LOCK_TIMEOUT = 2.0  # seconds a write waits for another process's lock before it is given up (logged)
SCHEMA = """
CREATE TABLE IF NOT EXISTS approvals (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    agent TEXT NOT NULL,
    door TEXT NOT NULL,
    action TEXT NOT NULL,
    path TEXT,
    summary TEXT NOT NULL,
    details TEXT NOT NULL,
    created REAL NOT NULL,
    expires REAL NOT NULL,
    state TEXT NOT NULL,
    decided_by TEXT,
    decided REAL,
    reason TEXT,
    for_seconds REAL,
    outcome TEXT
);
CREATE INDEX IF NOT EXISTS approvals_state ON approvals (state);
"""


def iso(timestamp: float | None) -> str | None:
    if timestamp is None:
        return None
    return datetime.fromtimestamp(timestamp, timezone.utc).isoformat().replace("+00:00", "Z")


@dataclass
class Approval:
    """One request for the person's decision."""

    id: int
    agent: str
    door: str
    action: str
    path: str | None
    summary: str
    details: dict[str, Any]
    created: float
    expires: float
    state: str = "pending"
    decided_by: str | None = None
    decided: float | None = None
    reason: str | None = None
    for_seconds: float | None = None
    # What came of it once approved, for a request answered 202: {"status", "message", ...}.
    outcome: dict[str, Any] | None = None

    @property
    def actions(self) -> tuple[str, ...]:
        """Every class of action the request covers: ``action``, and those its details add (a notebook
        run with ops: ``["execute", "edit"]``)."""
        more = self.details.get("actions") if isinstance(self.details, dict) else None
        extra = [a for a in more if isinstance(a, str) and a != self.action] if isinstance(more, list) else []
        return (self.action, *extra)

    def to_json(self, *, with_details: bool = True) -> dict[str, Any]:
        answer = {
            "id": self.id,
            "agent": self.agent,
            "door": self.door,
            "action": self.action,
            "path": self.path,
            "summary": self.summary,
            "state": self.state,
            "created": iso(self.created),
            "expires": iso(self.expires),
            "decided_by": self.decided_by,
            "decided": iso(self.decided),
            "reason": self.reason,
            "for_seconds": self.for_seconds,
            "outcome": self.outcome,
        }
        if with_details:
            answer["details"] = self.details
        return answer

    def row(self) -> tuple[Any, ...]:
        values = asdict(self)
        values["details"] = json.dumps(self.details, ensure_ascii=False)
        values["outcome"] = json.dumps(self.outcome, ensure_ascii=False) if self.outcome is not None else None
        return tuple(values.values())

    @classmethod
    def from_row(cls, row: tuple[Any, ...]) -> Approval:
        values = dict(zip(cls.__dataclass_fields__, row, strict=True))
        for name, empty in (("details", {}), ("outcome", None)):
            try:
                values[name] = json.loads(values[name]) if values[name] is not None else empty
            except ValueError:
                values[name] = empty
        return cls(**values)


COLUMNS = (
    "id, agent, door, action, path, summary, details, created, expires, state, decided_by, decided, reason, "
    "for_seconds, outcome"
)


class ApprovalFile:
    """The SQLite file of approvals. Call its methods from one worker thread only."""

    def __init__(self, path: str):
        self.path = path
        self._conn: sqlite3.Connection | None = None

    def _db(self) -> sqlite3.Connection:
        if self._conn is not None:
            return self._conn
        directory = os.path.dirname(self.path)
        if directory:
            os.makedirs(directory, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)  # made 0600, never readable in between
        os.close(fd)
        with contextlib.suppress(OSError):
            os.chmod(self.path, 0o600)
        conn = sqlite3.connect(self.path, timeout=LOCK_TIMEOUT, isolation_level=None, check_same_thread=False)
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            conn.executescript(SCHEMA)
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        return conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def next_id(self) -> int:
        """One past the largest id ever given (ids are never reused, even across restarts)."""
        row = self._db().execute("SELECT seq FROM sqlite_sequence WHERE name = 'approvals'").fetchone()
        return int(row[0]) + 1 if row else 1

    def expire_pending(self, now: float) -> int:
        """Mark every request left pending (by a server that stopped) expired; how many there were."""
        cur = self._db().execute(
            "UPDATE approvals SET state = 'expired', decided = ?, decided_by = 'server restart' "
            "WHERE state = 'pending'",
            (now,),
        )
        return cur.rowcount

    def save(self, approval: Approval) -> None:
        marks = ", ".join("?" * len(COLUMNS.split(",")))
        self._db().execute(f"INSERT OR REPLACE INTO approvals ({COLUMNS}) VALUES ({marks})", approval.row())

    def get(self, approval_id: int) -> Approval | None:
        row = self._db().execute(f"SELECT {COLUMNS} FROM approvals WHERE id = ?", (approval_id,)).fetchone()
        return Approval.from_row(row) if row else None

    def recent(self, limit: int) -> list[Approval]:
        rows = self._db().execute(
            f"SELECT {COLUMNS} FROM approvals WHERE state != 'pending' ORDER BY id DESC LIMIT ?", (limit,)
        )
        return [Approval.from_row(row) for row in rows]

"""Approval requests: the record, and their SQLite file (one worker thread; the event loop never waits on it).

Every request is kept (pending, approved, denied, expired, withdrawn) with who decided and why: the history
survives a restart, and a request still pending when its server process stopped is marked ``expired`` when
a server starts on the file (nothing runs unapproved after a restart); another live server's pending
requests are left alone. Ids come from SQLite (``AUTOINCREMENT``): servers sharing the file never hand out
the same one, and each writes only its own rows. The file is one of the stores
(:mod:`jupyter_agent_tools.stores`): created 0600 (it holds the code agents asked to run), journal by
filesystem.

It is bounded like the change ledger's: a request's details are at most ``max_detail_bytes`` (the longest
texts cut, each with a marker saying how much is not shown: :func:`clip`), and the file (with its
write-ahead log) at most ``max_bytes``: the oldest decided requests are pruned first, pending ones never.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sqlite3
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from functools import cached_property
from typing import Any

from ..audit.context import display_name
from ..stores import OWNERS_SCHEMA, StoreOptions, alive_owners, beat, leave, open_store, this_process

LOCK_TIMEOUT = 2.0  # seconds a write waits for another process's lock before it is given up (logged)
SLACK_BYTES = 4 * 4096  # pages kept free for what a write adds beyond its own bytes (index, page headers)
PRUNE_STEP_ROWS = 500  # most decided requests one prune step deletes (the oldest, as many as make room)
# A text is never cut shorter than this (hashes, ids and paths stay whole); the marker a cut text ends with.
MIN_KEPT_BYTES = 256
CUT_MARKER = "\n… [truncated: {} bytes not shown]"
# The list's preview of a request's details: each text cut to about this many bytes, and the whole
# preview at most PREVIEW_BYTES (else it is empty: the full request is one GET away).
PREVIEW_TEXT_BYTES = 400
PREVIEW_BYTES = 16 * 1024
PREVIEW_MARKER = "\n… [{} more bytes: GET /api/agent/approvals/{id} shows it in full]"
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
    outcome TEXT,
    truncated INTEGER NOT NULL DEFAULT 0,
    owner TEXT
);
CREATE INDEX IF NOT EXISTS approvals_state ON approvals (state);
CREATE INDEX IF NOT EXISTS approvals_agent ON approvals (agent, id);
"""


def json_bytes(value: Any) -> int:
    """Bytes of ``value`` as JSON (UTF-8, as the routes answer it)."""
    return len(json.dumps(value, ensure_ascii=False).encode())


def _most_bytes(value: Any) -> int:
    """At least the bytes of ``value`` as JSON, at once (no character takes more than 6 bytes in JSON)."""
    if isinstance(value, str):
        return len(value) * 6 + 2
    if isinstance(value, dict):
        return sum(_most_bytes(k) + _most_bytes(v) + 2 for k, v in value.items()) + 2
    if isinstance(value, list):
        return sum(_most_bytes(v) + 2 for v in value) + 2
    return 32


def _text_bytes(text: str) -> int:
    """About the bytes of ``text`` as JSON (escapes not counted: the cut is measured exactly afterwards;
    encoding megabytes as JSON to measure them would take most of the time)."""
    return (len(text) if text.isascii() else len(text.encode())) + 2


def _about_bytes(value: Any) -> int:
    """About the bytes of ``value`` as JSON (see :func:`_text_bytes`)."""
    if isinstance(value, str):
        return _text_bytes(value)
    if isinstance(value, dict):
        return sum(_about_bytes(k) + _about_bytes(v) + 2 for k, v in value.items()) + 2
    if isinstance(value, list):
        return sum(_about_bytes(v) + 2 for v in value) + 2
    return 8


def _texts(value: Any, found: list[int]) -> None:
    """The JSON lengths of the texts (not the keys) in ``value``, longer than MIN_KEPT_BYTES."""
    if isinstance(value, str):
        if len(value) * 6 + 2 > MIN_KEPT_BYTES:
            size = _text_bytes(value)
            if size > MIN_KEPT_BYTES:
                found.append(size)
    elif isinstance(value, dict):
        for item in value.values():
            _texts(item, found)
    elif isinstance(value, list):
        for item in value:
            _texts(item, found)


def _cut(value: Any, keep: int, marker: str, cut: list[int], overhead: int = 0) -> Any:
    """``value`` with each text longer than ``keep + overhead`` JSON bytes cut to about ``keep`` and the
    marker (the bytes not shown are added to ``cut``)."""
    if isinstance(value, str):
        size = _text_bytes(value) if len(value) * 6 + 2 > keep + overhead else 0
        if size <= keep + overhead:
            return value
        kept = value[: max(0, len(value) * keep // size)]
        dropped = (len(value) if value.isascii() else len(value.encode())) - len(kept.encode())
        cut.append(dropped)
        return kept + marker.format(dropped)
    if isinstance(value, dict):
        return {k: _cut(v, keep, marker, cut, overhead) for k, v in value.items()}
    if isinstance(value, list):
        return [_cut(v, keep, marker, cut, overhead) for v in value]
    return value


def clip(value: Any, max_bytes: int, marker: str = CUT_MARKER) -> tuple[Any, int] | None:
    """``value`` (JSON data) within ``max_bytes`` as JSON, and the bytes not shown (0: all of it): the
    longest texts are cut to the same length, each ending with ``marker`` (formatted with the bytes it
    does not show). None when it cannot fit without cutting texts shorter than MIN_KEPT_BYTES (its
    structure alone is too large)."""
    if _most_bytes(value) <= max_bytes:
        return value, 0
    size = _about_bytes(value)
    if size <= max_bytes and (size := json_bytes(value)) <= max_bytes:
        return value, 0
    texts: list[int] = []
    _texts(value, texts)
    target = max_bytes
    for _ in range(6):  # the cut is measured again: escapes and multi-byte characters make it approximate
        # the largest length every text may keep so that the whole fits in ``target``
        overhead = len(marker.format(size).encode()) + 2
        low, high = MIN_KEPT_BYTES, max(texts, default=MIN_KEPT_BYTES)
        if size - sum(max(0, n - MIN_KEPT_BYTES - overhead) for n in texts) > target:
            return None
        while low < high:
            mid = (low + high + 1) // 2
            if size - sum(max(0, n - mid - overhead) for n in texts) <= target:
                low = mid
            else:
                high = mid - 1
        cut: list[int] = []
        clipped = _cut(value, low, marker, cut, overhead)
        got = json_bytes(clipped)
        if got <= max_bytes:
            return clipped, sum(cut)
        target = int(target * max_bytes / got) - overhead  # (escapes took more than estimated)
    return None


def preview(details: dict[str, Any], approval_id: int) -> tuple[dict[str, Any], bool]:
    """What the person's list shows of a request's details (bounded), and whether it is cut."""
    marker = PREVIEW_MARKER.replace("{id}", str(approval_id))
    if _most_bytes(details) <= PREVIEW_BYTES or (
        _about_bytes(details) <= PREVIEW_BYTES and json_bytes(details) <= PREVIEW_BYTES
    ):
        return details, False
    cut: list[int] = []
    shown = _cut(details, PREVIEW_TEXT_BYTES, marker, cut, len(marker.format(len(marker)).encode()))
    if json_bytes(shown) > PREVIEW_BYTES:
        return {}, True
    return shown, True


def size_text(n: int) -> str:
    """Bytes as a person reads them (``9.4 MB``)."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


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
    # Bytes of its details not shown (cut to max_detail_bytes when it was asked): 0, all of them.
    truncated: int = 0

    @property
    def actions(self) -> tuple[str, ...]:
        """Every class of action the request covers: ``action``, and those its details add (a notebook
        run with ops: ``["execute", "edit"]``)."""
        more = self.details.get("actions") if isinstance(self.details, dict) else None
        extra = [a for a in more if isinstance(a, str) and a != self.action] if isinstance(more, list) else []
        return (self.action, *extra)

    def to_json(self, *, with_details: bool = True, preview_only: bool = False) -> dict[str, Any]:
        """As the routes answer it; ``preview_only``: its details as the list shows them (bounded, with
        ``"preview": true`` when cut)."""
        answer = {
            "id": self.id,
            "agent": display_name(self.agent),
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
            "truncated": self.truncated,
        }
        if preview_only:
            answer["details"], answer["preview"] = self.listed_details
        elif with_details:
            answer["details"] = self.details
        return answer

    @cached_property
    def listed_details(self) -> tuple[dict[str, Any], bool]:
        """Its details as the person's list shows them, and whether they are cut (made once: the list is
        read again and again while the request waits)."""
        return preview(self.details, self.id)

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
    "for_seconds, outcome, truncated"
)


class ApprovalFile:
    """The SQLite file of approvals, at most ``max_bytes`` with its write-ahead log (the oldest decided
    requests are pruned to make room; pending ones never are). Call its methods from one worker thread."""

    def __init__(
        self,
        path: str,
        max_bytes: int = 0,
        options: StoreOptions | None = None,
        log: logging.Logger | None = None,
    ):
        self.path = path
        self.max_bytes = max_bytes  # 0: no bound
        self.options = options or StoreOptions()
        self.log = log or logging.getLogger(__name__)
        self._conn: sqlite3.Connection | None = None
        self._asked: set[int] = set()  # the ids of the requests written here that may still be pending

    @property
    def _wal_bytes(self) -> int:
        """The write-ahead log is checkpointed (and cut back) at a 16th of max_bytes, 4 MB at most."""
        return max(1, min(1000, self.max_bytes // 4096 // 16)) * 4096

    def _setup(self, conn: sqlite3.Connection) -> None:
        if self.max_bytes:
            conn.execute(f"PRAGMA wal_autocheckpoint = {self._wal_bytes // 4096}")
            conn.execute(f"PRAGMA journal_size_limit = {self._wal_bytes}")
        conn.executescript(SCHEMA + OWNERS_SCHEMA + ";")
        columns = {row[1] for row in conn.execute("PRAGMA table_info(approvals)")}
        if "truncated" not in columns:  # a file made before details were bounded
            conn.execute("ALTER TABLE approvals ADD COLUMN truncated INTEGER NOT NULL DEFAULT 0")
        if "owner" not in columns:  # a file made before process identities
            conn.execute("ALTER TABLE approvals ADD COLUMN owner TEXT")
        beat(conn)

    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            self._conn = open_store(
                self.path,
                label="approvals",
                logger=self.log,
                options=self.options,
                timeout=LOCK_TIMEOUT,
                setup=self._setup,
                before_journal=["PRAGMA auto_vacuum = INCREMENTAL"],  # takes effect on a new file only
            )
        return self._conn

    def close(self) -> None:
        """The server stops: the requests it asked that are still pending expire, its heartbeat goes."""
        if self._conn is not None:
            try:
                mine = list(self._asked)
                for start in range(0, len(mine), 500):
                    chunk = mine[start : start + 500]
                    self._conn.execute(
                        "UPDATE approvals SET state = 'expired', decided = ?, decided_by = 'server restart' "
                        f"WHERE state = 'pending' AND id IN ({', '.join('?' * len(chunk))})",
                        (time.time(), *chunk),
                    )
                leave(self._conn)
            finally:
                self._conn.close()
                self._conn = None

    def beat(self) -> None:
        """This server process still runs (its pending requests are not another server's to expire)."""
        if self._conn is not None:
            beat(self._conn)

    def expire_pending(self, now: float) -> int:
        """Mark expired every request left pending by a server process that is gone (or past its own
        expiry); how many there were. Another live server's pending requests are left alone."""
        conn = self._db()
        owners = [
            row[0] for row in conn.execute("SELECT DISTINCT owner FROM approvals WHERE state = 'pending'")
        ]
        alive = alive_owners(conn, owners, self.options.owner_timeout)
        gone = [o for o in owners if o not in alive]
        expired = 0
        for owner in gone:
            expired += conn.execute(
                "UPDATE approvals SET state = 'expired', decided = ?, decided_by = 'server restart' "
                "WHERE state = 'pending' AND owner IS ?",
                (now, owner),
            ).rowcount
        expired += conn.execute(
            "UPDATE approvals SET state = 'expired', decided = ?, reason = 'nobody decided in time' "
            "WHERE state = 'pending' AND expires < ?",
            (now, now),
        ).rowcount
        return expired

    def fit(self) -> None:
        """At start: prune to within max_bytes, and give the freed pages back to the file system (a file
        made before it was bounded, without incremental auto-vacuum, is rebuilt once)."""
        conn = self._db()
        if not self.max_bytes:
            return
        self.make_room(0)
        if conn.execute("PRAGMA auto_vacuum").fetchone()[0] != 2 and self.disk_bytes() > self.max_bytes // 2:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
            conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
            conn.execute("VACUUM")  # (the only way to turn it on for an existing file)
        self._give_back(conn)

    def used_bytes(self) -> int:
        """Bytes of the file's pages in use."""
        conn = self._db()
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        free = conn.execute("PRAGMA freelist_count").fetchone()[0]
        return int((pages - free) * page_size)

    def disk_bytes(self) -> int:
        """Bytes of the file and its write-ahead log on disk (what max_bytes bounds)."""
        total = 0
        for suffix in ("", "-wal"):
            with contextlib.suppress(OSError):
                total += os.path.getsize(self.path + suffix)
        return total

    def make_room(self, incoming: int) -> bool:
        """Whether a write of ``incoming`` bytes fits within max_bytes (a write lands in the log first, about
        twice its bytes with index pages, then in the file at the checkpoint), after deleting the oldest
        decided requests as needed; pending requests are never deleted."""
        if not self.max_bytes:
            return True
        conn = self._db()
        room = self.max_bytes - self._wal_bytes - 2 * (incoming + SLACK_BYTES)
        used = self.used_bytes()
        pruned = False
        while used > room:
            chosen, freed = [], 0
            for approval_id, size in conn.execute(
                "SELECT id, length(CAST(details AS BLOB)) + length(CAST(summary AS BLOB)) + "
                "coalesce(length(CAST(outcome AS BLOB)), 0) FROM approvals WHERE state != 'pending' "
                "ORDER BY id LIMIT ?",
                (PRUNE_STEP_ROWS,),
            ):
                chosen.append(approval_id)
                freed += size
                if freed >= used - room:
                    break
            if not chosen:
                break
            marks = ", ".join("?" * len(chosen))
            conn.execute(f"DELETE FROM approvals WHERE id IN ({marks})", chosen)
            pruned = True
            used = self.used_bytes()
        if pruned:
            self._give_back(conn)
        return used <= room

    def _give_back(self, conn: sqlite3.Connection) -> None:
        """Free pages back to the file system (the file shrinks), and the log emptied."""
        if conn.execute("PRAGMA freelist_count").fetchone()[0]:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
            # executescript steps the pragma to its end (execute() frees one page only)
            conn.executescript("PRAGMA incremental_vacuum;")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()

    def insert(self, approval: Approval) -> int | None:
        """Write a new request as this server process's; its id (given by SQLite, never one another server
        on the file gave), or None when it does not fit (every other request is pending)."""
        row = approval.row()[1:]
        incoming = sum(len(v) if isinstance(v, str) else 8 for v in row)
        if not self.make_room(incoming):
            return None
        columns = COLUMNS.split(", ", 1)[1]
        cur = self._db().execute(
            f"INSERT INTO approvals ({columns}, owner) VALUES ({', '.join('?' * (len(row) + 1))})",
            (*row, this_process().key),
        )
        self._settle()
        approval_id = int(cur.lastrowid or 0)
        if approval.state == "pending":
            self._asked.add(approval_id)
        return approval_id

    def update(self, approval: Approval) -> bool:
        """Write a request this server process made (its decision, its outcome); False when it is not
        there any more (pruned) or not this process's."""
        row = approval.row()
        incoming = sum(len(v) if isinstance(v, str) else 8 for v in row)
        self.make_room(incoming)
        assignments = ", ".join(f"{c} = ?" for c in COLUMNS.split(", ")[1:])
        cur = self._db().execute(
            f"UPDATE approvals SET {assignments} WHERE id = ? AND owner = ?",
            (*row[1:], approval.id, this_process().key),
        )
        self._settle()
        if approval.state != "pending":
            self._asked.discard(approval.id)
        return cur.rowcount == 1

    def _settle(self) -> None:
        if self.max_bytes and self.disk_bytes() > self.max_bytes - 2 * self._wal_bytes:
            self._db().execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()  # near the bound: empty the log

    def get(self, approval_id: int) -> Approval | None:
        row = self._db().execute(f"SELECT {COLUMNS} FROM approvals WHERE id = ?", (approval_id,)).fetchone()
        return Approval.from_row(row) if row else None

    def recent(self, limit: int, agent: str | None = None) -> list[Approval]:
        """The ``limit`` latest decided requests (of ``agent`` only, when given), newest first."""
        where = "state != 'pending'" + (" AND agent = ?" if agent is not None else "")
        rows = self._db().execute(
            f"SELECT {COLUMNS} FROM approvals WHERE {where} ORDER BY id DESC LIMIT ?",
            (*((agent,) if agent is not None else ()), limit),
        )
        return [Approval.from_row(row) for row in rows]

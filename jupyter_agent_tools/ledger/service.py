"""The change ledger: every change this extension makes to a notebook, kept in an embedded SQLite database.

The database lives in the server's data directory (``jupyter_data_dir()``, the way jupyter_server_fileid
keeps its ids) unless ``db_path`` names another file; it is in WAL mode, so readers never wait for the
writer and entries survive restarts. It is bounded: at most ``max_changes_per_notebook`` entries per
notebook and ``max_bytes`` in all, the oldest pruned first (in the background: a write never waits
for a prune, see :meth:`Ledger._make_room`). Outputs larger than
:data:`INLINE_OUTPUT_BYTES` are stored once by content hash, however many changes refer to them.

Every hash the extension answers with is remembered as a snapshot (:mod:`.since`): per-cell hashes,
not copies, so a read can say what changed since any earlier answer.

The ledger is never on the data path: all database work runs in one worker thread, and when the
database is locked, full or corrupt, a change is still made; it is answered ``"recorded": false`` and
the failure is logged once (until recording works again). A locked database is waited for at most
:data:`LOCK_TIMEOUT` seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import difflib
import functools
import hashlib
import json
import os
import secrets
import sqlite3
import threading
import time
import zlib
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, TypeVar, cast

from traitlets import Instance, Int, Unicode, default, validate

from ..audit import NO_AUDIT, Audit
from ..audit.context import current_approver, current_user, current_via, display_name
from ..auth.context import current_paths
from ..errors import BadRequest, NotFound, Unavailable
from ..notebook.format import join_source
from ..service import Service, at_least, in_range
from ..stores import (
    OWNERS_SCHEMA,
    AgentStores,
    Worker,
    alive_owners,
    beat,
    journal_for,
    leave,
    open_store,
    pid_alive,
    store_options,
    this_process,
)
from .changes import (
    PARTS,
    CellChange,
    Digest,
    NotebookChange,
    decode_change,
    diff,
    dumps,
    encode_change,
    merge,
    summarize,
)
from .overwrite import AgentState, agent_state, overwritten
from .overwrite import summary as overwrite_summary
from .since import Snapshot, attribute, compare, snapshot_of

T = TypeVar("T")

MIB = 1024 * 1024
MIN_BYTES = 256 * 1024  # the smallest max_bytes: room for the log and a few changes
# Pages kept free for what a write adds beyond its own bytes (index pages, page headers).
SLACK_BYTES = 4 * 4096
# Seconds a write waits for a database another connection holds locked before giving up (not recorded):
# on a local disk (WAL, readers never block it), and on a network filesystem, where every reader and
# writer of the other pod takes the one lock (two pods on one sshfs home lost 1-2 of 50 records at 0.2 s).
LOCK_TIMEOUT = 0.2
SHARED_LOCK_TIMEOUT = 2.0
# Outputs whose JSON is larger than this are stored once, by content hash, and referred to.
INLINE_OUTPUT_BYTES = 4096
# Snapshots (notebook versions) kept per notebook, as a multiple of max_changes_per_notebook.
SNAPSHOTS_PER_CHANGE = 2
# Cells of snapshots kept in memory (the latest versions of the notebooks being edited).
SNAPSHOT_MEMORY_CELLS = 100_000
# Hashes known to be remembered, so that reading an unchanged notebook again costs nothing.
KNOWN_HASHES = 10_000
# Snapshots waiting for the worker; past it new ones are dropped (a read does not wait for them).
MAX_PENDING_SNAPSHOTS = 32
# A background prune starts past this share of the room a write needs, and prunes to PRUNE_TO of it.
PRUNE_AT = 0.9
PRUNE_TO = 0.75
# Seconds of deleting old changes a write spends itself, at most, when it does not fit yet (a step of
# deletions takes milliseconds; the rest of a prune, and giving pages back, goes on in the background).
INLINE_PRUNE_SECONDS = 0.1
# Most changes one prune step deletes; free pages one vacuum step gives back.
PRUNE_STEP_CHANGES = 500
VACUUM_PAGES = 256
# Notebooks whose cells' recorded state (see Ledger.agent_state) is kept in memory.
AGENT_STATE_MEMORY = 256
# Most entries one listing answers.
MAX_LIST_LIMIT = 1000
DEFAULT_LIST_LIMIT = 50
# An entry larger than this share of max_bytes is not recorded (it would prune everything else).
MAX_ENTRY_SHARE = 4
ID_PATTERN_DIGITS = 15
HASH_CHARS = 64

SQLITE_HEADER = b"SQLite format 3\x00"  # the first bytes of every SQLite database file (empty: new)
SCHEMA = """
CREATE TABLE IF NOT EXISTS changes (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    time REAL NOT NULL,
    path TEXT NOT NULL,
    user TEXT,
    via TEXT,
    kind TEXT NOT NULL,
    action TEXT NOT NULL,
    hash_before TEXT NOT NULL,
    hash_after TEXT NOT NULL,
    undoes INTEGER,
    not_undoable TEXT,
    cells TEXT NOT NULL,
    body BLOB NOT NULL,
    bytes INTEGER NOT NULL,
    overwrites TEXT,
    approved_by TEXT
);
CREATE INDEX IF NOT EXISTS changes_by_path ON changes (path, id);
CREATE INDEX IF NOT EXISTS changes_by_time ON changes (time);
CREATE TABLE IF NOT EXISTS blobs (hash TEXT PRIMARY KEY, data BLOB NOT NULL, bytes INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS change_blobs (
    change_id INTEGER NOT NULL,
    hash TEXT NOT NULL,
    PRIMARY KEY (change_id, hash)
);
CREATE INDEX IF NOT EXISTS change_blobs_by_hash ON change_blobs (hash);
CREATE TABLE IF NOT EXISTS snapshots (
    hash TEXT PRIMARY KEY,
    path TEXT NOT NULL,
    time REAL NOT NULL,
    cells BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS snapshots_by_path ON snapshots (path, time);
CREATE TABLE IF NOT EXISTS group_parts (
    key TEXT NOT NULL,
    seq INTEGER NOT NULL,
    pid INTEGER NOT NULL,
    path TEXT NOT NULL,
    kind TEXT NOT NULL,
    user TEXT,
    via TEXT,
    hash_before TEXT NOT NULL,
    hash_after TEXT NOT NULL,
    part BLOB NOT NULL,
    owner TEXT,
    PRIMARY KEY (key, seq)
);
CREATE TABLE IF NOT EXISTS removals (path TEXT NOT NULL, after_id INTEGER NOT NULL, time REAL NOT NULL);
CREATE INDEX IF NOT EXISTS removals_by_path ON removals (path, after_id);
"""


def iso_time(t: float) -> str:
    """``t`` (seconds since the epoch) as ISO 8601 UTC with milliseconds."""
    return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_time(value: str, name: str = "since") -> float:
    """An ISO 8601 time (UTC when it has no zone) as seconds since the epoch; 400 naming ``name``."""
    text = value.strip()
    try:
        parsed = datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith(("Z", "z")) else text)
    except ValueError:
        raise BadRequest(
            f"'{name}' must be an ISO 8601 time such as 2026-01-31T12:00:00Z, got {value[:60]!r}"
        ) from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=timezone.utc)
    return parsed.timestamp()


def parse_change_id(value: str) -> int:
    """A change id from a route or query (a positive integer as text); 400 otherwise."""
    text = value.strip()
    if not text.isascii() or not text.isdigit() or len(text) > ID_PATTERN_DIGITS or int(text) < 1:
        raise BadRequest(f"A change id is a positive integer such as '12', got {value[:60]!r}")
    return int(text)


def check_hash(value: str, name: str = "since") -> str:
    """A notebook hash as the extension answers it (64 hex digits); 400 otherwise."""
    text = value.strip().lower()
    if len(text) != HASH_CHARS or any(c not in "0123456789abcdef" for c in text):
        raise BadRequest(
            f"'{name}' must be a notebook hash as a read or an edit answered it (64 hex digits), "
            f"got {value[:80]!r}"
        )
    return text


def list_limit(value: int | None) -> int:
    if value is None:
        return DEFAULT_LIST_LIMIT
    if not 1 <= value <= MAX_LIST_LIMIT:
        raise BadRequest(f"'limit' must be an integer from 1 to {MAX_LIST_LIMIT}, got {value}")
    return value


class LedgerLost(Exception):
    """The database file was removed or overwritten under the running server (a new one is started)."""


class LedgerFull(Exception):
    """The database is at max_bytes and pruning has not made room yet (the change is not recorded)."""


@dataclass
class Recorded:
    """Whether a change was recorded, and its id; whether it can be undone, and a note for the caller
    when it cannot (or when nothing changed, so nothing was recorded)."""

    change_id: str | None
    recorded: bool
    undoable: bool | None = None
    note: str | None = None

    def fields(self) -> dict[str, Any]:
        found: dict[str, Any] = {"change_id": self.change_id, "recorded": self.recorded}
        if self.undoable is not None:
            found["undoable"] = self.undoable
        if self.note is not None:
            found["note"] = self.note
        return found


NOTHING_CHANGED = "Nothing changed (the notebook is as it was), so no change was recorded."
NO_IDS = (
    'Send one edit with "upgrade": true (the CLI\'s --upgrade) to give the cells ids (nbformat 4.5): '
    "changes after that can be undone."
)


def undo_note(reason: str) -> str:
    """What a caller is told about a recorded change that cannot be undone, and how to fix it."""
    note = f"This change cannot be undone: {reason}."
    return f"{note} {NO_IDS}" if "no ids" in reason else note


@dataclass
class ChangeGroup:
    """Several writes recorded as one change (a notebook run): see :meth:`Ledger.group`."""

    path: str
    kind: str
    change: NotebookChange | None = None
    hash_before: str | None = None
    hash_after: str | None = None
    result: Recorded | None = None
    failed: bool = False
    # The version the last write left (its notebook, and its snapshot when derived), which is
    # remembered once when the group ends (the versions in between are never answered to anyone).
    last: dict[str, Any] | None = None
    snapshot: Snapshot | None = None
    # Each write is also kept as a part in the database until the group ends: a server killed
    # meanwhile (a notebook run lost to a restart) leaves them, and the next start records them.
    key: str = field(default_factory=lambda: secrets.token_hex(8))
    parts: int = 0
    unsaved: tuple[str, NotebookChange] | None = None  # (hash before, merged change) since the last part

    def fields(self) -> dict[str, Any]:
        """``change_id`` and ``recorded`` for the answer of the grouped writes (none: nothing written)."""
        return self.result.fields() if self.result is not None else {}


_GROUP: contextvars.ContextVar[ChangeGroup | None] = contextvars.ContextVar(
    "jupyter_agent_tools_change_group", default=None
)


@dataclass
class UndoPlan:
    """A recorded change as an undo needs it: its summary fields and its cells with their bodies."""

    entry: dict[str, Any]
    cells: list[CellChange]
    not_undoable: str | None
    replaced: str | None = None  # how the file at its path was replaced by another since (409)


class Ledger(Service):
    """Records notebook changes in SQLite and answers what changed; see the module doc.

    The application builds the class named by ``AgentToolsApp.ledger_class`` with ``parent=app`` and
    ``db_path``, ``max_changes_per_notebook``, ``max_bytes``.
    """

    db_path = Unicode(
        help="The SQLite file of the change ledger (every change the extension makes to a notebook, for "
        "review and undo). Empty: agent_tools_ledger.db in AgentStores.state_dir (the Jupyter data "
        "directory by default).",
    ).tag(config=True)
    max_changes_per_notebook = Int(
        200,
        help="Changes the ledger keeps per notebook; the oldest are pruned first. 0: the ledger records "
        "nothing (no undo, no 'since').",
    ).tag(config=True)
    max_bytes = Int(
        256 * MIB,
        help="Bytes the ledger's database may take; past it the oldest changes (of any notebook) are pruned "
        "first. At least 262144 (256 KiB).",
    ).tag(config=True)
    audit = Instance(Audit, help="Told each recorded change (the ledger_change audit event).")

    @default("audit")
    def _default_audit(self) -> Audit:
        return NO_AUDIT

    @default("db_path")
    def _default_db_path(self) -> str:
        return AgentStores(parent=self).path("agent_tools_ledger.db")

    @validate("max_changes_per_notebook")
    def _valid_max_changes(self, proposal: Any) -> int:
        return int(at_least(proposal, 0))

    @validate("max_bytes")
    def _valid_max_bytes(self, proposal: Any) -> int:
        return in_range(proposal, MIN_BYTES, 1024**4)

    @validate("db_path")
    def _valid_db_path(self, proposal: Any) -> str:
        return str(proposal["value"]) or self._default_db_path()

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self._worker = Worker("agent-tools-ledger")
        self._options = store_options(self)
        self._conn: sqlite3.Connection | None = None  # the worker thread's own
        self._identity: tuple[int, int] | None = None  # (device, inode) of the file it opened
        self._failing: str | None = None  # what failed last (logged once until it works again)
        self._fail_lock = threading.Lock()
        # Worker thread only: the latest snapshots (notebook hash -> (snapshot, time)).
        self._snapshots: OrderedDict[str, tuple[Snapshot, float]] = OrderedDict()
        self._snapshot_cells = 0
        # Worker thread only: what recorded changes left each cell in, by notebook (see agent_state).
        self._states: OrderedDict[str, AgentState] = OrderedDict()
        # Event loop only: hashes already remembered; snapshots queued for the worker.
        self._known: OrderedDict[str, None] = OrderedDict()
        self._pending = 0
        self._closed = False
        self._prune_target: int | None = None  # worker only: the bytes in use a background prune aims at
        self._beating = False

    @property
    def _wal_bytes(self) -> int:
        """The write-ahead log is checkpointed (and cut back) at a 16th of max_bytes, 4 MB at most."""
        return max(1, min(1000, self.max_bytes // 4096 // 16)) * 4096

    @property
    def enabled(self) -> bool:
        return self.max_changes_per_notebook > 0 and not self._closed

    def start(self) -> None:
        """Open the database in the worker now (at server start), so the server's descriptors are steady
        from then on rather than growing by the database's three files at the first change or read. A
        database that cannot be opened is logged once and tried again at the next change."""
        if self.enabled:
            self._submit(self._open_quietly)

    def _open_quietly(self) -> None:
        try:
            self._db()
            self._finish_lost_groups()
        except Exception as e:
            # broad: the ledger never fails the action it records: any failure (SQLite, disk, a damaged row)
            # degrades it (_failed)
            self._failed("open its database", e)

    # -- groups a stopped server left unfinished ---------------------------------------------------

    def _keep_part(
        self,
        group: ChangeGroup,
        seq: int,
        change: NotebookChange,
        hash_before: str,
        hash_after: str,
        user: str | None,
        via: str | None,
    ) -> None:
        """Worker: keep one write of an unfinished group (not waited for; a failure is logged)."""
        try:
            part = zlib.compress(encode_change(change), 1)
            conn = self._db()
            if not self._make_room(conn, len(part)):
                raise LedgerFull("the ledger is at its max_bytes")
            conn.execute(
                "INSERT OR REPLACE INTO group_parts (key, seq, pid, path, kind, user, via, hash_before, "
                "hash_after, part, owner) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    group.key,
                    seq,
                    os.getpid(),
                    group.path,
                    group.kind,
                    user,
                    via,
                    hash_before,
                    hash_after,
                    part,
                    this_process().key,
                ),
            )
        except Exception as e:
            # broad: the ledger never fails the action it records: any failure (SQLite, disk, a damaged row)
            # degrades it (_failed)
            self._failed("record a run's writes as they happen", e)

    def _drop_parts(self, key: str) -> None:
        """Worker: the group ended (and was recorded, or not): its parts are not needed."""
        try:
            self._db().execute("DELETE FROM group_parts WHERE key = ?", (key,))
        except Exception as e:
            # broad: the ledger never fails the action it records: any failure (SQLite, disk, a damaged row)
            # degrades it (_failed)
            self._failed("record changes", e)

    def _finish_lost_groups(self) -> None:
        """Worker, at start: record the writes of each group whose server process is gone (a notebook run
        it was running when it was killed or stopped) as one change, as its end would have."""
        conn = self._db()
        keys = conn.execute("SELECT DISTINCT key, pid, owner FROM group_parts").fetchall()
        alive = alive_owners(conn, [owner for _, _, owner in keys], self._options.owner_timeout)
        for key, pid, owner in keys:
            if owner == this_process().key or owner in alive:
                continue  # this process's own, or another live server on this ledger is running it
            if owner is None and pid != os.getpid() and pid_alive(pid):
                continue  # (a part written before process identities: its PID is all there is)
            rows = conn.execute(
                "SELECT path, kind, user, via, hash_before, hash_after, part FROM group_parts WHERE key = ? "
                "ORDER BY seq",
                (key,),
            ).fetchall()
            change: NotebookChange | None = None
            for row in rows:
                part = decode_change(zlib.decompress(row[6]))
                change = part if change is None else merge(change, part)
            if change is not None and change.cells:
                path, kind, user, via = rows[0][:4]
                action = f"{summarize(change, kind)} (the server stopped during it)"
                self._insert(path, kind, action, change, rows[0][4], rows[-1][5], None, user, via, False)
                self.log.info(
                    "change ledger: recorded the writes of a %s of %s the server stopped", kind, path
                )
            conn.execute("DELETE FROM group_parts WHERE key = ?", (key,))

    # -- the worker ------------------------------------------------------------------------------

    def _submit(self, func: Callable[..., T], *args: Any) -> Future[T]:
        return self._worker.submit(func, *args)  # (failed with RuntimeError once the server stops)

    async def _run(self, func: Callable[..., T], *args: Any) -> T:
        return await asyncio.wrap_future(self._submit(func, *args))

    def _db(self) -> sqlite3.Connection:
        """The worker's connection, opened (and the schema made) on first use; when its file was removed
        or overwritten since, a new ledger is started (see :meth:`_check_file`)."""
        if self._conn is not None:
            if self.db_path != ":memory:":
                self._check_file()
            return self._conn
        path = self.db_path
        shared = journal_for(path, self._options.journal) == "delete"  # a network filesystem: one lock
        conn = open_store(
            path,
            label="change ledger",
            logger=self.log,
            options=self._options,
            timeout=SHARED_LOCK_TIMEOUT if shared else LOCK_TIMEOUT,
            setup=self._setup,
            before_journal=["PRAGMA auto_vacuum = INCREMENTAL"],  # takes effect on a new database only
        )
        if path != ":memory:" and not self._beating:
            self._beating = True
            self._worker.every(self._options.heartbeat, self._beat)
        self._conn = conn
        if path != ":memory:":
            info = os.stat(path)
            self._identity = (info.st_dev, info.st_ino)
        return conn

    def _setup(self, conn: sqlite3.Connection) -> None:
        # The write-ahead log counts against max_bytes too (see _make_room).
        conn.execute(f"PRAGMA wal_autocheckpoint = {self._wal_bytes // 4096}")
        conn.execute(f"PRAGMA journal_size_limit = {self._wal_bytes}")
        conn.executescript(SCHEMA + OWNERS_SCHEMA + ";")
        columns = {row[1] for row in conn.execute("PRAGMA table_info(changes)")}
        if "overwrites" not in columns:  # a database made before overwrites were recorded
            conn.execute("ALTER TABLE changes ADD COLUMN overwrites TEXT")
        if "approved_by" not in columns:  # a database made before the approval gate
            conn.execute("ALTER TABLE changes ADD COLUMN approved_by TEXT")
        if "owner" not in {row[1] for row in conn.execute("PRAGMA table_info(group_parts)")}:
            conn.execute("ALTER TABLE group_parts ADD COLUMN owner TEXT")  # before process identities
        beat(conn)

    def _beat(self) -> None:
        """Worker, every heartbeat: this server process still runs (see stores.owner_alive)."""
        if self._conn is not None:
            beat(self._conn)

    def _leave(self) -> None:
        """Worker: the server stops: its heartbeat goes, then the connection."""
        if self._conn is not None:
            leave(self._conn)
        self._reset()

    def _check_file(self) -> None:
        """Worker: raise :class:`LedgerLost` (after starting a new, empty ledger) when the database file
        was removed, replaced or overwritten with something else since it was opened: SQLite would go on
        writing to the removed file, or into garbage, and answer every change recorded."""
        path = self.db_path
        try:
            info = os.stat(path)
            with open(path, "rb") as f:
                intact = f.read(len(SQLITE_HEADER)) == SQLITE_HEADER
        except FileNotFoundError:
            info, intact = None, False
        if intact and info is not None and (info.st_dev, info.st_ino) == self._identity:
            return
        self._reset()
        kept = ""
        if info is not None:  # overwritten or replaced: kept aside for whoever wants to look at it
            aside = f"{path}.corrupt-{time.strftime('%Y%m%dT%H%M%S')}"
            os.replace(path, aside)
            kept = f" (the file found there is kept as {aside})"
        for suffix in ("-wal", "-shm", "-journal"):  # (the old log must not be applied to the new file)
            with contextlib.suppress(FileNotFoundError):
                os.remove(path + suffix)
        what = "overwritten or replaced" if info is not None else "removed"
        self.log.warning(
            "The change ledger's file %s was %s while the server ran%s: the changes recorded in it are "
            "gone. A new ledger is started there; this change is not recorded, the next ones are.",
            path,
            what,
            kept,
        )
        raise LedgerLost(f"its file was {what} while the server ran")

    def _failed(self, what: str, error: BaseException) -> None:
        """Log a failure of the database once (until it works again)."""
        with self._fail_lock:
            first = self._failing is None
            self._failing = what
        if first and not isinstance(error, LedgerLost):  # (that one said what happened itself)
            self.log.warning(
                "The change ledger (%s) cannot %s: %s. Changes are still made; they are answered "
                '"recorded": false until the ledger works again.',
                self.db_path,
                what,
                error,
            )
        if isinstance(error, sqlite3.DatabaseError) and not isinstance(error, sqlite3.OperationalError):
            self._submit(self._reset)  # a corrupt file: open it again next time (it may be replaced)

    def _worked(self) -> None:
        if self._failing is not None:
            with self._fail_lock:
                self._failing = None
            self.log.info("The change ledger (%s) records changes again.", self.db_path)

    def _reset(self) -> None:
        """Worker: close the connection (the next use opens the file again)."""
        self._states.clear()
        if self._conn is not None:
            with contextlib.suppress(sqlite3.Error):
                self._conn.close()
            self._conn = None

    # -- recording -------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def group(self, path: str, kind: str) -> AsyncIterator[ChangeGroup]:
        """Record the writes to ``path`` made inside the block (and the tasks it starts) as one change.

        ``group.fields()`` after the block: the change's id and whether it was recorded.
        """
        group = ChangeGroup(path, kind)
        token = _GROUP.set(group)
        try:
            yield group
        finally:
            try:
                _GROUP.reset(token)
            except ValueError:  # closed from another context (a cancelled run's generator, finalized there)
                _GROUP.set(None if token.old_value is contextvars.Token.MISSING else token.old_value)
            if group.change is not None and group.change.cells:
                assert group.hash_before is not None and group.hash_after is not None
                group.result = await self._commit(
                    path, group.kind, group.change, group.hash_before, group.hash_after, None, group.failed
                )
            if group.parts:
                self._submit(self._drop_parts, group.key)
            if group.hash_after is not None and group.last is not None:  # after: the answer waits for it
                self._known[group.hash_after] = None
                self._submit(self._remember, path, group.hash_after, group.last, None, group.snapshot)

    def grouping(self, path: str) -> bool:
        """Whether writes to ``path`` made here join a group (see :meth:`group`)."""
        group = _GROUP.get()
        return self.enabled and group is not None and group.path == path

    async def record(
        self,
        path: str,
        before: dict[str, Any],
        after: dict[str, Any],
        hash_before: str,
        hash_after: str,
        *,
        kind: str = "edit",
        undoes: str | None = None,
        saved: bool = True,
    ) -> Recorded | None:
        """Record one write of ``path`` (from ``before`` to ``after``); None when it is part of a group
        (see :meth:`group`) or the ledger is off. ``saved``: False for a push to a live room while a
        cell runs (it joins its group only)."""
        if not self.enabled:
            return None
        group = _GROUP.get()
        if group is not None and group.path == path:
            # Pure computation on the cells the write touched (no I/O): done here, not in the worker,
            # which would only add a thread hop per write of the run (hashing holds the GIL anyway).
            self._add_to_group(group, before, after, hash_before, hash_after, saved)
            return None
        user, via = current_user(), current_via()
        action_kind = kind if undoes is None else f"undo {undoes}"
        args = (path, kind, action_kind, before, after, hash_before, hash_after, undoes, user, via)
        recording = self._submit(
            self._record_one, *args, current_approver()
        )  # first: the answer waits for it, not a snapshot
        self.remember(path, hash_after, after, base=(hash_before, before))
        return await self._recorded(recording)

    async def _recorded(self, recording: Future[Any]) -> Recorded:
        """What a submitted insert answers: its change id (and why it cannot be undone), not recorded
        because nothing changed, or not recorded (logged once). A recorded change is told to the audit
        (its ``ledger_change`` event: a review panel's live feed)."""
        try:
            inserted: tuple[dict[str, Any], str | None] | None = await asyncio.wrap_future(recording)
        except Exception as e:
            # broad: the ledger never fails the action it records: any failure (SQLite, disk, a damaged row)
            # degrades it (_failed)
            self._failed("record changes", e)
            return Recorded(None, False)
        self._worked()
        if inserted is None:
            return Recorded(None, False, note=NOTHING_CHANGED)
        entry, not_undoable = inserted
        self.audit.ledger_change(entry)
        if not_undoable is None:
            return Recorded(entry["id"], True, True)
        return Recorded(entry["id"], True, False, undo_note(not_undoable))

    def _record_one(
        self,
        path: str,
        kind: str,
        action_kind: str,
        before: dict[str, Any],
        after: dict[str, Any],
        hash_before: str,
        hash_after: str,
        undoes: str | None,
        user: str | None,
        via: str | None,
        approved_by: str | None = None,
    ) -> tuple[dict[str, Any], str | None] | None:
        """Worker: what one write did, entered in the database (one round trip from the event loop)."""
        change = diff(before, after)
        if not change.cells and kind != "create" and _outside_cells(before) == _outside_cells(after):
            return None  # nothing changed: nothing to review or undo (creating a file is a change)
        action = summarize(change, action_kind)
        return self._insert(
            path,
            kind,
            action,
            change,
            hash_before,
            hash_after,
            undoes,
            user,
            via,
            False,
            approved_by=approved_by,
        )

    def _add_to_group(
        self,
        group: ChangeGroup,
        before: dict[str, Any],
        after: dict[str, Any],
        hash_before: str,
        hash_after: str,
        saved: bool,
    ) -> None:
        """Merge one write into its group's change (a bug here is logged; it never fails the write);
        ``saved``: the write was saved (not only pushed to a live room while a cell runs)."""
        try:
            change = diff(before, after)
            group.change = change if group.change is None else merge(group.change, change)
            if group.hash_before is None:
                group.hash_before = hash_before
            # The snapshot of the version this write left, from the previous one's (in memory only).
            base = group.snapshot if group.hash_after == hash_before else None
            if base is None:
                cached = self._snapshots.get(hash_before)  # (a read of the worker's cache: atomic)
                base = cached[0] if cached is not None else None
            group.snapshot = snapshot_of(after, (before, base)) if base is not None else None
            group.last = after
            group.hash_after = hash_after
            if change.cells:
                # Kept for a restart at each save; the pushes to a live room in between (every
                # fraction of a second while a cell prints) are merged into the next save's part.
                unsaved = group.unsaved
                group.unsaved = (
                    (hash_before, change) if unsaved is None else (unsaved[0], merge(unsaved[1], change))
                )
            if saved and group.unsaved is not None:
                first, merged = group.unsaved
                group.unsaved = None
                group.parts += 1
                args = (group, group.parts, merged, first, hash_after, current_user(), current_via())
                self._submit(self._keep_part, *args)
        except Exception:
            # broad: the ledger never fails the action it records: any failure (SQLite, disk, a damaged row)
            # degrades it (_failed)
            self.log.exception("change ledger: cannot compute a change of %s", group.path)
            group.failed = True

    async def _commit(
        self,
        path: str,
        kind: str,
        change: NotebookChange,
        hash_before: str,
        hash_after: str,
        undoes: str | None,
        incomplete: bool,
    ) -> Recorded:
        user, via = current_user(), current_via()
        action = summarize(change, kind if undoes is None else f"undo {undoes}")
        args = (path, kind, action, change, hash_before, hash_after, undoes, user, via, incomplete)
        inserting = functools.partial(self._insert, *args, approved_by=current_approver())
        return await self._recorded(self._submit(inserting))

    def _insert(
        self,
        path: str,
        kind: str,
        action: str,
        change: NotebookChange,
        hash_before: str,
        hash_after: str,
        undoes: str | None,
        user: str | None,
        via: str | None,
        incomplete: bool,
        overwrites: list[str] | None = None,
        approved_by: str | None = None,
    ) -> tuple[dict[str, Any], str | None]:
        """Worker: enter a change in the database; its entry (as the list routes answer it) and why it
        cannot be undone (None: it can); ``approved_by``: who approved it (the approval gate)."""
        summary, body, blobs = _encode(change.cells)
        size = len(summary) + len(body) + sum(len(b) for b in blobs.values())
        if size > self.max_bytes // MAX_ENTRY_SHARE:
            raise ValueError(f"the change takes {size} bytes, more than max_bytes / {MAX_ENTRY_SHARE}")
        not_undoable = change.not_undoable
        if incomplete:
            not_undoable = "some of its writes could not be recorded"
        if kind == "upgrade":
            not_undoable = "it upgraded the file to nbformat 4.5 (its checkpoint has the old file)"
        if kind == "create":
            not_undoable = "it created the notebook (delete the file to undo it)"
        conn = self._db()
        if not self._make_room(conn, size):  # first: the files never grow past max_bytes
            raise LedgerFull(
                f"the ledger is at its max_bytes ({self.max_bytes}) and prunes older changes in the "
                "background"
            )
        now = time.time()
        conn.execute("BEGIN IMMEDIATE")
        try:
            cursor = conn.execute(
                "INSERT INTO changes (time, path, user, via, kind, action, hash_before, hash_after, undoes, "
                "not_undoable, cells, body, bytes, overwrites, approved_by) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    now,
                    path,
                    user,
                    via,
                    kind,
                    action,
                    hash_before,
                    hash_after,
                    int(undoes) if undoes is not None else None,
                    not_undoable,
                    summary,
                    body,
                    size,
                    json.dumps(overwrites) if overwrites else None,
                    approved_by,
                ),
            )
            change_id = int(cast(int, cursor.lastrowid))
            for blob_hash, data in blobs.items():
                conn.execute(
                    "INSERT OR IGNORE INTO blobs (hash, data, bytes) VALUES (?, ?, ?)",
                    (blob_hash, data, len(data)),
                )
                conn.execute("INSERT OR IGNORE INTO change_blobs VALUES (?, ?)", (change_id, blob_hash))
            self._prune_notebook(conn, path)
            conn.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            raise
        self._settle(conn)
        self._states.pop(path, None)
        undone = int(undoes) if undoes is not None else None
        row = (change_id, now, path, user, via, kind, action, hash_before, hash_after, undone)
        return _entry(
            (*row, not_undoable, summary, json.dumps(overwrites) if overwrites else None, approved_by)
        ), not_undoable

    # -- saves through the contents API -----------------------------------------------------------

    async def has_changes(self, path: str) -> bool:
        """Whether recorded changes left cells of ``path`` that a save could overwrite (cheap: kept in
        memory after the first ask; False when the ledger cannot be read, so a save never waits on it)."""
        if not self.enabled:
            return False
        try:
            return bool(await self._run(self._agent_state, path))
        except Exception as e:
            # broad: the ledger never fails the action it records: any failure (SQLite, disk, a damaged row)
            # degrades it (_failed)
            self._failed("read changes", e)
            return False

    def _agent_state(self, path: str) -> AgentState:
        """Worker: the state the newest recorded changes (not overwrites) left each cell of ``path`` in."""
        found = self._states.get(path)
        if found is not None:
            self._states.move_to_end(path)
            return found
        rows = self._db().execute(
            "SELECT id, cells FROM changes WHERE path = ? AND kind != 'overwrite' AND id > coalesce("
            "(SELECT max(after_id) FROM removals WHERE path = ?), 0) ORDER BY id DESC LIMIT ?",
            (path, path, max(1, self.max_changes_per_notebook)),
        )
        state = agent_state([(str(row[0]), json.loads(row[1])) for row in rows])
        self._states[path] = state
        while len(self._states) > AGENT_STATE_MEMORY:
            self._states.popitem(last=False)
        return state

    async def record_save(
        self, path: str, before: dict[str, Any], after: dict[str, Any], hash_before: str, hash_after: str
    ) -> Recorded | None:
        """Record a save through the contents API (from ``before`` to ``after``) as an ``overwrite`` by
        the acting user when it overwrote cells recorded changes left (see :mod:`.overwrite`); None when
        it overwrote nothing. Never raises: a failure is logged and answered not recorded."""
        if not self.enabled:
            return None
        user = current_user()
        try:
            found = await self._run(self._overwritten, path, before, after)
        except Exception as e:
            # broad: the ledger never fails the action it records: any failure (SQLite, disk, a damaged row)
            # degrades it (_failed)
            self._failed("record changes", e)
            return Recorded(None, False)
        if found is None:
            return None
        change, overwrites = found
        action = overwrite_summary(change, overwrites)
        args = (path, "overwrite", action, change, hash_before, hash_after, None, user, "contents", False)
        recording = self._submit(self._insert, *args, overwrites)
        self.remember(path, hash_after, after, base=(hash_before, before))
        return await self._recorded(recording)

    def _overwritten(
        self, path: str, before: dict[str, Any], after: dict[str, Any]
    ) -> tuple[NotebookChange, list[str]] | None:
        return overwritten(self._agent_state(path), before, after)

    def _prune_notebook(self, conn: sqlite3.Connection, path: str) -> None:
        """Keep the newest ``max_changes_per_notebook`` changes and twice as many snapshots of ``path``."""
        keep = self.max_changes_per_notebook
        old = [
            row[0]
            for row in conn.execute(
                "SELECT id FROM changes WHERE path = ? ORDER BY id DESC LIMIT -1 OFFSET ?", (path, keep)
            )
        ]
        self._delete_changes(conn, old)
        conn.execute(
            "DELETE FROM snapshots WHERE hash IN (SELECT hash FROM snapshots WHERE path = ? "
            "ORDER BY time DESC LIMIT -1 OFFSET ?)",
            (path, keep * SNAPSHOTS_PER_CHANGE),
        )

    def _delete_changes(self, conn: sqlite3.Connection, ids: list[int]) -> None:
        for start in range(0, len(ids), 500):
            chunk = ids[start : start + 500]
            marks = ",".join("?" * len(chunk))
            conn.execute(f"DELETE FROM changes WHERE id IN ({marks})", chunk)
            hashes = conn.execute(
                f"SELECT DISTINCT hash FROM change_blobs WHERE change_id IN ({marks})", chunk
            ).fetchall()
            conn.execute(f"DELETE FROM change_blobs WHERE change_id IN ({marks})", chunk)
            for (blob_hash,) in hashes:  # (by index: no scan of every blob)
                conn.execute(
                    "DELETE FROM blobs WHERE hash = ? AND NOT EXISTS "
                    "(SELECT 1 FROM change_blobs WHERE hash = ?)",
                    (blob_hash, blob_hash),
                )
        if ids:
            self._states.clear()

    def used_bytes(self, conn: sqlite3.Connection | None = None) -> int:
        """Bytes of the database's pages in use (worker thread)."""
        conn = conn or self._db()
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        free = conn.execute("PRAGMA freelist_count").fetchone()[0]
        return int((pages - free) * page_size)

    def _make_room(self, conn: sqlite3.Connection, incoming: int) -> bool:
        """Whether a write of ``incoming`` bytes fits: in WAL mode a write lands in the log first (its
        pages, about twice its bytes with index pages, on top of a log of up to its checkpoint size), then
        in the file at the checkpoint; both together stay within ``max_bytes``.

        Pruning is not waited for: past :data:`PRUNE_AT` of the room the oldest changes are pruned in the
        background (:meth:`_prune_later`); a write that does not fit yet frees room for itself by deleting
        old changes (milliseconds a step: pages are freed for reuse, not given back to the file system) for
        at most :data:`INLINE_PRUNE_SECONDS`, else it is not written."""
        room = self.max_bytes - self._wal_bytes - 2 * (incoming + SLACK_BYTES)
        used = self.used_bytes(conn)
        if used > room * PRUNE_AT:
            self._prune_later(int(room * PRUNE_TO))
        deadline = time.monotonic() + INLINE_PRUNE_SECONDS
        while used > room and time.monotonic() < deadline and self._prune_step(conn):
            used = self.used_bytes(conn)
        return used <= room

    def _settle(self, conn: sqlite3.Connection) -> None:
        """Near the limit, empty the log after a write (it would otherwise keep its checkpoint size)."""
        if self.db_bytes() > self.max_bytes - 2 * self._wal_bytes:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()

    def _prune_later(self, target: int) -> None:
        """Worker: prune to ``target`` bytes in use in the background: one step per task of the worker,
        so the writes queued meanwhile go between steps (one prune at a time)."""
        if self._prune_target is None:
            self._prune_target = target
            self._submit(self._prune_task)
        else:
            self._prune_target = min(self._prune_target, target)

    def _prune_task(self) -> None:
        """Worker: one step of a background prune (delete old changes, then give free pages back to the
        file system a slice at a time), and the next step queued behind the writes waiting now."""
        if self._closed or self._prune_target is None:
            self._prune_target = None
            return
        try:
            conn = self._db()
            if os.path.exists(self.db_path + "-wal") and os.path.getsize(self.db_path + "-wal"):
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()  # a step's log starts empty
            # Free pages are given back first: the file shrinks before the next deletions use the log.
            free = conn.execute("PRAGMA freelist_count").fetchone()[0]
            done = not (free * 4096 >= self._wal_bytes // 4 and self._vacuum_slice(conn))
            if done and self.used_bytes(conn) > self._prune_target:
                done = not self._prune_step(conn)
            if done and not self._vacuum_slice(conn):
                self._prune_target = None
                return
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        except Exception as e:
            # broad: the ledger never fails the action it records: any failure (SQLite, disk, a damaged row)
            # degrades it (_failed)
            self._prune_target = None
            self._failed("prune old changes", e)
            return
        self._submit(self._prune_task)

    def _prune_step(self, conn: sqlite3.Connection) -> bool:
        """Delete the oldest changes (about a quarter of the log's size of them, so the log never swells
        past the room kept for it) and snapshots older than every change left; False: nothing to delete."""
        step = max(4096, self._wal_bytes // 4)
        conn.execute("BEGIN IMMEDIATE")
        try:
            chosen, total = [], 0
            for change_id, size in conn.execute(
                "SELECT id, bytes FROM changes ORDER BY id LIMIT ?", (PRUNE_STEP_CHANGES,)
            ):
                chosen.append(change_id)
                total += size
                if total >= step:
                    break
            self._delete_changes(conn, chosen)
            oldest = conn.execute("SELECT min(time) FROM changes").fetchone()[0]
            removed = conn.execute(
                "DELETE FROM snapshots WHERE hash IN (SELECT hash FROM snapshots WHERE time < ? "
                "ORDER BY time LIMIT 20)",
                (oldest if oldest is not None else float("inf"),),
            ).rowcount
            conn.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            raise
        return bool(chosen or removed)

    def _vacuum_slice(self, conn: sqlite3.Connection) -> bool:
        """Give a few free pages back to the file system and checkpoint the log; False: none were."""
        free = conn.execute("PRAGMA freelist_count").fetchone()[0]
        if not free:
            return False
        # executescript steps the pragma to its end: execute() (even with fetchall) frees one page only,
        # which made a prune of 10% of a 16 MB ledger take ~20 s, one page and one checkpoint at a time
        # and moved pages go through the log: at most a quarter of the room kept for it at once
        pages = max(1, min(VACUUM_PAGES, self._wal_bytes // 4096 // 4))
        conn.executescript(f"PRAGMA incremental_vacuum({pages});")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        # a database made without incremental auto-vacuum keeps its free pages for reuse
        return bool(conn.execute("PRAGMA freelist_count").fetchone()[0] < free)

    # -- snapshots -------------------------------------------------------------------------------

    def remember(
        self, path: str, hash_: str, nb: dict[str, Any], base: tuple[str, dict[str, Any]] | None = None
    ) -> None:
        """Remember the cells' hashes of the version ``hash_`` of ``path`` (not waited for; dropped when
        the worker is far behind). ``base``: an earlier version (hash, notebook) it was made from."""
        if not self.enabled or hash_ in self._known or self._pending >= MAX_PENDING_SNAPSHOTS:
            if hash_ in self._known:
                self._known.move_to_end(hash_)
            return
        self._known[hash_] = None
        while len(self._known) > KNOWN_HASHES:
            self._known.popitem(last=False)
        self._pending += 1
        loop = asyncio.get_running_loop()

        def done(_: Future[Any]) -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(self._remembered)

        self._submit(self._remember, path, hash_, nb, base).add_done_callback(done)

    def _remembered(self) -> None:
        self._pending -= 1

    def _remember(
        self,
        path: str,
        hash_: str,
        nb: dict[str, Any],
        base: tuple[str, dict[str, Any]] | None,
        made: Snapshot | None = None,
    ) -> None:
        """Worker: keep the snapshot of version ``hash_`` (``made``: already computed)."""
        if hash_ in self._snapshots:
            self._snapshots.move_to_end(hash_)
            return
        try:
            conn = self._db()
            row = conn.execute("SELECT cells, time FROM snapshots WHERE hash = ?", (hash_,)).fetchone()
            if row is not None:
                self._keep(hash_, Snapshot.decode(row[0]), row[1])
                return
            known = self._snapshots.get(base[0]) if base is not None else None
            snapshot = made or snapshot_of(nb, (base[1], known[0]) if base is not None and known else None)
            now = time.time()
            self._keep(hash_, snapshot, now)
            data = snapshot.encode()
            if len(data) > self.max_bytes // MAX_ENTRY_SHARE:
                return  # remembered in memory only: it would take too much of the database
            if not self._make_room(conn, len(data)):
                return  # remembered in memory only until pruning made room
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.execute(
                    "INSERT OR IGNORE INTO snapshots (hash, path, time, cells) VALUES (?, ?, ?, ?)",
                    (hash_, path, now, data),
                )
                conn.execute(
                    "DELETE FROM snapshots WHERE hash IN (SELECT hash FROM snapshots WHERE path = ? "
                    "ORDER BY time DESC LIMIT -1 OFFSET ?)",
                    (path, self.max_changes_per_notebook * SNAPSHOTS_PER_CHANGE),
                )
                conn.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
                raise
            self._settle(conn)
        except Exception as e:
            # broad: the ledger never fails the action it records: any failure (SQLite, disk, a damaged row)
            # degrades it (_failed)
            self._failed("remember notebook versions", e)

    def _keep(self, hash_: str, snapshot: Snapshot, when: float) -> None:
        self._snapshots[hash_] = (snapshot, when)
        self._snapshot_cells += len(snapshot)
        while self._snapshot_cells > SNAPSHOT_MEMORY_CELLS and len(self._snapshots) > 1:
            _, (dropped, _) = self._snapshots.popitem(last=False)
            self._snapshot_cells -= len(dropped)

    def _snapshot(self, conn: sqlite3.Connection, hash_: str) -> tuple[Snapshot, float] | None:
        found = self._snapshots.get(hash_)
        if found is not None:
            return found
        row = conn.execute("SELECT cells, time FROM snapshots WHERE hash = ?", (hash_,)).fetchone()
        if row is None:
            return None
        self._keep(hash_, Snapshot.decode(row[0]), row[1])
        return self._snapshots[hash_]

    async def changes_since(self, path: str, since: str, nb: dict[str, Any], hash_: str) -> dict[str, Any]:
        """``changes_since`` of a read: the cells changed since the version ``since`` of ``path``, and by
        whom when a recorded change explains them (see :func:`.since.attribute`)."""
        if not self.enabled:
            return {"since": since, "since_known": False, "cells": []}
        try:
            return await self._run(self._since, path, since, nb, hash_)
        except Exception as e:
            # broad: the ledger never fails the action it records: any failure (SQLite, disk, a damaged row)
            # degrades it (_failed)
            self._failed("read notebook versions", e)
            raise Unavailable(f"The change ledger cannot be read right now: {e}", retry_after=1) from e

    def _since(self, path: str, since: str, nb: dict[str, Any], hash_: str) -> dict[str, Any]:
        if since == hash_:
            return {"since": since, "since_known": True, "cells": []}
        conn = self._db()
        old = self._snapshot(conn, since)
        if old is None:
            return {"since": since, "since_known": False, "cells": []}
        new = self._snapshot(conn, hash_)
        if new is None:
            self._remember(path, hash_, nb, None)
            new = self._snapshot(conn, hash_)
        assert new is not None
        cells = compare(old[0], new[0])
        rows = conn.execute(
            "SELECT id, user, via, cells FROM changes WHERE path = ? AND time >= ? ORDER BY id DESC LIMIT ?",
            (path, old[1], max(1, self.max_changes_per_notebook)),
        ).fetchall()
        entries = [
            {
                "id": str(row[0]),
                "user": display_name(row[1]),
                "via": row[2],
                "by_id": {c["id"]: c for c in json.loads(row[3]) if c.get("id") is not None},
            }
            for row in rows
        ]
        return {"since": since, "since_known": True, "cells": attribute(cells, entries)}

    # -- reading ---------------------------------------------------------------------------------

    async def _read(self, func: Callable[..., T], *args: Any) -> T:
        try:
            return await self._run(func, *args)
        except (NotFound, BadRequest):
            raise
        except Exception as e:
            # broad: the ledger never fails the action it records: any failure (SQLite, disk, a damaged row)
            # degrades it (_failed)
            self._failed("read changes", e)
            raise Unavailable(f"The change ledger cannot be read right now: {e}", retry_after=1) from e

    async def notebook_changes(
        self, path: str, *, limit: int | None = None, before: str | None = None
    ) -> dict[str, Any]:
        """The changes of ``path``, newest first (``before``: only older than that change id)."""
        count = list_limit(limit)
        below = parse_change_id(before) if before is not None else None
        rows = await self._read(self._select, "path = ?", [path], below, count)
        return {"path": path, "changes": rows, "next_before": rows[-1]["id"] if len(rows) == count else None}

    async def recent(self, *, since: str | None = None, limit: int | None = None) -> dict[str, Any]:
        """The changes of every notebook, newest first (``since``: from that ISO time on); for an agent
        limited to paths, of the notebooks inside them only."""
        count = list_limit(limit)
        where, args = "1", []
        if since is not None:
            where, args = "time >= ?", [parse_time(since)]
        scope = current_paths()  # read here: the worker thread does not see the request's context
        inside = None if scope is None else scope.allows
        rows = await self._read(self._select, where, args, None, count, inside)
        return {"changes": rows}

    def _select(
        self,
        where: str,
        args: list[Any],
        below: int | None,
        limit: int,
        inside: Callable[[str], bool] | None = None,
    ) -> list[dict[str, Any]]:
        """Up to ``limit`` entries, newest first; with ``inside``, only those whose path it accepts (the
        rows are read until the page is full, in the worker thread)."""
        if below is not None:
            where, args = f"{where} AND id < ?", [*args, below]
        if inside is None:
            rows = self._db().execute(
                f"SELECT {ENTRY_COLUMNS} FROM changes WHERE {where} ORDER BY id DESC LIMIT ?",
                [*args, limit],
            )
            return [_entry(row) for row in rows]
        found: list[dict[str, Any]] = []
        for row in self._db().execute(
            f"SELECT {ENTRY_COLUMNS} FROM changes WHERE {where} ORDER BY id DESC", args
        ):
            if inside(row[2]):  # the path, before the cells are parsed
                found.append(_entry(row))
                if len(found) >= limit:
                    break
        return found

    async def get(self, path: str, change_id: str) -> dict[str, Any]:
        """One change of ``path`` with each cell's before and after and a diff of each changed source."""
        plan = await self.plan(path, change_id)
        entry = dict(plan.entry)
        entry["cells"] = [
            {**summary, **_bodies(cell)} for summary, cell in zip(entry["cells"], plan.cells, strict=True)
        ]
        return entry

    async def plan(self, path: str, change_id: str) -> UndoPlan:
        """A change of ``path`` with its cells' bodies (outputs kept by reference are read back); 404 for
        an unknown id or a change of another notebook."""
        number = parse_change_id(change_id)
        if self.max_changes_per_notebook <= 0:
            raise NotFound(f"No change {change_id} of {path}: the change ledger is off on this server")
        found = await self._read(self._plan, number)
        if found is None or found.entry["path"] != path:
            raise NotFound(f"No change {number} of {path} (list them: GET .../changes)")
        return found

    def _plan(self, number: int) -> UndoPlan | None:
        conn = self._db()
        row = conn.execute(f"SELECT {ENTRY_COLUMNS}, body FROM changes WHERE id = ?", (number,)).fetchone()
        if row is None:
            return None
        entry = _entry(row[:-1])
        summaries = json.loads(row[ENTRY_CELLS])
        bodies = json.loads(zlib.decompress(row[-1]))

        def blob(ref: str) -> Any:
            found = conn.execute("SELECT data FROM blobs WHERE hash = ?", (ref,)).fetchone()
            if found is None:
                raise NotFound(f"Change {number} refers to outputs that are no longer kept")
            return json.loads(zlib.decompress(found[0]))

        cells = [_decode_cell(s, b, blob) for s, b in zip(summaries, bodies, strict=True)]
        return UndoPlan(entry, cells, row[ENTRY_NOT_UNDOABLE], self._replaced(conn, entry["path"], number))

    @staticmethod
    def _replaced(conn: sqlite3.Connection, path: str, number: int) -> str | None:
        """Worker: how the notebook at ``path`` was replaced by another file after change ``number``
        (None: it was not, as far as the ledger saw). Cell ids derived from a path repeat in a new file
        made there, so the cells alone cannot tell."""
        created = conn.execute(
            "SELECT id FROM changes WHERE path = ? AND kind = 'create' AND id > ? ORDER BY id LIMIT 1",
            (path, number),
        ).fetchone()
        if created is not None:
            return f"it was created again (change {created[0]})"
        removed = conn.execute(
            "SELECT time FROM removals WHERE path = ? AND after_id >= ? ORDER BY after_id LIMIT 1",
            (path, number),
        ).fetchone()
        if removed is not None:
            return f"it was deleted or renamed at {iso_time(removed[0])} and another file made there"
        return None

    async def file_removed(self, path: str) -> None:
        """The file at ``path`` was deleted or renamed away (through the contents API): its recorded
        changes are of a notebook that is gone, and an undo of them is refused from now on. Best effort
        (logged): nothing waits for it."""
        if not self.enabled:
            return
        try:
            await self._run(self._removed, path)
        except Exception as e:
            # broad: the ledger never fails the action it records: any failure (SQLite, disk, a damaged row)
            # degrades it (_failed)
            self._failed("record a removed notebook", e)

    def _removed(self, path: str) -> None:
        conn = self._db()
        newest = conn.execute("SELECT max(id) FROM changes WHERE path = ?", (path,)).fetchone()[0]
        if newest is not None:
            conn.execute("INSERT INTO removals VALUES (?, ?, ?)", (path, newest, time.time()))
            conn.execute("DELETE FROM removals WHERE path = ? AND after_id < ?", (path, newest))
            self._states.pop(path, None)

    def db_bytes(self) -> int:
        """Bytes of the database file and its write-ahead log on disk (what max_bytes bounds; the log's
        index file, ``-shm``, is 32 KB more)."""
        total = 0
        for suffix in ("", "-wal"):
            with contextlib.suppress(OSError):
                total += os.path.getsize(self.db_path + suffix)
        return total

    def close(self) -> None:
        """Finish the queued work and close the database (the server is stopping)."""
        self._closed = True
        self._worker.submit(self._leave)
        self._worker.shutdown(wait=True)


ENTRY_COLUMNS = (
    "id, time, path, user, via, kind, action, hash_before, hash_after, undoes, not_undoable, cells, "
    "overwrites, approved_by"
)
ENTRY_NOT_UNDOABLE = 10
ENTRY_CELLS = 11
ENTRY_OVERWRITES = 12
ENTRY_APPROVED_BY = 13


def _outside_cells(nb: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in nb.items() if k != "cells"}


def _entry(row: Any) -> dict[str, Any]:
    cells = json.loads(row[ENTRY_CELLS])
    return {
        "id": str(row[0]),
        "time": iso_time(row[1]),
        "path": row[2],
        "user": display_name(row[3]),
        "via": row[4],
        "kind": row[5],
        "action": row[6],
        "hash_before": row[7],
        "hash_after": row[8],
        "undoes": str(row[9]) if row[9] is not None else None,
        "undoable": row[ENTRY_NOT_UNDOABLE] is None,
        "cells": [{k: c[k] for k in ("id", "what", "index_before", "index_after")} for c in cells],
        "overwrites": json.loads(row[ENTRY_OVERWRITES]) if row[ENTRY_OVERWRITES] else None,
        "approved_by": row[ENTRY_APPROVED_BY],
    }


def _encode(cells: list[CellChange]) -> tuple[str, bytes, dict[str, bytes]]:
    """(the cells' summary as JSON, their bodies compressed, outputs stored apart by hash)."""
    blobs: dict[str, bytes] = {}

    def part(name: str, value: dict[str, Any]) -> Any:
        if name != "outputs" or not value:
            return value
        data = dumps(value)
        if len(data) <= INLINE_OUTPUT_BYTES:
            return value
        ref = hashlib.sha256(data).hexdigest()
        if ref not in blobs:
            blobs[ref] = zlib.compress(data, 1)
        return {"$ref": ref, "bytes": len(data)}

    summary = [
        {
            "id": c.id,
            "what": c.what,
            "index_before": c.index_before,
            "index_after": c.index_after,
            "prev": c.prev,
            "digest": list(c.digest) if c.digest is not None else None,
        }
        for c in cells
    ]
    bodies = [
        {
            "before": {name: part(name, value) for name, value in c.before.items()},
            "after": {name: part(name, value) for name, value in c.after.items()},
        }
        for c in cells
    ]
    return json.dumps(summary), zlib.compress(dumps(bodies), 1), blobs


def _decode_cell(summary: dict[str, Any], body: dict[str, Any], blob: Callable[[str], Any]) -> CellChange:
    def part(value: dict[str, Any]) -> dict[str, Any]:
        if set(value) == {"$ref", "bytes"}:
            return cast(dict[str, Any], blob(value["$ref"]))
        return value

    digest = summary.get("digest")
    return CellChange(
        summary.get("id"),
        list(summary["what"]),
        summary.get("index_before"),
        summary.get("index_after"),
        summary.get("prev"),
        {name: part(value) for name, value in body["before"].items()},
        {name: part(value) for name, value in body["after"].items()},
        cast(Digest, tuple(digest)) if digest is not None else None,
    )


def _shown(parts: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """A cell's changed parts as an answer shows them: one dict of cell fields, the source as one string."""
    if not parts:
        return None
    shown: dict[str, Any] = {}
    for name in PARTS:
        for key, value in (parts.get(name) or {}).items():
            shown[key] = join_source(value) if key == "source" else value
    return shown


def cell_bodies(cell: CellChange) -> dict[str, Any]:
    """A touched cell as a change's detail shows it: its fields before and after, and its source diff."""
    return _bodies(cell)


def _bodies(cell: CellChange) -> dict[str, Any]:
    before, after = _shown(cell.before), _shown(cell.after)
    fields: dict[str, Any] = {"before": before, "after": after}
    old = before.get("source") if before else None
    new = after.get("source") if after else None
    if old is not None or new is not None:
        name = cell.id or f"@{cell.index_after if cell.index_after is not None else cell.index_before}"
        lines = difflib.unified_diff(
            (old or "").splitlines(keepends=True),
            (new or "").splitlines(keepends=True),
            fromfile=f"{name} (before)",
            tofile=f"{name} (after)",
        )
        fields["diff"] = "".join(line if line.endswith("\n") else line + "\n" for line in lines)
    return fields

"""Agent tokens, stored hashed in SQLite: create, list, revoke, and look one up by its hash.

A token is ``jat_`` and 256 random bits (``secrets.token_urlsafe(32)``). Only its SHA-256 is kept: a fast
hash is right for a high-entropy random secret (nothing to brute-force), and a lookup is then one hash and
one dictionary probe, the same for a right and a wrong token, so a flood of wrong tokens costs the server
nothing more. Every record is held in memory; another process writing the same file (a second server on
the same data directory) is noticed through SQLite's ``PRAGMA data_version`` and the records are read
again. On a local disk the file is in WAL mode and a lookup checks at once (reads never wait on another
process's lock, and a read that still meets a lock keeps the records already held); on a network
filesystem (a rollback journal, where every read takes a lock on the file server) the store's worker
thread checks every :data:`POLL_EVERY` seconds instead, and a lookup reads memory only. The last use of a
token is written at most once a minute, in the worker, best-effort: nothing waits for it. A file that is
locked longer than a change may wait, corrupt (``PRAGMA quick_check`` when it is opened) or cannot be
opened raises :class:`TokenStoreUnavailable` (503) naming it: the store never starts empty in place of a
broken file (a revoked token must stay revoked).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import logging
import secrets
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Any, TypeVar

from ..errors import RETRY_AFTER_MOMENT, BadRequest, Conflict, NotFound, Unavailable
from ..schemas import APPROVAL_ACTIONS as ASK_ACTIONS
from ..schemas import ASKABLE_ACTIONS
from ..stores import (
    StoreError,
    StoreOptions,
    Worker,
    break_stale_lock,
    check,
    journal_for,
    leave_wal,
    locked,
    prepare,
    private_file,
    sqlite_connect,
    vfs_for,
)
from ..wire import TOKEN_MAX_EXPIRES_IN, TOKEN_MIN_EXPIRES_IN
from .paths import GlobError, PathScope
from .scopes import SCOPES, ScopeError, check_name, effective, parse_scopes

TOKEN_PREFIX = "jat_"
# Longest lifetime a token may be given (a token without expiry lives until it is revoked).
MAX_EXPIRES_IN = float(TOKEN_MAX_EXPIRES_IN)
MIN_EXPIRES_IN = float(TOKEN_MIN_EXPIRES_IN)
# Seconds between two writes of one token's last use.
LAST_USED_EVERY = 60.0
SCHEMA_VERSION = 2  # 2: the actions a token asks the person for (ask)
# Seconds a read waits for a lock before it keeps the records already read.
READ_TIMEOUT = 0.05
# Seconds between two checks for another server's changes on a network filesystem (in the worker).
POLL_EVERY = 1.0
TOKEN_ID_CHARS = 16  # hex digits of the hash that name a token inside the server (AgentToken.id)
log = logging.getLogger(__name__)
T = TypeVar("T")
_SCHEMA = """
CREATE TABLE IF NOT EXISTS agent_tokens (
    token_hash TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    scopes TEXT NOT NULL,
    paths TEXT NOT NULL,
    created REAL NOT NULL,
    expires REAL,
    last_used REAL,
    revoked REAL,
    ask TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS agent_tokens_name ON agent_tokens (name);
"""


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def iso(timestamp: float | None) -> str | None:
    if timestamp is None:
        return None
    return datetime.fromtimestamp(timestamp, timezone.utc).isoformat().replace("+00:00", "Z")


@dataclass(frozen=True)
class AgentToken:
    """One stored token (never the token itself)."""

    name: str
    token_hash: str
    scopes: frozenset[str]
    paths: tuple[str, ...]
    created: float
    expires: float | None = None
    last_used: float | None = None
    revoked: float | None = None
    path_scope: PathScope | None = None
    ask: frozenset[str] = frozenset()  # the actions it asks the person for first (the approval gate)
    signed_by: str | None = None  # a token the hub's OAuth service signed (its issuer): in no token file

    @property
    def effective_scopes(self) -> frozenset[str]:
        return effective(self.scopes)

    @property
    def id(self) -> str:
        """The token's id: what the server keys the token's own things by (its approval grants, runs,
        websockets), so a new token of the same name starts with none. A prefix of the token's SHA-256,
        kept in the server (never the token, never shown)."""
        return self.token_hash[:TOKEN_ID_CHARS]

    def status(self, now: float) -> str:
        if self.revoked is not None:
            return "revoked"
        if self.expires is not None and now >= self.expires:
            return "expired"
        return "active"

    def public(self, now: float) -> dict[str, Any]:
        """What the token routes show of it."""
        return {
            "name": self.name,
            "scopes": [s for s in SCOPES if s in self.scopes],
            "paths": list(self.paths),
            "status": self.status(now),
            "created": iso(self.created),
            "expires": iso(self.expires),
            "last_used": iso(self.last_used),
            "revoked": iso(self.revoked),
            "ask": [a for a in ASK_ACTIONS if a in self.ask],
        }


def _record(row: tuple[Any, ...], known: AgentToken | None = None) -> AgentToken:
    """The record of a row; ``known``'s compiled globs are kept when they are the same."""
    token_hash_, name, scopes, paths, created, expires, last_used, revoked, ask = row
    globs = tuple(json.loads(paths))
    if known is not None and known.paths == globs:
        return replace(known, last_used=last_used, revoked=revoked, expires=expires)
    return AgentToken(
        name=name,
        token_hash=token_hash_,
        scopes=frozenset(s for s in scopes.split(",") if s),
        paths=globs,
        created=created,
        expires=expires,
        last_used=last_used,
        revoked=revoked,
        path_scope=PathScope(globs) if globs else None,
        ask=frozenset(a for a in (ask or "").split(",") if a),
    )


def creation_warnings(record: AgentToken, executes_unasked: bool) -> list[str]:
    """What the person creating ``record`` must know: a token that asks before some actions but runs code
    unasked (``executes_unasked``: the approval policy allows its plain eval) is not bound by its asks."""
    if not record.ask or "execute" in record.ask or "execute" not in record.effective_scopes:
        return []
    if not executes_unasked:
        return []
    asked = ", ".join(a for a in ASK_ACTIONS if a in record.ask)
    return [
        f"The token {record.name!r} asks the person before {asked} but runs code without asking: code it "
        "runs can read the server's own token (jpserver-*.json in the Jupyter runtime directory) and approve "
        "its own requests as the person. Ask before execute too (--ask execute,...), or give it no "
        "'execute' scope, for the asks to bind it (docs/approvals.md, 'What the gate does not stop')."
    ]


class TokenStoreUnavailable(Unavailable):
    """The token database cannot be used now: locked by another process, corrupt, or not openable."""


def _unavailable(path: str, error: BaseException, doing: str) -> TokenStoreUnavailable:
    text = str(error)
    if "locked" in text or "busy" in text:
        why = f"is locked by another process ({text})"
        fix = "try again in a moment; if it stays locked, stop the process holding it"
        retry = RETRY_AFTER_MOMENT
    else:
        why = f"cannot be used ({type(error).__name__}: {text})"
        fix = "check that the file is a readable and writable SQLite database (move a corrupt one aside)"
        retry = None
    return TokenStoreUnavailable(f"The agent token database {path} {why}: {doing}; {fix}.", retry_after=retry)


_locked = locked


class TokenStore:
    """The agent tokens of one SQLite file (created with its directory, private to the server's user).

    ``write_timeout``: how long a change (create, revoke) waits for a lock another process holds
    before it raises :class:`TokenStoreUnavailable`. Reads wait at most ``READ_TIMEOUT``, last-use
    writes not at all.
    """

    def __init__(
        self,
        path: str,
        *,
        clock: Callable[[], float] = time.time,
        write_timeout: float = 2.0,
        options: StoreOptions | None = None,
    ):
        self.path = path
        self._clock = clock
        self.write_timeout = write_timeout
        self._lock = threading.Lock()  # the records in memory and the reading connection (short holds)
        self._write_lock = threading.Lock()  # the writing connection (may wait on another process)
        self._writer_thread = Worker("agent-tokens")
        self._flush_pending = False
        try:
            private_file(path)  # private from the start: the names and scopes may be secrets
            journal = journal_for(path, (options or StoreOptions()).journal)
            self._vfs = vfs_for(path, (options or StoreOptions()).journal)
            if self._vfs is not None:
                break_stale_lock(path)
                leave_wal(path)
            # On a network filesystem every read takes a lock on the file server: the worker reads.
            self._polling = journal != "wal"
            self._reader = self._connect(write_timeout if self._polling else READ_TIMEOUT)
            self._writer = self._connect(write_timeout)
            with self._write_lock:
                problem = check(self._writer)
                if problem is not None:
                    raise sqlite3.DatabaseError(f"PRAGMA quick_check: {problem}")
                prepare(self._writer, journal)
                if int(self._reader.execute("PRAGMA user_version").fetchone()[0]) != SCHEMA_VERSION:
                    self._writer.executescript(_SCHEMA)
                    columns = {row[1] for row in self._writer.execute("PRAGMA table_info(agent_tokens)")}
                    if "ask" not in columns:  # a file of schema 1: its tokens ask for nothing
                        self._writer.execute(
                            "ALTER TABLE agent_tokens ADD COLUMN ask TEXT NOT NULL DEFAULT ''"
                        )
                    self._writer.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        except (OSError, sqlite3.Error, StoreError) as e:
            self._writer_thread.shutdown(wait=False)
            raise _unavailable(path, e, "agent tokens cannot be checked or changed") from None
        self._by_hash: dict[str, AgentToken] = {}
        self._used: dict[str, float] = {}  # last uses not yet written
        self._version = -1
        self._worker_ident: int | None = None
        with self._lock:
            self._refresh()
        if self._polling:
            self._writer_thread.every(POLL_EVERY, self._poll)

    def _current(self) -> None:
        """Make the records in memory current: on a local disk at once (under ``_lock``); on a network
        filesystem in the worker only (elsewhere memory is as current as the last poll)."""
        if not self._polling:
            with self._lock:
                self._refresh()
        elif threading.get_ident() == self._worker_ident:
            self._poll()

    def _poll(self) -> None:
        """Worker: read the records again if another connection changed the file (the file's lock is
        waited for outside ``_lock``: lookups on the event loop never wait on it)."""
        self._worker_ident = threading.get_ident()
        try:
            changed = self._changed_rows()
        except sqlite3.Error as e:
            log.warning("agent tokens not read again from %s (kept as they were): %s", self.path, e)
            return
        if changed is not None:
            with self._lock:
                self._take(*changed)

    def _changed_rows(self) -> tuple[int, list[Any]] | None:
        """(the file's ``data_version``, every record's row) when another connection changed the file
        since the last read, else None; raises ``sqlite3.Error``."""
        version = int(self._reader.execute("PRAGMA data_version").fetchone()[0])
        if version == self._version:
            return None
        rows = self._reader.execute(
            "SELECT token_hash, name, scopes, paths, created, expires, last_used, revoked, ask "
            "FROM agent_tokens"
        ).fetchall()
        return version, rows

    def _take(self, version: int, rows: list[Any]) -> None:
        """The records as read at ``version`` (under ``_lock``)."""
        self._by_hash = {row[0]: _record(row, self._by_hash.get(row[0])) for row in rows}
        self._version = version

    def _connect(self, timeout: float) -> sqlite3.Connection:
        return sqlite_connect(self.path, timeout, self._vfs)

    def now(self) -> float:
        """The store's clock (seconds since the epoch)."""
        return self._clock()

    # -- reading --------------------------------------------------------------------------------

    def _refresh(self) -> None:
        """Read every record again when another connection changed the file since the last read (under
        ``_lock``). A lock held elsewhere keeps the records already read; anything else raises."""
        try:
            changed = self._changed_rows()
        except sqlite3.Error as e:
            if _locked(e) and self._version >= 0:
                return
            raise _unavailable(self.path, e, "agent tokens cannot be checked") from None
        if changed is not None:
            self._take(*changed)

    def lookup(self, token: str) -> AgentToken | None:
        """The record of ``token`` (active, expired or revoked), or None when it is no agent token of
        this store. One hash and one dictionary probe, whatever the token."""
        digest = token_hash(token)
        self._current()
        with self._lock:
            found = self._by_hash.get(digest)
        if found is None or not hmac.compare_digest(found.token_hash, digest):
            return None
        return found

    def status_of(self, digest: str) -> str:
        """The status of the token whose hash is ``digest`` now (``"unknown"`` when there is none)."""
        self._current()
        with self._lock:
            found = self._by_hash.get(digest)
        return found.status(self._clock()) if found is not None else "unknown"

    def tokens(self) -> list[AgentToken]:
        """Every record, oldest first, with its last use as of now (written or not yet)."""
        self._current()
        with self._lock:
            records = [
                replace(r, last_used=self._used[h]) if h in self._used else r
                for h, r in self._by_hash.items()
            ]
        return sorted(records, key=lambda r: (r.created, r.name))

    # -- writing --------------------------------------------------------------------------------

    async def call(self, method: Callable[..., T], *args: Any) -> T:
        """``method(*args)`` in the store's writer thread: a change that waits on another process's lock
        never holds the event loop."""
        return await asyncio.wrap_future(self._writer_thread.submit(self._in_worker, method, *args))

    def _in_worker(self, method: Callable[..., T], *args: Any) -> T:
        self._worker_ident = threading.get_ident()
        return method(*args)

    def _write(self, doing: str, statement: str, args: tuple[Any, ...]) -> None:
        """One write, waiting at most ``write_timeout`` for a lock; :class:`TokenStoreUnavailable` else."""
        with self._write_lock:
            try:
                self._writer.execute(f"PRAGMA busy_timeout={int(self.write_timeout * 1000)}")
                self._writer.execute(statement, args)
            except sqlite3.Error as e:
                raise _unavailable(self.path, e, doing) from None

    def create(
        self,
        name: str,
        scopes: Iterable[str],
        paths: Iterable[str] = (),
        expires_in: float | None = None,
        ask: Iterable[str] = (),
    ) -> tuple[str, AgentToken]:
        """A new token and its record (``ask``: the actions it must ask the person for first). 400 for a
        bad name, scope, glob, action or lifetime; 409 when an active token has this name (revoke it
        first); 503 when the file cannot be written."""
        asked = frozenset(ask)
        unknown = sorted(asked - set(ASKABLE_ACTIONS))
        if unknown:
            raise BadRequest(
                f"'ask' takes {', '.join(ASKABLE_ACTIONS)}, got {', '.join(map(repr, unknown))} (a read "
                "cannot wait for a person: limit reads with 'paths' or a deny rule)"
            )
        try:
            check_name(name)
            scope_set = parse_scopes(scopes)
            globs = tuple(paths)
            scope = PathScope(globs) if globs else None
        except (ScopeError, GlobError) as e:
            raise BadRequest(str(e)) from None
        globs = scope.globs if scope is not None else ()
        if expires_in is not None and not MIN_EXPIRES_IN <= expires_in <= MAX_EXPIRES_IN:
            raise BadRequest(
                f"'expires_in' must be between {MIN_EXPIRES_IN:.0f} and {MAX_EXPIRES_IN:.0f} seconds "
                f"(1 minute to 366 days), got {expires_in}"
            )
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        now = self._clock()
        record = AgentToken(
            name=name,
            token_hash=token_hash(token),
            scopes=scope_set,
            paths=globs,
            created=now,
            expires=now + expires_in if expires_in is not None else None,
            path_scope=scope,
            ask=asked,
        )
        self._current()
        with self._lock:
            taken = any(r.name == name and r.status(now) == "active" for r in self._by_hash.values())
        if taken:
            raise Conflict(
                f"an active agent token is already named {name!r}: revoke it first "
                f"(jupyter agent token revoke {name}) or choose another name"
            )
        self._write(
            f"the token {name!r} was not created",
            "INSERT INTO agent_tokens (token_hash, name, scopes, paths, created, expires, ask) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                record.token_hash,
                name,
                ",".join(sorted(scope_set)),
                json.dumps(list(globs)),
                record.created,
                record.expires,
                ",".join(sorted(asked)),
            ),
        )
        with self._lock:
            self._by_hash[record.token_hash] = record
        return token, record

    def revoke(self, name: str) -> AgentToken:
        """Revoke the tokens named ``name`` that are not revoked yet; the newest one's record. 404 when
        there is none; 503 (nothing revoked) when the file cannot be written."""
        now = self._clock()
        self._current()
        with self._lock:
            found = [r for r in self._by_hash.values() if r.name == name and r.revoked is None]
        if not found:
            raise NotFound(f"no agent token named {name!r} to revoke (jupyter agent token list shows them)")
        self._write(
            f"the token {name!r} was NOT revoked and still works",
            "UPDATE agent_tokens SET revoked = ? WHERE name = ? AND revoked IS NULL",
            (now, name),
        )
        with self._lock:
            for record in found:
                self._by_hash[record.token_hash] = replace(record, revoked=now)
            newest = self._by_hash[max(found, key=lambda r: r.created).token_hash]
        return newest

    def touch(self, record: AgentToken) -> None:
        """Note that ``record`` was used now. Written to the file at most once a minute per token, in the
        writer thread (never waited for; a file that cannot be written keeps it for the next try)."""
        now = self._clock()
        with self._lock:
            self._used[record.token_hash] = now
            last = self._by_hash.get(record.token_hash)
            due = last is not None and (last.last_used is None or now - last.last_used >= LAST_USED_EVERY)
            if not due or self._flush_pending:
                return
            self._flush_pending = True
        self._writer_thread.submit(self._flush)

    def settle(self) -> None:
        """Wait until the writes queued so far (last uses) are done."""
        self._writer_thread.submit(lambda: None).result()

    def _flush(self, force: bool = False) -> None:
        """Write the pending last uses that are due (all with ``force``); not waiting for a lock."""
        with self._lock:
            self._flush_pending = False
            due = []
            for digest, used in self._used.items():
                record = self._by_hash.get(digest)
                if record is not None and (
                    force or record.last_used is None or used - record.last_used >= LAST_USED_EVERY
                ):
                    due.append((digest, used))
        if not due:
            return
        with self._write_lock:
            try:
                self._writer.execute("PRAGMA busy_timeout=0")
                self._writer.executemany(
                    "UPDATE agent_tokens SET last_used = ? WHERE token_hash = ?",
                    [(used, digest) for digest, used in due],
                )
            except sqlite3.Error as e:
                log.warning("agent tokens' last use not written to %s (kept for later): %s", self.path, e)
                return
        with self._lock:
            for digest, used in due:
                record = self._by_hash.get(digest)
                if record is not None:
                    self._by_hash[digest] = replace(record, last_used=used)
                if self._used.get(digest) == used:
                    del self._used[digest]

    def close(self) -> None:
        """Write what is pending (best-effort) and close the file."""
        self._writer_thread.shutdown(wait=True)
        # broad: the last flush at close is best effort (SQLite, disk): closing must go on
        with contextlib.suppress(Exception):
            self._flush(force=True)
        with self._write_lock, self._lock:
            self._reader.close()
            self._writer.close()

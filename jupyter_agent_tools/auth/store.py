"""Agent tokens, stored hashed in SQLite: create, list, revoke, and look one up by its hash.

A token is ``jat_`` and 256 random bits (``secrets.token_urlsafe(32)``). Only its SHA-256 is kept: a fast
hash is right for a high-entropy random secret (nothing to brute-force), and a lookup is then one hash and
one dictionary probe, the same for a right and a wrong token, so a flood of wrong tokens costs the server
nothing more. Every record is held in memory; another process writing the same file (a second server on
the same data directory) is noticed through SQLite's ``PRAGMA data_version`` and the records are read
again. The last use of a token is written at most once a minute.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Any

from ..errors import BadRequest, Conflict, NotFound
from .paths import GlobError, PathScope
from .scopes import SCOPES, ScopeError, check_name, effective, parse_scopes

TOKEN_PREFIX = "jat_"
# Longest lifetime a token may be given (a token without expiry lives until it is revoked).
MAX_EXPIRES_IN = 366 * 86400.0
MIN_EXPIRES_IN = 60.0
# Seconds between two writes of one token's last use.
LAST_USED_EVERY = 60.0
SCHEMA_VERSION = 1
_SCHEMA = """
CREATE TABLE IF NOT EXISTS agent_tokens (
    token_hash TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    scopes TEXT NOT NULL,
    paths TEXT NOT NULL,
    created REAL NOT NULL,
    expires REAL,
    last_used REAL,
    revoked REAL
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

    @property
    def effective_scopes(self) -> frozenset[str]:
        return effective(self.scopes)

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
        }


def _record(row: tuple[Any, ...]) -> AgentToken:
    token_hash_, name, scopes, paths, created, expires, last_used, revoked = row
    globs = tuple(json.loads(paths))
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
    )


class TokenStore:
    """The agent tokens of one SQLite file (created with its directory, private to the server's user)."""

    def __init__(self, path: str, *, clock: Callable[[], float] = time.time):
        self.path = path
        self._clock = clock
        self._lock = threading.Lock()
        directory = os.path.dirname(path)
        if directory:
            os.makedirs(directory, mode=0o700, exist_ok=True)
        fresh = not os.path.exists(path)
        if fresh:  # private from the start: the hashes are not secrets, the names and scopes may be
            os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=5.0)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)
        self._db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        self._by_hash: dict[str, AgentToken] = {}
        self._used: dict[str, float] = {}  # last uses not yet written
        self._version = -1
        self._refresh()

    def now(self) -> float:
        """The store's clock (seconds since the epoch)."""
        return self._clock()

    # -- reading --------------------------------------------------------------------------------

    def _data_version(self) -> int:
        return int(self._db.execute("PRAGMA data_version").fetchone()[0])

    def _refresh(self) -> None:
        """Read every record again when another connection changed the file since the last read."""
        version = self._data_version()
        if version == self._version:
            return
        rows = self._db.execute(
            "SELECT token_hash, name, scopes, paths, created, expires, last_used, revoked FROM agent_tokens"
        ).fetchall()
        self._by_hash = {row[0]: _record(row) for row in rows}
        self._version = version

    def lookup(self, token: str) -> AgentToken | None:
        """The record of ``token`` (active, expired or revoked), or None when it is no agent token of
        this store. One hash and one dictionary probe, whatever the token."""
        digest = token_hash(token)
        with self._lock:
            self._refresh()
            found = self._by_hash.get(digest)
        if found is None or not hmac.compare_digest(found.token_hash, digest):
            return None
        return found

    def tokens(self) -> list[AgentToken]:
        """Every record, oldest first, with its last use as of now."""
        with self._lock:
            self._flush(force=True)
            self._refresh()
            records = list(self._by_hash.values())
        return sorted(records, key=lambda r: (r.created, r.name))

    # -- writing --------------------------------------------------------------------------------

    def create(
        self,
        name: str,
        scopes: Iterable[str],
        paths: Iterable[str] = (),
        expires_in: float | None = None,
    ) -> tuple[str, AgentToken]:
        """A new token and its record. 400 for a bad name, scope, glob or lifetime; 409 when an active
        token has this name (revoke it first)."""
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
        )
        with self._lock:
            self._refresh()
            if any(r.name == name and r.status(now) == "active" for r in self._by_hash.values()):
                raise Conflict(
                    f"an active agent token is already named {name!r}: revoke it first "
                    f"(jupyter agent token revoke {name}) or choose another name"
                )
            self._db.execute(
                "INSERT INTO agent_tokens VALUES (?, ?, ?, ?, ?, ?, NULL, NULL)",
                (
                    record.token_hash,
                    name,
                    ",".join(sorted(scope_set)),
                    json.dumps(list(globs)),
                    record.created,
                    record.expires,
                ),
            )
            self._by_hash[record.token_hash] = record
        return token, record

    def revoke(self, name: str) -> AgentToken:
        """Revoke the tokens named ``name`` that are not revoked yet; the newest one's record. 404 when
        there is none."""
        now = self._clock()
        with self._lock:
            self._refresh()
            found = [r for r in self._by_hash.values() if r.name == name and r.revoked is None]
            if not found:
                raise NotFound(
                    f"no agent token named {name!r} to revoke (jupyter agent token list shows them)"
                )
            self._db.execute(
                "UPDATE agent_tokens SET revoked = ? WHERE name = ? AND revoked IS NULL", (now, name)
            )
            for record in found:
                self._by_hash[record.token_hash] = replace(record, revoked=now)
            newest = max(found, key=lambda r: r.created)
        return self._by_hash[newest.token_hash]

    def touch(self, record: AgentToken) -> None:
        """Note that ``record`` was used now; written to the file at most once a minute per token."""
        now = self._clock()
        with self._lock:
            self._used[record.token_hash] = now
            last = self._by_hash.get(record.token_hash)
            if last is not None and (last.last_used is None or now - last.last_used >= LAST_USED_EVERY):
                self._flush(force=False)

    def _flush(self, force: bool) -> None:
        """Write the pending last uses (all of them with ``force``, else those due)."""
        if not self._used:
            return
        due = []
        for digest, used in self._used.items():
            record = self._by_hash.get(digest)
            if record is None:
                continue
            if force or record.last_used is None or used - record.last_used >= LAST_USED_EVERY:
                due.append((digest, used, record))
        for digest, used, record in due:
            self._db.execute("UPDATE agent_tokens SET last_used = ? WHERE token_hash = ?", (used, digest))
            self._by_hash[digest] = replace(record, last_used=used)
            del self._used[digest]

    def close(self) -> None:
        with self._lock:
            self._flush(force=True)
            self._db.close()

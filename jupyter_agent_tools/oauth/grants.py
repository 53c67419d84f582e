"""The OAuth clients and grants of one server, in a small private SQLite file.

A grant is what a person approved on the consent page for one client: scopes, paths, ``ask``, until when.
Its access token is an agent token (kept in the token store, by name ``oauth-<client>-<grant id>``); only
the SHA-256 of its refresh tokens is kept here. A refresh token is used once: using it again (a stolen copy,
or the real client after the thief) revokes the whole grant. Every method is synchronous and runs in the
service's one worker thread (never on the event loop).
"""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import threading
from dataclasses import dataclass
from typing import Any

from ..auth.store import iso
from .core import ASK_ACTIONS, OAUTH_NAME_PREFIX, SCOPES, Client, Consent

SCHEMA_VERSION = 2  # 2: the MCP URL a grant is for (resource)
_SCHEMA = """
CREATE TABLE IF NOT EXISTS clients (
    client_id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    redirect_uris TEXT NOT NULL,
    created REAL NOT NULL,
    verified_host TEXT
);
CREATE TABLE IF NOT EXISTS grants (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    client_id TEXT NOT NULL,
    client_name TEXT NOT NULL,
    user TEXT NOT NULL,
    token_name TEXT NOT NULL,
    scopes TEXT NOT NULL,
    paths TEXT NOT NULL,
    ask TEXT NOT NULL,
    created REAL NOT NULL,
    expires REAL NOT NULL,
    access_hash TEXT,
    last_refresh REAL,
    revoked REAL,
    revoked_why TEXT,
    resource TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS refresh_tokens (
    token_hash TEXT PRIMARY KEY,
    grant_id INTEGER NOT NULL,
    spent REAL
);
CREATE INDEX IF NOT EXISTS refresh_by_grant ON refresh_tokens (grant_id);
"""


class GrantStoreError(Exception):
    """The grants file cannot be used (the message names it and why)."""


@dataclass(frozen=True)
class Grant:
    id: int
    client_id: str
    client_name: str
    user: str
    token_name: str
    consent: Consent
    created: float
    expires: float
    access_hash: str | None
    last_refresh: float | None
    revoked: float | None
    revoked_why: str | None
    resource: str = ""  # the MCP URL its access tokens are for (on a hub: one user's server)

    def active(self, now: float) -> bool:
        return self.revoked is None and now < self.expires

    def public(self, now: float) -> dict[str, Any]:
        """What the person sees of a connected app (never a token)."""
        status = "revoked" if self.revoked is not None else ("active" if now < self.expires else "expired")
        return {
            "id": self.id,
            "client_id": self.client_id,
            "client_name": self.client_name,
            "verified": self.client_id.startswith("https://"),
            "agent": self.token_name,
            "consented_by": self.user,
            "scopes": [s for s in SCOPES if s in self.consent.scopes],
            "paths": list(self.consent.paths),
            "ask": [a for a in ASK_ACTIONS if a in self.consent.ask],
            "status": status,
            "created": iso(self.created),
            "expires": iso(self.expires),
            "last_refresh": iso(self.last_refresh),
            "revoked": iso(self.revoked),
            "revoked_why": self.revoked_why,
        }


_GRANT_COLUMNS = (
    "id, client_id, client_name, user, token_name, scopes, paths, ask, created, expires, access_hash, "
    "last_refresh, revoked, revoked_why, resource"
)


def _grant(row: tuple[Any, ...]) -> Grant:
    (gid, client_id, client_name, user, token_name, scopes, paths, ask, created, expires, access_hash,
     last_refresh, revoked, revoked_why, resource) = row  # fmt: skip
    consent = Consent(
        scopes=frozenset(s for s in scopes.split(",") if s),
        paths=tuple(json.loads(paths)),
        ask=frozenset(a for a in ask.split(",") if a),
        lifetime=expires - created,
    )
    return Grant(
        gid, client_id, client_name, user, token_name, consent, created, expires, access_hash, last_refresh,
        revoked, revoked_why, resource or "",
    )  # fmt: skip


def open_private(path: str) -> str:
    """Create ``path`` (and its directory) private to this user, and check what is there: a regular file
    of ours, not a link (the path is resolved first, then checked). The resolved path."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, mode=0o700, exist_ok=True)
    real = os.path.join(os.path.realpath(directory), os.path.basename(path))
    fd = os.open(real, os.O_CREAT | os.O_RDWR | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise GrantStoreError(f"{real} is not a regular file")
        if hasattr(os, "getuid") and info.st_uid != os.getuid():
            raise GrantStoreError(f"{real} belongs to another user")
        if info.st_mode & 0o077:
            os.fchmod(fd, 0o600)
    finally:
        os.close(fd)
    return real


class GrantStore:
    """Clients, grants and refresh token hashes of one SQLite file."""

    def __init__(self, path: str, timeout: float = 2.0):
        try:
            self.path = open_private(path)
            self._db = sqlite3.connect(
                self.path, isolation_level=None, check_same_thread=False, timeout=timeout
            )
            version = int(self._db.execute("PRAGMA user_version").fetchone()[0])
            if version != SCHEMA_VERSION:
                self._db.executescript(_SCHEMA)
                columns = {row[1] for row in self._db.execute("PRAGMA table_info(grants)")}
                if "resource" not in columns:  # a version 1 file
                    self._db.execute("ALTER TABLE grants ADD COLUMN resource TEXT NOT NULL DEFAULT ''")
                self._db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        except (OSError, sqlite3.Error) as e:
            raise GrantStoreError(f"the OAuth grants file {path} cannot be used: {e}") from None
        self._lock = threading.Lock()

    def _run(self, statement: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        try:
            with self._lock:
                return self._db.execute(statement, args).fetchall()
        except sqlite3.Error as e:
            raise GrantStoreError(f"the OAuth grants file {self.path} cannot be used: {e}") from None

    # -- clients ----------------------------------------------------------------------------------------

    def add_client(self, client: Client) -> None:
        uris = json.dumps(list(client.redirect_uris))
        self._run(
            "INSERT INTO clients (client_id, name, redirect_uris, created, verified_host) "
            "VALUES (?, ?, ?, ?, ?)",
            (client.client_id, client.name, uris, client.created, client.verified_host),
        )

    def client(self, client_id: str) -> Client | None:
        rows = self._run(
            "SELECT client_id, name, redirect_uris, created, verified_host FROM clients WHERE client_id = ?",
            (client_id,),
        )
        if not rows:
            return None
        cid, name, uris, created, host = rows[0]
        return Client(cid, name, tuple(json.loads(uris)), created, host)

    def count_clients(self) -> int:
        return int(self._run("SELECT COUNT(*) FROM clients")[0][0])

    def forget_idle_clients(self, before: float, now: float) -> int:
        """Remove clients registered before ``before`` that hold no active grant; how many."""
        rows = self._run(
            "DELETE FROM clients WHERE created < ? AND client_id NOT IN "
            "(SELECT client_id FROM grants WHERE revoked IS NULL AND expires > ?) RETURNING client_id",
            (before, now),
        )
        return len(rows)

    # -- grants -----------------------------------------------------------------------------------------

    def add_grant(
        self,
        client: Client,
        user: str,
        consent: Consent,
        created: float,
        expires: float,
        name_part: str,
        resource: str = "",
    ) -> Grant:
        """A new grant for ``resource``; its token name is ``oauth-<name_part>-<its id>``."""
        scopes, paths, ask = (
            ",".join(sorted(consent.scopes)),
            json.dumps(list(consent.paths)),
            ",".join(sorted(consent.ask)),
        )
        rows = self._run(
            "INSERT INTO grants (client_id, client_name, user, token_name, scopes, paths, ask, created, "
            "expires, resource) VALUES (?, ?, ?, '', ?, ?, ?, ?, ?, ?) RETURNING id",
            (client.client_id, client.name, user, scopes, paths, ask, created, expires, resource),
        )
        gid = int(rows[0][0])
        self._run(
            "UPDATE grants SET token_name = ? WHERE id = ?", (f"{OAUTH_NAME_PREFIX}{name_part}-{gid}", gid)
        )
        found = self.grant(gid)
        assert found is not None
        return found

    def grant(self, gid: int) -> Grant | None:
        rows = self._run(f"SELECT {_GRANT_COLUMNS} FROM grants WHERE id = ?", (gid,))
        return _grant(rows[0]) if rows else None

    def grants(self) -> list[Grant]:
        return [_grant(r) for r in self._run(f"SELECT {_GRANT_COLUMNS} FROM grants ORDER BY id")]

    def grant_of_access(self, access_hash: str) -> Grant | None:
        rows = self._run(f"SELECT {_GRANT_COLUMNS} FROM grants WHERE access_hash = ?", (access_hash,))
        return _grant(rows[0]) if rows else None

    def revoked_since(self, since: float) -> list[int]:
        """The ids of the grants revoked at or after ``since``."""
        return [
            int(r[0]) for r in self._run("SELECT id FROM grants WHERE revoked >= ? ORDER BY id", (since,))
        ]

    def set_access(self, gid: int, access_hash: str, now: float | None = None) -> None:
        self._run("UPDATE grants SET access_hash = ?, last_refresh = ? WHERE id = ?", (access_hash, now, gid))

    def revoke_grant(self, gid: int, now: float, why: str) -> bool:
        """Revoke a grant and spend its refresh tokens; False when it was revoked already."""
        rows = self._run(
            "UPDATE grants SET revoked = ?, revoked_why = ? WHERE id = ? AND revoked IS NULL RETURNING id",
            (now, why, gid),
        )
        self._run("UPDATE refresh_tokens SET spent = ? WHERE grant_id = ? AND spent IS NULL", (now, gid))
        return bool(rows)

    # -- refresh tokens ---------------------------------------------------------------------------------

    def add_refresh(self, gid: int, token_hash: str) -> None:
        self._run("INSERT INTO refresh_tokens (token_hash, grant_id) VALUES (?, ?)", (token_hash, gid))

    def refresh(self, token_hash: str) -> tuple[int, float | None] | None:
        """The grant id of a refresh token and when it was spent (None: not yet); None when unknown."""
        rows = self._run("SELECT grant_id, spent FROM refresh_tokens WHERE token_hash = ?", (token_hash,))
        return (int(rows[0][0]), rows[0][1]) if rows else None

    def spend_refresh(self, token_hash: str, now: float) -> bool:
        """Mark a refresh token used; False when it was used already (someone else won the race)."""
        rows = self._run(
            "UPDATE refresh_tokens SET spent = ? WHERE token_hash = ? AND spent IS NULL RETURNING grant_id",
            (now, token_hash),
        )
        return bool(rows)

    def close(self) -> None:
        with self._lock:
            self._db.close()

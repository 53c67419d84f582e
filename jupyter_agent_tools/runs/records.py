"""Minimal records of detached runs in a small SQLite file, so a restarted server can say ``lost``.

A run's events and answer live in the server's memory (and artifacts) only; what survives a restart is
one row per run: id, owner, what ran, its state and times, and the server process that ran it. A server
starting on the same root directory marks the runs of a process that is gone and never finished as
``lost``, and lists them (and the finished ones) until ``run_retention`` passes. Small writes on the
event loop: one row per state change, ``synchronous=OFF`` (a crashed process's writes are in the OS).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import time
from typing import Any

FINAL_STATES = ("complete", "error", "cancelled", "interrupted", "timed_out", "lost")

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id TEXT PRIMARY KEY,
    root TEXT NOT NULL,
    pid INTEGER NOT NULL,
    owner TEXT,
    kind TEXT NOT NULL,
    target TEXT,
    state TEXT NOT NULL,
    created REAL NOT NULL,
    ended REAL,
    message TEXT
)
"""


def private(path: str) -> None:
    """Make ``path`` a file only the server's user can read (created so, or an existing one tightened):
    run records name notebooks, sessions and owners, as the ledger and the tokens do (both 0600)."""
    os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
    for name in (path, path + "-wal", path + "-shm"):  # SQLite gives its log the file's mode
        with contextlib.suppress(FileNotFoundError):
            os.chmod(name, 0o600)


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists, another user's
    return True


class RunRecords:
    """The rows of one server root; every failure is logged once and ignored (runs work without it)."""

    def __init__(self, path: str, root: str, log: logging.Logger):
        self.path = path
        self.root = root
        self.log = log
        self._conn: sqlite3.Connection | None = None
        self._failed = False

    def open(self, retention: float) -> list[dict[str, Any]]:
        """Open the file; mark the unfinished runs of dead processes lost; the rows still kept."""
        try:
            if self.path != ":memory:":
                os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
                private(self.path)
            conn = sqlite3.connect(self.path, isolation_level=None, timeout=1.0)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=OFF")
            conn.execute(SCHEMA)
            self._conn = conn
            now = time.time()
            conn.execute("DELETE FROM runs WHERE ended IS NOT NULL AND ended < ?", (now - retention,))
            rows = conn.execute(
                "SELECT id, pid, owner, kind, target, state, created, ended, message FROM runs "
                "WHERE root = ?",
                (self.root,),
            ).fetchall()
        except (sqlite3.Error, OSError) as e:
            self._fail(e)
            return []
        kept = []
        for rid, pid, owner, kind, target, state, created, ended, message in rows:
            if pid == os.getpid() or (state not in FINAL_STATES and _alive(pid)):
                continue  # another live server on this root runs it
            if state not in FINAL_STATES:
                state, ended = "lost", now
                message = "the server stopped or restarted while this run ran; its work did not go on"
                self._execute(
                    "UPDATE runs SET state = ?, ended = ?, message = ? WHERE id = ?",
                    (state, ended, message, rid),
                )
            kept.append(
                {
                    "id": rid,
                    "owner": owner,
                    "kind": kind,
                    "target": target,
                    "state": state,
                    "created": created,
                    "ended": ended,
                    "message": message,
                }
            )
        return kept

    def save(self, run: Any) -> None:
        self._execute(
            "INSERT OR REPLACE INTO runs "
            "(id, root, pid, owner, kind, target, state, created, ended, message) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                run.id,
                self.root,
                os.getpid(),
                run.owner,
                run.kind,
                run.target,
                run.state,
                run.created,
                run.ended,
                run.message,
            ),
        )

    def forget(self, run_id: str) -> None:
        self._execute("DELETE FROM runs WHERE id = ?", (run_id,))

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(sqlite3.Error):
                self._conn.close()
            self._conn = None

    def _execute(self, sql: str, args: tuple[Any, ...]) -> None:
        if self._conn is None:
            return
        try:
            self._conn.execute(sql, args)
            self._failed = False
        except sqlite3.Error as e:
            self._fail(e)

    def _fail(self, error: Exception) -> None:
        if not self._failed:
            self.log.warning("run records (%s) not written: %s", self.path, error)
        self._failed = True

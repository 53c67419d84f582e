"""Minimal records of detached runs in a small SQLite file, so a restarted server can say ``lost``.

A run's events and answer live in the server's memory (and artifacts) only; what survives a restart is
one row per run: id, owner, what ran, its state and times, and the server process that ran it (a
:class:`~jupyter_agent_tools.stores.ProcessIdentity`, not a PID: a container restarted with the same PID
is another process). A server starting on the same root directory marks the runs of a process that is
gone and never finished as ``lost``, and lists them (and the finished ones) until ``run_retention``
passes. The file is one of the stores (:mod:`jupyter_agent_tools.stores`): written in its own worker
thread (one row per state change, never waited for), journal by filesystem.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from ..stores import (
    OWNERS_SCHEMA,
    StoreOptions,
    Worker,
    alive_owners,
    beat,
    leave,
    open_store,
    pid_alive,
    private_file,
    this_process,
)

FINAL_STATES = ("complete", "error", "cancelled", "interrupted", "timed_out", "lost")
LOCK_TIMEOUT = 5.0  # seconds a write waits for another process's lock (in the worker) before it is logged
LOST_MESSAGE = "the server stopped or restarted while this run ran; its work did not go on"

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
    message TEXT,
    process TEXT
)
"""
COLUMNS = "id, pid, process, owner, kind, target, state, created, ended, message"


def private(path: str) -> None:
    """Make ``path`` a file only the server's user can read (created so, or an existing one tightened):
    run records name notebooks, sessions and owners, as the ledger and the tokens do (both 0600)."""
    private_file(path)


def _setup(conn: sqlite3.Connection) -> None:
    conn.execute(SCHEMA)
    conn.execute(OWNERS_SCHEMA)
    if "process" not in {row[1] for row in conn.execute("PRAGMA table_info(runs)")}:
        conn.execute("ALTER TABLE runs ADD COLUMN process TEXT")  # a file made before process identities


class RunRecords:
    """The rows of one server root; every failure is logged once and ignored (runs work without it).
    ``on_lost(rows)``: runs of another server process found gone after the start (called in the worker)."""

    def __init__(
        self,
        path: str,
        root: str,
        log: logging.Logger,
        options: StoreOptions | None = None,
        on_lost: Callable[[list[dict[str, Any]]], None] | None = None,
    ):
        self.path = path
        self.root = root
        self.log = log
        self.options = options or StoreOptions()
        self.on_lost = on_lost
        self._conn: sqlite3.Connection | None = None
        self._failed = False
        self._worker = Worker("agent-tools-runs")

    def open(self, retention: float) -> list[dict[str, Any]]:
        """Open the file (in the worker; this waits for it); mark the unfinished runs of gone processes
        lost; the rows still kept."""
        return self.submit_open(retention).result()

    def submit_open(self, retention: float) -> Future[list[dict[str, Any]]]:
        """:meth:`open` in the worker, not waited for."""
        return self._worker.submit(self._open, retention)

    async def open_async(self, retention: float) -> list[dict[str, Any]]:
        """:meth:`open` without holding the event loop."""
        return await self._worker.run(self._open, retention)

    def _open(self, retention: float) -> list[dict[str, Any]]:
        try:
            conn = open_store(
                self.path,
                label="run records",
                logger=self.log,
                options=self.options,
                timeout=LOCK_TIMEOUT,
                setup=_setup,
            )
            self._conn = conn
            beat(conn)
            now = time.time()
            conn.execute("DELETE FROM runs WHERE ended IS NOT NULL AND ended < ?", (now - retention,))
            rows = conn.execute(f"SELECT {COLUMNS} FROM runs WHERE root = ?", (self.root,)).fetchall()
            kept = self._mark_lost(conn, rows, now, everything=True)
        except (sqlite3.Error, OSError) as e:
            self._fail(e)
            return []
        if self.path != ":memory:":
            self._worker.every(self.options.heartbeat, self._tick)
        return kept

    def _mark_lost(
        self, conn: sqlite3.Connection, rows: list[Any], now: float, everything: bool
    ) -> list[dict[str, Any]]:
        """The rows to list (``everything``: finished ones too, else only those marked lost now); the
        unfinished runs of gone processes are marked ``lost`` first. A run of this very process (or another
        live one) is left alone."""
        me = this_process().key
        alive = alive_owners(
            conn, [r[2] for r in rows if r[6] not in FINAL_STATES and r[2]], self.options.owner_timeout
        )
        kept = []
        for rid, pid, process, owner, kind, target, state, created, ended, message in rows:
            if process == me:
                continue  # this process's own (it has them in memory)
            if state not in FINAL_STATES:
                if process in alive or (process is None and pid != os.getpid() and pid_alive(pid)):
                    continue  # another live server on this root runs it
                state, ended, message = "lost", now, LOST_MESSAGE
                conn.execute(
                    "UPDATE runs SET state = ?, ended = ?, message = ? WHERE id = ? AND state NOT IN "
                    f"({', '.join('?' * len(FINAL_STATES))})",
                    (state, ended, message, rid, *FINAL_STATES),
                )
            elif not everything:
                continue
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

    def _tick(self) -> None:
        """Worker, every heartbeat: this process is alive; the runs of servers gone since become lost."""
        if self._conn is None:
            return
        try:
            beat(self._conn)
            rows = self._conn.execute(
                f"SELECT {COLUMNS} FROM runs WHERE root = ? AND state NOT IN "
                f"({', '.join('?' * len(FINAL_STATES))}) AND (process IS NULL OR process != ?)",
                (self.root, *FINAL_STATES, this_process().key),
            ).fetchall()
            lost = self._mark_lost(self._conn, rows, time.time(), everything=False) if rows else []
            self._failed = False
        except sqlite3.Error as e:
            self._fail(e)
            return
        if lost and self.on_lost is not None:
            self.on_lost(lost)

    def save(self, run: Any) -> None:
        """Write the run's row (in the worker; not waited for)."""
        values = (
            run.id,
            self.root,
            os.getpid(),
            this_process().key,
            run.owner,
            run.kind,
            run.target,
            run.state,
            run.created,
            run.ended,
            run.message,
        )
        self._worker.submit(
            self._execute,
            "INSERT OR REPLACE INTO runs "
            "(id, root, pid, process, owner, kind, target, state, created, ended, message) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            values,
        )

    def forget(self, run_id: str) -> None:
        self._worker.submit(self._execute, "DELETE FROM runs WHERE id = ?", (run_id,))

    def settle(self) -> None:
        """Wait until the writes queued so far are done."""
        with contextlib.suppress(RuntimeError):
            self._worker.submit(lambda: None).result()

    def close(self) -> None:
        self._worker.submit(self._close)
        self._worker.shutdown(wait=True)

    def _close(self) -> None:
        if self._conn is not None:
            leave(self._conn)
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

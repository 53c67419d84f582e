"""The extension's own databases are private to the server's user: the run records like the ledger and the
agent tokens (0600), whether the file is new or was left readable by an older version."""

from __future__ import annotations

import logging
import os
import sqlite3
import stat
from pathlib import Path

import pytest

from jupyter_agent_tools.runs.records import RunRecords

pytestmark = pytest.mark.quick  # the fast tier: no server, no kernel


def mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_the_run_records_are_created_private(tmp_path: Path) -> None:
    path = tmp_path / "data" / "runs.db"
    old = os.umask(0o022)  # the usual umask: files 0644 unless made otherwise
    try:
        records = RunRecords(str(path), "/root", logging.getLogger("test"))
        assert records.open(3600) == []
    finally:
        os.umask(old)
    try:
        assert mode(path) == 0o600
        for suffix in ("-wal", "-shm"):
            if (tmp_path / "data" / f"runs.db{suffix}").exists():
                assert mode(tmp_path / "data" / f"runs.db{suffix}") == 0o600
    finally:
        records.close()


def test_existing_run_records_are_tightened(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    sqlite3.connect(path).close()
    os.chmod(path, 0o644)  # as an earlier version left it
    records = RunRecords(str(path), "/root", logging.getLogger("test"))
    try:
        records.open(3600)
        assert mode(path) == 0o600
    finally:
        records.close()

"""The stores' shared helper (jupyter_agent_tools.stores) and what the four stores do with it: the journal
chosen by filesystem (a fake mount table), SQLite VFSes without shared memory or POSIX locks, a broken file
kept aside (or the token store failing closed), process identities (a real second process, a PID reused),
approval ids from SQLite shared by servers on one file, where the files live (state dir, hub server name)."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from jupyter_agent_tools import stores
from jupyter_agent_tools.approvals.service import ApprovalPolicy
from jupyter_agent_tools.auth.store import TokenStore, TokenStoreUnavailable
from jupyter_agent_tools.runs.records import RunRecords
from jupyter_agent_tools.stores import (
    AgentStores,
    ProcessIdentity,
    StoreCorrupt,
    StoreOptions,
    owner_alive,
    this_process,
)

pytestmark = pytest.mark.quick  # no server, no kernel

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOG = logging.getLogger("test_stores")


def mountinfo(*mounts: tuple[str, str, str]) -> str:
    """A /proc/self/mountinfo text of (mount point, fs type, source)."""
    lines = []
    for n, (point, fs_type, source) in enumerate(mounts, start=20):
        escaped = point.replace(" ", "\\040")
        lines.append(f"{n} 1 0:{n} / {escaped} rw,relatime shared:{n} - {fs_type} {source} rw")
    return "\n".join(lines) + "\n"


@pytest.fixture
def fake_mounts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Point the stores at a fake mount table; returns a function that writes it."""
    table = tmp_path / "mountinfo"
    monkeypatch.setattr(stores, "MOUNTINFO", str(table))

    def write(*mounts: tuple[str, str, str]) -> None:
        table.write_text(mountinfo(*mounts))

    return write


# -- which filesystem ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fs_type", "kind"),
    [
        ("nfs", "network"),
        ("nfs4", "network"),
        ("cifs", "network"),
        ("smb3", "network"),
        ("fuse.sshfs", "network"),
        ("fuse.s3fs", "network"),
        ("fuse.glusterfs", "network"),
        ("lustre", "network"),
        ("gpfs", "network"),
        ("ceph", "network"),
        ("afs", "network"),
        ("9p", "network"),
        ("ext4", "local"),
        ("xfs", "local"),
        ("btrfs", "local"),
        ("overlay", "local"),
        ("tmpfs", "local"),
        ("fuseblk", "local"),
    ],
)
def test_the_mount_table_tells_network_filesystems_from_local_ones(
    tmp_path: Path, fs_type: str, kind: str
) -> None:
    home = tmp_path / "home" / "jovyan"
    home.mkdir(parents=True)
    table = mountinfo(("/", "ext4", "/dev/sda1"), (str(tmp_path / "home"), fs_type, "server:/export"))
    found, what = stores.filesystem(str(home / ".local" / "share" / "x.db"), table)
    assert found == kind and fs_type in what


def test_the_deepest_mount_wins_and_escaped_names_are_read(tmp_path: Path) -> None:
    deep = tmp_path / "my home" / "data"
    deep.mkdir(parents=True)
    table = mountinfo(
        ("/", "ext4", "/dev/sda1"),
        (str(tmp_path / "my home"), "nfs4", "server:/home"),
        (str(deep), "ext4", "/dev/sdb1"),  # a local disk mounted inside the network home
    )
    assert stores.filesystem(str(deep / "x.db"), table)[0] == "local"
    assert stores.filesystem(str(tmp_path / "my home" / "x.db"), table)[0] == "network"
    # a later mount on the same point hides the earlier one
    again = table + mountinfo((str(deep), "fuse.sshfs", "host:/x"))
    assert stores.filesystem(str(deep / "x.db"), again)[0] == "network"


def test_without_a_mount_table_statfs_tells_and_without_either_it_is_network(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert stores.filesystem(str(tmp_path / "x.db"), "")[0] == "local"  # statfs of the test's tmpfs/ext4
    monkeypatch.setattr(stores, "_statfs_type", lambda path: None)
    kind, what = stores.filesystem(str(tmp_path / "x.db"), "")
    assert kind == "network" and "unknown" in what
    monkeypatch.setattr(stores, "_statfs_type", lambda path: 0x6969)  # NFS_SUPER_MAGIC
    assert stores.filesystem(str(tmp_path / "x.db"), "") == ("network", "nfs (statfs)")


def test_the_journal_follows_the_filesystem_and_is_said_once(
    tmp_path: Path, fake_mounts: Any, caplog: pytest.LogCaptureFixture
) -> None:
    fake_mounts(("/", "ext4", "/dev/sda1"), (str(tmp_path), "nfs4", "server:/home"))
    stores._said.clear()
    with caplog.at_level(logging.INFO, logger="jupyter_agent_tools.stores"):
        assert stores.journal_for(str(tmp_path / "a.db")) == "delete"
        assert stores.journal_for(str(tmp_path / "b.db")) == "delete"
    said = [r.getMessage() for r in caplog.records if "rollback journal" in r.getMessage()]
    assert len(said) == 1 and "nfs4" in said[0], said
    assert stores.journal_for(str(tmp_path / "a.db"), "wal") == "wal"  # AgentStores.journal forces it
    fake_mounts(("/", "ext4", "/dev/sda1"))
    assert stores.journal_for(str(tmp_path / "a.db")) == "wal"
    assert stores.journal_for(str(tmp_path / "a.db"), "rollback") == "delete"


def test_every_store_on_a_network_home_uses_a_rollback_journal_with_full_sync(
    tmp_path: Path, fake_mounts: Any
) -> None:
    fake_mounts(("/", "ext4", "/dev/sda1"), (str(tmp_path), "fuse.sshfs", "user@host:/home"))
    runs = RunRecords(str(tmp_path / "runs.db"), "/root", LOG)
    runs.open(3600)
    runs.close()

    async def approvals() -> None:
        gate = ApprovalPolicy(db_path=str(tmp_path / "approvals.db"))
        await gate.start()
        gate.stop()

    asyncio.run(approvals())
    tokens = TokenStore(str(tmp_path / "tokens.db"))
    assert tokens._polling  # lookups read memory; the worker polls the file
    tokens.close()
    for name in ("runs.db", "approvals.db", "tokens.db"):
        with sqlite3.connect(tmp_path / name) as conn:
            assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete", name
        assert not (tmp_path / f"{name}-wal").exists()
    # a file left in WAL mode by a server on a local disk is switched on the network home
    wal = tmp_path / "old.db"
    conn = sqlite3.connect(wal)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE t (x)")
    conn.close()
    conn = stores.open_store(str(wal), label="t", logger=LOG, options=StoreOptions(), timeout=1)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    conn.close()


# -- SQLite without shared memory or POSIX locks ---------------------------------------------------


@pytest.mark.parametrize("vfs", ["unix-dotfile", "unix-none"])
def test_a_vfs_without_shared_memory_keeps_the_rollback_journal_and_says_so(
    tmp_path: Path, vfs: str, caplog: pytest.LogCaptureFixture
) -> None:
    """WAL needs shared memory, which these VFSes (like a network filesystem across hosts) do not give:
    asking for it leaves the rollback journal, and the store says so rather than believing it."""
    uri = f"file:{tmp_path / 'x.db'}?vfs={vfs}"
    conn = sqlite3.connect(uri, uri=True, isolation_level=None)
    with caplog.at_level(logging.WARNING, logger="jupyter_agent_tools.stores"):
        stores.prepare(conn, "wal", lambda c: c.execute("CREATE TABLE t (x)"))
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    assert any("stays in delete journal mode, not wal" in r.getMessage() for r in caplog.records)
    stores.prepare(conn, "delete")
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2
    conn.execute("INSERT INTO t VALUES (1)")
    assert stores.check(conn) is None
    conn.close()


def test_dotfile_locks_make_a_second_writer_wait_then_fail_as_locked(tmp_path: Path) -> None:
    """With dot-file locks (a lock file beside the database, what works where POSIX locks do not), a
    write held by one connection makes another's fail after its busy timeout, seen as 'locked'."""
    uri = f"file:{tmp_path / 'x.db'}?vfs=unix-dotfile"
    first = sqlite3.connect(uri, uri=True, isolation_level=None)
    stores.prepare(first, "delete", lambda c: c.execute("CREATE TABLE t (x)"))
    second = sqlite3.connect(uri, uri=True, isolation_level=None, timeout=0.2)
    first.execute("BEGIN IMMEDIATE")
    first.execute("INSERT INTO t VALUES (1)")
    assert (tmp_path / "x.db.lock").exists()
    started = time.monotonic()
    with pytest.raises(sqlite3.OperationalError) as failed:
        second.execute("INSERT INTO t VALUES (2)")
    assert stores.locked(failed.value) and not stores.corrupt(failed.value)
    assert time.monotonic() - started >= 0.15  # it waited its busy timeout
    first.execute("COMMIT")
    second.execute("INSERT INTO t VALUES (2)")
    assert second.execute("SELECT count(*) FROM t").fetchone()[0] == 2
    first.close()
    second.close()


# -- broken files ----------------------------------------------------------------------------------


def broken(path: Path) -> bytes:
    """Make ``path`` a database whose pages are damaged (its header intact); its bytes."""
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE t (x)")
        conn.executemany("INSERT INTO t VALUES (?)", [("x" * 500,) for _ in range(200)])
    conn.close()
    data = bytearray(path.read_bytes())
    data[4096 * 2 : 4096 * 4] = b"\xff" * 8192
    path.write_bytes(bytes(data))
    return bytes(data)


def test_a_broken_store_is_kept_aside_and_a_fresh_one_started(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "runs.db"
    before = broken(path)
    with caplog.at_level(logging.WARNING):
        records = RunRecords(str(path), "/root", LOG)
        assert records.open(3600) == []
        records.close()
    aside = list(tmp_path.glob("runs.db.corrupt-*"))
    assert len(aside) == 1 and aside[0].read_bytes() == before
    assert any("is broken" in r.getMessage() and str(aside[0]) in r.getMessage() for r in caplog.records)
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    with pytest.raises(StoreCorrupt, match="is broken"):
        broken(tmp_path / "other.db")
        stores.open_store(
            str(tmp_path / "other.db"),
            label="x",
            logger=LOG,
            options=StoreOptions(),
            timeout=1,
            on_corrupt="raise",
        )


def test_a_broken_token_store_fails_closed_and_is_left_as_it_is(tmp_path: Path) -> None:
    """Never a fresh, empty token file in place of a broken one (a revoked token must stay revoked): 503
    naming the file, and the file untouched for the admin."""
    path = tmp_path / "tokens.db"
    store = TokenStore(str(path))
    store.create("bot", ["read"])
    store.revoke("bot")
    store.close()
    data = bytearray(path.read_bytes())
    data[-1024:] = b"\xff" * 1024  # damage the last page (the table's)
    path.write_bytes(bytes(data))
    with pytest.raises(TokenStoreUnavailable, match=str(path)) as refused:
        TokenStore(str(path))
    assert refused.value.status == 503
    assert path.read_bytes() == bytes(data) and not list(tmp_path.glob("*.corrupt-*"))


def test_the_files_are_private_and_confined(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        made = stores.private_file(str(tmp_path / "state" / "x.db"), confine_to=str(tmp_path / "state"))
    finally:
        os.umask(old)
    assert os.stat(made).st_mode & 0o777 == 0o600
    assert os.stat(tmp_path / "state").st_mode & 0o777 == 0o700
    (tmp_path / "state" / "link.db").symlink_to(tmp_path / "elsewhere.db")
    with pytest.raises(stores.StoreError, match="leads outside"):
        stores.private_file(str(tmp_path / "state" / "link.db"), confine_to=str(tmp_path / "state"))
    assert not (tmp_path / "elsewhere.db").exists()


# -- which process ---------------------------------------------------------------------------------

SLEEPER = "import time; print('up', flush=True); time.sleep(60)"


def identity_of(pid: int) -> ProcessIdentity:
    me = this_process()
    started = stores.start_time(pid)
    assert started is not None
    return ProcessIdentity(me.host, me.boot, me.namespace, pid, started)


def test_alive_means_the_same_process_not_the_same_number() -> None:
    me = this_process()
    assert me.started and me.boot and owner_alive(me.key, None, 90)
    child = subprocess.Popen([sys.executable, "-c", SLEEPER], stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None and child.stdout.readline() == b"up\n"
        other = identity_of(child.pid)
        assert owner_alive(other.key, None, 90)
        # the same PID with another start time: a process that had this number before (a restarted pod)
        previous = ProcessIdentity(me.host, me.boot, me.namespace, child.pid, other.started - 1)
        assert not owner_alive(previous.key, time.time(), 90)  # (a heartbeat does not make it alive)
    finally:
        child.kill()
        child.wait()
    assert not owner_alive(other.key, None, 90)
    # an owner this process cannot look up (another host, another PID namespace): its heartbeat decides
    elsewhere = ProcessIdentity("pod-b", me.boot, me.namespace, me.pid, me.started).key
    assert owner_alive(elsewhere, time.time() - 10, 90)
    assert not owner_alive(elsewhere, time.time() - 100, 90)
    assert not owner_alive(elsewhere, None, 90)
    assert not owner_alive("1234", None, 90) and not owner_alive(None, None, 90)  # unreadable: gone


def previous_process() -> str:
    """The identity of a process that had this PID before (this host, boot and namespace)."""
    me = this_process()
    return ProcessIdentity(me.host, me.boot, me.namespace, me.pid, me.started - 100).key


def test_runs_of_a_previous_process_with_the_same_pid_are_lost(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    records = RunRecords(str(path), "/root", LOG)
    records.open(3600)
    records.close()
    me = this_process()
    rows = [
        ("old", previous_process(), 0.0),  # same PID, earlier start: gone
        ("pod-b", ProcessIdentity("pod-b", "b", "ns", 7, 5).key, time.time()),  # another host, beating
        ("pod-c", ProcessIdentity("pod-c", "c", "ns", 7, 5).key, time.time() - 1000),  # stopped beating
    ]
    with sqlite3.connect(path) as conn:
        for run_id, owner, heartbeat in rows:
            conn.execute(
                "INSERT INTO runs (id, root, pid, process, owner, kind, target, state, created) "
                "VALUES (?, '/root', ?, ?, 'alice', 'eval', 's', 'running', 1.0)",
                (run_id, me.pid, owner),
            )
            conn.execute("INSERT INTO owners VALUES (?, ?)", (owner, heartbeat))
    conn.close()
    again = RunRecords(str(path), "/root", LOG)
    listed = {row["id"]: row["state"] for row in again.open(3600)}
    again.close()
    assert listed == {"old": "lost", "pod-c": "lost"}  # pod-b's run goes on there


def test_a_server_that_stops_beating_later_has_its_runs_found_lost(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    found: list[list[dict[str, Any]]] = []
    options = StoreOptions(owner_timeout=0.6)
    records = RunRecords(str(path), "/root", LOG, options, on_lost=found.append)
    records.open(3600)
    other = ProcessIdentity("pod-b", "b", "ns", 7, 5).key
    records._worker.submit(
        lambda: (
            records._conn.execute(  # type: ignore[union-attr]
                "INSERT INTO runs (id, root, pid, process, owner, kind, target, state, created) "
                "VALUES ('r', '/root', 7, ?, 'alice', 'eval', 's', 'running', 1.0)",
                (other,),
            ),
            records._conn.execute("INSERT INTO owners VALUES (?, ?)", (other, time.time())),  # type: ignore[union-attr]
        )
    ).result()
    time.sleep(0.3)
    assert found == []  # its heartbeat is fresh
    deadline = time.monotonic() + 10
    while not found and time.monotonic() < deadline:
        time.sleep(0.05)
    records.close()
    assert [[row["id"] for row in rows] for rows in found] == [["r"]] and found[0][0]["state"] == "lost"


# -- approvals shared by servers -------------------------------------------------------------------

OTHER_SERVER = textwrap.dedent(
    """
    import asyncio, sys
    from jupyter_agent_tools.approvals.service import ApprovalPolicy

    async def main():
        gate = ApprovalPolicy(db_path=sys.argv[1], max_pending_per_agent=100)
        await gate.start()
        ids = []
        for i in range(int(sys.argv[2])):
            a = await gate.request(agent="agent:b", door="http", action="edit", path=None, summary="s",
                                   details={"i": i})
            ids.append(a.id)
        print(" ".join(map(str, ids)), flush=True)
        await asyncio.sleep(120)

    asyncio.run(main())
    """
)


async def test_two_servers_on_one_approvals_file_get_distinct_ids_and_keep_each_others_pending(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "approvals.db")
    env = {**os.environ, "PYTHONPATH": ROOT}
    other = subprocess.Popen(
        [sys.executable, "-c", OTHER_SERVER, path, "30"], stdout=subprocess.PIPE, env=env
    )
    try:
        gate = ApprovalPolicy(db_path=path, max_pending_per_agent=100)
        await gate.start()
        mine = [
            (
                await gate.request(
                    agent="agent:a", door="http", action="edit", path=None, summary="s", details={}
                )
            ).id
            for _ in range(30)
        ]
        assert other.stdout is not None
        theirs = [int(i) for i in (await asyncio.to_thread(other.stdout.readline)).split()]
        assert len(theirs) == 30 and not set(mine) & set(theirs)
        gate.stop()
        again = ApprovalPolicy(db_path=path)
        await again.start()  # the other server runs: its pending requests stay pending
        assert {(await again.get(i)).state for i in theirs} == {"pending"}
        assert {(await again.get(i)).state for i in mine} == {"expired"}  # (its own server stopped)
        again.stop()
    finally:
        other.send_signal(signal.SIGKILL)
        other.wait()
    last = ApprovalPolicy(db_path=path)
    await last.start()  # now it is gone: its pending requests expire
    assert {(await last.get(i)).state for i in theirs} == {"expired"}
    last.stop()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    conn.close()


# -- where -----------------------------------------------------------------------------------------


def test_the_state_dir_comes_from_config_or_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(stores.SERVER_NAME_ENV, raising=False)
    monkeypatch.setenv(stores.STATE_DIR_ENV, str(tmp_path / "env"))
    assert AgentStores().path("agent_tools_runs.db") == str(tmp_path / "env" / "agent_tools_runs.db")
    assert AgentStores(state_dir=str(tmp_path / "cfg")).directory() == str(tmp_path / "cfg")
    monkeypatch.delenv(stores.STATE_DIR_ENV)
    assert AgentStores().directory("/data") == "/data"
    from traitlets.config import Config

    from jupyter_agent_tools.runs.registry import RunRegistry

    config = Config({"AgentStores": {"state_dir": str(tmp_path / "s")}})
    assert RunRegistry(config=config).runs_db_path == str(tmp_path / "s" / "agent_tools_runs.db")
    config.RunRegistry.runs_db_path = str(tmp_path / "own.db")  # a store's own setting wins
    assert RunRegistry(config=config).runs_db_path == str(tmp_path / "own.db")


@pytest.mark.parametrize(
    ("server_name", "name"),
    [
        (None, "agent_tools_ledger.db"),
        ("", "agent_tools_ledger.db"),  # the user's default server
        ("gpu", "agent_tools_ledger.gpu-"),
        ("my server/../x", "agent_tools_ledger.my_server____x-"),
    ],
)
def test_named_hub_servers_sharing_a_home_each_have_their_own_files(
    monkeypatch: pytest.MonkeyPatch, server_name: str | None, name: str
) -> None:
    if server_name is None:
        monkeypatch.delenv(stores.SERVER_NAME_ENV, raising=False)
    else:
        monkeypatch.setenv(stores.SERVER_NAME_ENV, server_name)
    got = stores.tagged("agent_tools_ledger.db")
    assert got.startswith(name) and got.endswith(".db") and "/" not in got
    tokens = stores.tagged(os.path.join("jupyter_agent_tools", "agent_tokens.db"))
    assert tokens.startswith("jupyter_agent_tools/agent_tokens") and tokens.count("/") == 1
    from jupyter_agent_tools.auth.identity import _per_server

    assert _per_server("agent_tokens.db") == os.path.basename(tokens)  # the token store's naming is the same
    monkeypatch.setenv(stores.STATE_DIR_ENV, "/state")
    assert AgentStores().path("agent_tools_runs.db") == os.path.join(
        "/state", stores.tagged("agent_tools_runs.db")
    )

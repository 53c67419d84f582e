"""The SQLite files of the extension's stores (agent tokens, change ledger, runs, approvals): where they live,
how they are created and opened, and which server process owns what is in them.

- **Where**: ``AgentStores.state_dir`` (or ``JUPYTER_AGENT_TOOLS_STATE_DIR``), the Jupyter data directory by
  default; each store's own path setting still wins. On a JupyterHub named server
  (``JUPYTERHUB_SERVER_NAME``) the file names carry the server's name: a user's named servers share a home,
  not their files.
- **How**: created 0600 (with their directory 0700) before SQLite touches them; the journal mode fits the
  filesystem: WAL on a local disk, a rollback journal with ``synchronous=FULL`` on a network filesystem
  (WAL's shared memory does not work across hosts), and when the filesystem cannot be told, the network
  choice. Opening checks the file (``PRAGMA quick_check``): a broken one is kept beside as
  ``<name>.corrupt-<time>`` and a fresh one started, with a log line saying so (or, for a store that must
  not start empty, :class:`StoreCorrupt` is raised).
- **Who**: a :class:`ProcessIdentity` (host, boot id, PID namespace, PID, start time) instead of a PID, and
  a heartbeat in each store's ``owners`` table for owners this process cannot see (another host, another
  PID namespace). Alive means the same process, not the same number.
- **Threads**: each store does its SQLite work in one :class:`Worker` thread of its own; the event loop
  never waits on a file lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import hashlib
import logging
import os
import re
import shutil
import socket
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, TypeVar

from traitlets import Enum, Float, Unicode, default, validate
from traitlets.config import LoggingConfigurable

from .service import at_least

T = TypeVar("T")
log = logging.getLogger(__name__)

STATE_DIR_ENV = "JUPYTER_AGENT_TOOLS_STATE_DIR"
SERVER_NAME_ENV = "JUPYTERHUB_SERVER_NAME"
# Filesystem types where WAL must not be used (their locks or shared memory do not reach other hosts).
NETWORK_TYPES = frozenset(
    {
        "nfs",
        "nfs4",
        "cifs",
        "smb3",
        "smbfs",
        "ncpfs",
        "afs",
        "openafs",
        "lustre",
        "gpfs",
        "ceph",
        "glusterfs",
        "beegfs",
        "ocfs2",
        "gfs2",
        "9p",
        "davfs",
        "coda",
        "orangefs",
        "pvfs2",
        "panfs",
    }
)
# FUSE filesystems are network ones (sshfs, s3fs, gcsfuse, rclone, glusterfs, cephfs...) unless named here.
LOCAL_FUSE = frozenset({"fuseblk", "fuse.ntfs-3g", "fuse.lxcfs", "fuse.bindfs", "fuse.fuse-overlayfs"})
# statfs f_type magic numbers of network filesystems (when the mount table cannot be read).
NETWORK_MAGIC = {
    0x6969: "nfs",
    0xFF534D42: "cifs",
    0xFE534D42: "smb2",
    0x517B: "smbfs",
    0x5346414F: "afs",
    0x0BD00BD0: "lustre",
    0x47504653: "gpfs",
    0x00C36400: "ceph",
    0x65735546: "fuse",
    0x01021997: "9p",
    0x73757245: "coda",
}
MOUNTINFO = "/proc/self/mountinfo"  # the mount table read (a test gives a fake one)
LOCAL = "local"
NETWORK = "network"
SUFFIXES = ("-wal", "-shm", "-journal")  # the files SQLite keeps beside a database
HEARTBEAT_MIN = 0.2  # seconds: the shortest heartbeat (tests use short owner timeouts)
# FUSE network filesystems (sshfs, s3fs, rclone...) keep POSIX locks to one mount: two mounts of one export
# (two pods) do not see each other's. SQLite's dot-file locks (a lock directory made beside the database,
# which the file server makes or refuses) work there; a holder that was killed leaves it behind, so a lock
# older than this (seconds: a transaction takes milliseconds) is removed.
DOTFILE_VFS = "unix-dotfile"
STALE_LOCK = 30.0


# -- where ---------------------------------------------------------------------------------------


def tagged(name: str, env: dict[str, str] | None = None) -> str:
    """``name`` (``agent_tools_ledger.db``) for this server: on a JupyterHub named server
    (``JUPYTERHUB_SERVER_NAME``) ``agent_tools_ledger.NAME-HASH.db``, where NAME keeps letters, digits,
    ``_`` and ``-`` (others become ``_``) and HASH (of the name) keeps names that look alike apart; else (not
    on a hub, or the user's default server, whose name is empty) ``name`` itself."""
    server = (os.environ if env is None else env).get(SERVER_NAME_ENV) or ""
    if not server:
        return name
    safe = re.sub(r"[^A-Za-z0-9_-]", "_", server)[:64]
    digest = hashlib.sha256(server.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    head, base = os.path.split(name)
    stem, dot, ext = base.rpartition(".")
    tagged_base = f"{stem}.{safe}-{digest}{dot}{ext}" if dot else f"{base}.{safe}-{digest}"
    return os.path.join(head, tagged_base) if head else tagged_base


class StoreError(Exception):
    """A store's file cannot be made or opened where it was asked to be."""


class StoreCorrupt(StoreError):
    """The file is not a sound SQLite database (and the store must not start empty)."""


class AgentStores(LoggingConfigurable):
    """Where the extension's SQLite stores live and how they are opened (``c.AgentStores.*``)."""

    state_dir = Unicode(
        help="Directory of the extension's SQLite stores (agent tokens, change ledger, runs, approvals). "
        "Default: $JUPYTER_AGENT_TOOLS_STATE_DIR, else the Jupyter data directory. A store's own path "
        "setting (Ledger.db_path, RunRegistry.runs_db_path, ApprovalPolicy.db_path, "
        "AgentIdentityProvider.token_db) wins over it. On a JupyterHub named server the file names carry "
        "the server's name.",
    ).tag(config=True)
    journal = Enum(
        ["auto", "wal", "rollback"],
        "auto",
        help="SQLite journal of the stores: 'auto' chooses by filesystem (WAL on a local disk; a rollback "
        "journal with synchronous=FULL on a network filesystem, or when it cannot be told); 'wal' or "
        "'rollback' force one.",
    ).tag(config=True)
    owner_timeout = Float(
        90.0,
        help="Seconds without a heartbeat after which a server process this one cannot see (another host "
        "or container sharing the files) is taken as gone: its runs become 'lost', its pending approval "
        "requests expire, its unfinished change groups are recorded. Heartbeats come every third of it.",
    ).tag(config=True)

    @default("state_dir")
    def _default_state_dir(self) -> str:
        return os.environ.get(STATE_DIR_ENV, "")

    @validate("owner_timeout")
    def _valid_owner_timeout(self, proposal: Any) -> float:
        return float(at_least(proposal, 3 * HEARTBEAT_MIN))

    @validate("state_dir")
    def _valid_state_dir(self, proposal: Any) -> str:
        value = str(proposal["value"])
        return os.path.abspath(os.path.expanduser(value)) if value else ""

    def directory(self, data_dir: str | None = None) -> str:
        """The directory of the stores: ``state_dir``, else ``data_dir``, else the Jupyter data directory."""
        if self.state_dir:
            return self.state_dir
        if data_dir:
            return data_dir
        from jupyter_core.paths import jupyter_data_dir

        return jupyter_data_dir()

    def path(self, name: str, data_dir: str | None = None) -> str:
        """The default file of the store ``name`` (relative; tagged with the hub server's name)."""
        return os.path.join(self.directory(data_dir), tagged(name))

    def options(self) -> StoreOptions:
        return StoreOptions(journal=self.journal, owner_timeout=self.owner_timeout)


@dataclass(frozen=True)
class StoreOptions:
    """What every store's opening needs of :class:`AgentStores`."""

    journal: str = "auto"
    owner_timeout: float = 90.0

    @property
    def heartbeat(self) -> float:
        return max(HEARTBEAT_MIN, self.owner_timeout / 3)


def store_options(parent: Any) -> StoreOptions:
    """The options configured for ``parent``'s stores (``c.AgentStores.*``)."""
    return AgentStores(parent=parent).options()


# -- private files -------------------------------------------------------------------------------


def private_file(path: str, confine_to: str | None = None) -> str:
    """Create ``path`` (and its directory, 0700) as a file only the server's user can read, or tighten an
    existing one and SQLite's files beside it; the resolved path. ``confine_to``: the path must resolve
    inside that directory (symlinks followed), else :class:`StoreError`."""
    directory = os.path.dirname(path)
    if directory:
        os.makedirs(directory, mode=0o700, exist_ok=True)
    resolved = os.path.realpath(path)
    if confine_to is not None:
        root = os.path.realpath(confine_to)
        if os.path.commonpath([root, resolved]) != root:
            raise StoreError(f"{path} leads outside {confine_to} (to {resolved})")
    fd = os.open(resolved, os.O_CREAT | os.O_RDWR | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        os.fchmod(fd, 0o600)
    finally:
        os.close(fd)
    for suffix in SUFFIXES:  # SQLite gives its journal the database's mode; an old one may be wider
        with contextlib.suppress(FileNotFoundError):
            os.chmod(resolved + suffix, 0o600)
    return resolved


# -- which filesystem ----------------------------------------------------------------------------


def _unescape(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def parse_mountinfo(text: str) -> list[tuple[str, str, str]]:
    """(mount point, filesystem type, source) of each line of ``/proc/self/mountinfo``."""
    mounts = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        fields, rest = left.split(), right.split()
        if not sep or len(fields) < 5 or not rest:
            continue
        mounts.append((_unescape(fields[4]), rest[0], _unescape(rest[1]) if len(rest) > 1 else ""))
    return mounts


def classify(fs_type: str) -> str:
    """``network`` or ``local`` for a mount table's filesystem type."""
    if fs_type in NETWORK_TYPES or fs_type.split(".")[0] in NETWORK_TYPES:
        return NETWORK
    if fs_type == "fuse" or (fs_type.startswith("fuse.") and fs_type not in LOCAL_FUSE):
        return NETWORK
    return LOCAL


def _existing(path: str) -> str:
    """The nearest existing directory at or above ``path`` (resolved)."""
    current = os.path.realpath(path)
    while not os.path.isdir(current):
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    return current


def _statfs_type(path: str) -> int | None:
    """``statfs(path).f_type`` on Linux, None elsewhere or when it fails."""
    if os.uname().sysname != "Linux":
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        buf = ctypes.create_string_buffer(256)  # struct statfs: f_type is its first word
        if libc.statfs(os.fsencode(path), buf) != 0:
            return None
        return ctypes.c_long.from_buffer(buf).value & 0xFFFFFFFF
    except (OSError, AttributeError, ValueError):
        return None


def fs_type(path: str, mountinfo: str | None = None) -> str | None:
    """The mount table's type of the filesystem holding ``path`` (None when it cannot be read)."""
    what = filesystem(path, mountinfo)[1]
    return what.split(" at ", 1)[0] if " at " in what else None


def vfs_for(path: str, setting: str = "auto", mountinfo: str | None = None) -> str | None:
    """The SQLite VFS for ``path``: dot-file locks on a FUSE network filesystem (whose POSIX locks stay in
    one mount), else the default (None)."""
    if path == ":memory:" or setting == "wal":
        return None
    found = fs_type(path, mountinfo) or ""
    fuse = found == "fuse" or found.startswith("fuse.")
    return DOTFILE_VFS if fuse and classify(found) == NETWORK else None


def sqlite_connect(path: str, timeout: float, vfs: str | None = None) -> sqlite3.Connection:
    """An autocommit connection any thread may use (the store's worker owns it), through ``vfs``."""
    target: str = path
    if vfs is not None:
        target = f"{Path(os.path.abspath(path)).as_uri()}?vfs={vfs}"
    return sqlite3.connect(
        target, timeout=timeout, isolation_level=None, check_same_thread=False, uri=bool(vfs)
    )


def leave_wal(path: str) -> None:
    """Turn a database left in WAL mode (by a server that took its filesystem for local) back to a rollback
    journal through the default VFS: the dot-file VFS has no shared memory and cannot open it."""
    try:
        with open(path, "rb") as f:
            header = f.read(20)
    except OSError:
        return
    if len(header) < 20 or header[18:20] != b"\x02\x02":  # (file format versions 2: WAL)
        return
    conn = sqlite3.connect(path, timeout=5.0, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode = DELETE")
    except sqlite3.Error as e:
        log.warning("%s stays in WAL mode (%s): another process has it open", path, e)
    finally:
        conn.close()


def break_stale_lock(path: str, older_than: float = STALE_LOCK) -> bool:
    """Remove a dot-file lock of ``path`` left by a killed holder (older than ``older_than`` seconds)."""
    lock = path + ".lock"
    try:
        age = time.time() - os.lstat(lock).st_mtime
    except OSError:
        return False
    if age < older_than:
        return False
    with contextlib.suppress(OSError):
        if os.path.isdir(lock) and not os.path.islink(lock):
            shutil.rmtree(lock)
        else:
            os.remove(lock)
        log.warning("removed the lock %s, left %.0f s ago by a process that is gone", lock, age)
        return True
    return False


def filesystem(path: str, mountinfo: str | None = None) -> tuple[str, str]:
    """(``local`` or ``network``, what it is) for the filesystem holding ``path`` (or its nearest existing
    parent): from the mount table (``mountinfo``: its text, else ``/proc/self/mountinfo``), else the
    ``statfs`` magic number; ``network`` when neither tells."""
    where = _existing(path)
    if mountinfo is None:
        try:
            with open(MOUNTINFO, encoding="utf-8", errors="surrogateescape") as f:
                mountinfo = f.read()
        except OSError:
            mountinfo = ""
    best: tuple[str, str, str] | None = None
    for point, fs_type, source in parse_mountinfo(mountinfo):
        inside = where == point or where.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) >= len(best[0])):
            best = (point, fs_type, source)  # (a later mount on the same point hides an earlier one)
    if best is not None:
        return classify(best[1]), f"{best[1]} at {best[0]}"
    magic = _statfs_type(where)
    if magic is not None:
        name = NETWORK_MAGIC.get(magic)
        return (NETWORK, f"{name} (statfs)") if name else (LOCAL, f"statfs type {magic:#x}")
    return NETWORK, "unknown (no mount table, no statfs)"


_said: set[tuple[str, str]] = set()
_said_lock = threading.Lock()


def journal_for(path: str, setting: str = "auto", mountinfo: str | None = None) -> str:
    """``wal`` or ``delete`` (a rollback journal) for the database at ``path``; the choice is logged once
    per filesystem."""
    if path == ":memory:" or path.startswith("file:"):
        return "wal" if setting == "wal" else "delete" if setting == "rollback" else "memory"
    kind, what = filesystem(path, mountinfo)
    if setting == "wal":
        mode, why = "wal", "forced by AgentStores.journal"
    elif setting == "rollback":
        mode, why = "delete", "forced by AgentStores.journal"
    elif kind == LOCAL:
        mode, why = "wal", "a local filesystem"
    else:
        mode, why = (
            "delete",
            "a network filesystem, or one that could not be told" + ("; WAL does not work across hosts"),
        )
    key = (what, mode)
    with _said_lock:
        first = key not in _said
        _said.add(key)
    if first:
        journal = "WAL" if mode == "wal" else "rollback journal, synchronous=FULL"
        log.info("jupyter_agent_tools stores on %s (%s): %s (%s)", what, os.path.dirname(path), journal, why)
    return mode


# -- opening -------------------------------------------------------------------------------------


def corrupt(error: BaseException) -> bool:
    """Whether ``error`` says the file is not a sound database (rather than locked or unreadable)."""
    return isinstance(error, sqlite3.DatabaseError) and not isinstance(error, sqlite3.OperationalError)


def locked(error: BaseException) -> bool:
    return isinstance(error, sqlite3.OperationalError) and ("locked" in str(error) or "busy" in str(error))


def set_aside(path: str, logger: logging.Logger, label: str, why: str) -> str:
    """Move a broken database (and its journal) to ``<path>.corrupt-<time>``; the name it now has."""
    aside = f"{path}.corrupt-{time.strftime('%Y%m%dT%H%M%S')}"
    n = 1
    while os.path.exists(aside):
        n += 1
        aside = f"{path}.corrupt-{time.strftime('%Y%m%dT%H%M%S')}-{n}"
    os.replace(path, aside)
    for suffix in SUFFIXES:  # (a log of the old file must not be applied to the new one)
        with contextlib.suppress(FileNotFoundError):
            os.replace(path + suffix, aside + suffix)
    logger.warning(
        "The %s file %s is broken (%s): it is kept as %s and a new, empty one is started in its place.",
        label,
        path,
        why,
        aside,
    )
    return aside


def check(conn: sqlite3.Connection) -> str | None:
    """None when the database is sound (``PRAGMA quick_check``), else what is wrong."""
    rows = [row[0] for row in conn.execute("PRAGMA quick_check(5)").fetchall()]
    return None if rows == ["ok"] else "; ".join(map(str, rows))


def prepare(
    conn: sqlite3.Connection,
    journal: str,
    setup: Callable[[sqlite3.Connection], None] | None = None,
    before_journal: Iterable[str] = (),
) -> None:
    """Put ``conn`` in ``journal`` mode (``wal``, ``delete``; ``memory``: as it is) with the synchronous
    level that goes with it, then ``setup`` (the schema); ``before_journal``: pragmas that come first."""
    for pragma in before_journal:
        conn.execute(pragma)
    if journal != "memory":
        current = conn.execute("PRAGMA journal_mode").fetchone()[0]
        if current != journal:
            try:
                got = conn.execute(f"PRAGMA journal_mode = {journal.upper()}").fetchone()[0]
            except sqlite3.OperationalError as e:  # another connection has it open in WAL mode
                if not locked(e):
                    raise
                got = current
            if got != journal:
                name = next((row[2] for row in conn.execute("PRAGMA database_list") if row[1] == "main"), "")
                log.warning(
                    "%s stays in %s journal mode, not %s (another process has it open, or its filesystem "
                    "does not allow it)",
                    name,
                    got,
                    journal,
                )
        conn.execute("PRAGMA synchronous = " + ("NORMAL" if journal == "wal" else "FULL"))
    if setup is not None:
        setup(conn)


def open_store(
    path: str,
    *,
    label: str,
    logger: logging.Logger,
    options: StoreOptions,
    timeout: float,
    setup: Callable[[sqlite3.Connection], None] | None = None,
    before_journal: Iterable[str] = (),
    on_corrupt: str = "replace",
    confine_to: str | None = None,
) -> sqlite3.Connection:
    """A connection to the store's file (autocommit, usable from the thread that owns it): made private,
    checked, in the journal mode of its filesystem, ``setup`` done. A broken file is set aside and a new
    one started (``on_corrupt="replace"``), or :class:`StoreCorrupt` raised (``"raise"``)."""
    memory = path == ":memory:"
    if not memory:
        private_file(path, confine_to)
    journal = journal_for(path, options.journal)
    vfs = vfs_for(path, options.journal)
    if vfs is not None:
        break_stale_lock(path)
        leave_wal(path)
    for attempt in (1, 2):
        problem: str | None
        try:
            conn = sqlite_connect(path, timeout, vfs)
            try:
                problem = None if memory else check(conn)
                if problem is None:
                    prepare(conn, journal, setup, before_journal)
                    return conn
            except BaseException:
                conn.close()
                raise
            conn.close()
        except sqlite3.DatabaseError as e:
            if not corrupt(e):
                raise
            problem = str(e)
        if on_corrupt != "replace" or attempt == 2:
            raise StoreCorrupt(f"the {label} file {path} is broken: {problem}")
        set_aside(path, logger, label, problem)
        private_file(path, confine_to)
    raise AssertionError("unreachable")


# -- which process -------------------------------------------------------------------------------


def _read(path: str) -> str:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return ""


def start_time(pid: int, proc: str = "/proc") -> int | None:
    """The start time of process ``pid`` (clock ticks since boot, ``/proc/<pid>/stat`` field 22)."""
    text = _read(f"{proc}/{pid}/stat")
    if not text:
        return None
    try:
        return int(text[text.rindex(")") + 2 :].split()[19])
    except (ValueError, IndexError):
        return None


def _pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


@dataclass(frozen=True)
class ProcessIdentity:
    """One server process, told apart from any other that has (had) the same PID: the host's name, its
    boot, the PID namespace, the PID and when the process started."""

    host: str
    boot: str
    namespace: str
    pid: int
    started: int

    @property
    def key(self) -> str:
        return f"{self.host}|{self.boot}|{self.namespace}|{self.pid}|{self.started}"

    @classmethod
    def parse(cls, key: str | None) -> ProcessIdentity | None:
        parts = (key or "").split("|")
        if len(parts) != 5:
            return None
        try:
            return cls(parts[0], parts[1], parts[2], int(parts[3]), int(parts[4]))
        except ValueError:
            return None

    def sees(self, other: ProcessIdentity) -> bool:
        """Whether this process can look ``other`` up by its PID (same kernel, same PID namespace)."""
        return bool(self.boot) and (self.host, self.boot, self.namespace) == (
            other.host,
            other.boot,
            other.namespace,
        )


@lru_cache(maxsize=4)
def _identity(pid: int) -> ProcessIdentity:
    return ProcessIdentity(
        host=socket.gethostname(),
        boot=_read("/proc/sys/kernel/random/boot_id"),
        namespace=_pid_namespace(),
        pid=pid,
        started=start_time(pid) or 0,
    )


def this_process() -> ProcessIdentity:
    """This process's identity (a forked child gets its own)."""
    return _identity(os.getpid())


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists, another user's
    return True


def owner_alive(owner: str | None, heartbeat: float | None, timeout: float, now: float | None = None) -> bool:
    """Whether the server process ``owner`` (a :attr:`ProcessIdentity.key`) still runs: this process; one
    this process can see whose PID still has the same start time; else one whose ``heartbeat`` (seconds
    since the epoch) is younger than ``timeout``. An owner that cannot be read is gone."""
    me = this_process()
    if owner == me.key:
        return True
    other = ProcessIdentity.parse(owner)
    if other is None:
        return False
    if me.sees(other):
        if other.started:
            return start_time(other.pid) == other.started
        return other.pid != me.pid and pid_alive(other.pid)
    now = time.time() if now is None else now
    return heartbeat is not None and now - heartbeat < timeout


OWNERS_SCHEMA = "CREATE TABLE IF NOT EXISTS owners (owner TEXT PRIMARY KEY, heartbeat REAL NOT NULL)"


def beat(conn: sqlite3.Connection) -> None:
    """This process's heartbeat in the store's ``owners`` table (a dot-file lock left by a killed process
    is removed first)."""
    path = next((row[2] for row in conn.execute("PRAGMA database_list") if row[1] == "main"), "")
    if path:
        break_stale_lock(path)
    conn.execute(
        "INSERT INTO owners (owner, heartbeat) VALUES (?, ?) "
        "ON CONFLICT (owner) DO UPDATE SET heartbeat = excluded.heartbeat",
        (this_process().key, time.time()),
    )


def heartbeats(conn: sqlite3.Connection) -> dict[str, float]:
    return dict(conn.execute("SELECT owner, heartbeat FROM owners").fetchall())


def alive_owners(conn: sqlite3.Connection, owners: Iterable[str | None], timeout: float) -> set[str]:
    """Which of ``owners`` still run (see :func:`owner_alive`); the gone ones leave the owners table."""
    beats = heartbeats(conn)
    now = time.time()
    found = {o for o in set(owners) if o is not None and owner_alive(o, beats.get(o), timeout, now)}
    gone = [o for o in beats if o not in found and not owner_alive(o, beats[o], timeout, now)]
    if gone:
        conn.executemany("DELETE FROM owners WHERE owner = ?", [(o,) for o in gone])
    return found


def leave(conn: sqlite3.Connection) -> None:
    """This process stops: its heartbeat goes (best-effort)."""
    with contextlib.suppress(sqlite3.Error):
        conn.execute("DELETE FROM owners WHERE owner = ?", (this_process().key,))


# -- threads -------------------------------------------------------------------------------------


class Worker:
    """The one thread a store does its SQLite work in: the event loop hands work over and never waits on
    a file lock itself."""

    def __init__(self, name: str):
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._timer: threading.Timer | None = None
        self._stopped = False

    def submit(self, func: Callable[..., T], *args: Any) -> Future[T]:
        """``func(*args)`` in the worker; after :meth:`shutdown`, a future failed with RuntimeError."""
        try:
            return self._pool.submit(func, *args)
        except RuntimeError as e:
            failed: Future[T] = Future()
            failed.set_exception(e)
            return failed

    async def run(self, func: Callable[..., T], *args: Any) -> T:
        return await asyncio.wrap_future(self.submit(func, *args))

    def every(self, seconds: float, func: Callable[[], None]) -> None:
        """``func()`` in the worker every ``seconds`` until :meth:`shutdown` (a failure is logged)."""

        def tick() -> None:
            if self._stopped:
                return
            self.submit(guarded)
            self._timer = threading.Timer(seconds, tick)
            self._timer.daemon = True
            self._timer.start()

        def guarded() -> None:
            try:
                func()
            except Exception as e:
                # broad: periodic store work failing any way must not end the timer; logged
                log.debug("periodic store work failed: %s", e)

        self._timer = threading.Timer(seconds, tick)
        self._timer.daemon = True
        self._timer.start()

    def shutdown(self, wait: bool = True) -> None:
        self._stopped = True
        if self._timer is not None:
            self._timer.cancel()
        self._pool.shutdown(wait=wait)

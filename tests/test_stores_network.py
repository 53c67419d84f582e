"""The stores on a real network filesystem: sshfs over loopback (Debian's openssh-server and sshfs, FUSE),
two mounts of one export, one process on each (two pods sharing a home), driven at the same time: the
stores themselves, then two Jupyter servers with the extension (agent tokens, the approval gate, the
ledger, runs), each in a mount namespace where its mount is the home.

The test suite installs openssh-server and sshfs itself when it runs as root with apt-get (as dev.py does
for Chromium); without them it skips, and with ``CI`` set a missing piece fails (tests/ci_strict.py). The
mounts are made without sshfs's and the kernel's caches (``cache=no``, ``direct_io``, zero timeouts), the
way a network home has to be mounted for any program sharing a file across hosts: with cached
attributes a mount keeps seeing a lock that another mount removed.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import nbformat
import pytest

from jupyter_agent_tools.stores import SERVER_NAME_ENV, STATE_DIR_ENV, ProcessIdentity, tagged
from jupyter_agent_tools.testing.server import CONNECTION_ERRORS, Client, Server, jupyter_server

pytestmark = pytest.mark.timeout(300)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = {"openssh-server": "/usr/sbin/sshd", "sshfs": "/usr/bin/sshfs"}
MOUNT_OPTIONS = "cache=no,direct_io,entry_timeout=0,attr_timeout=0,negative_timeout=0"


def _install() -> str | None:
    """What is missing after trying to install it (None: nothing)."""
    missing = [name for name, path in PACKAGES.items() if not os.path.exists(path)]
    apt = shutil.which("apt-get")
    if missing and os.geteuid() == 0 and apt is not None:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        install = [apt, "install", "-y", "-qq", "--no-install-recommends", *missing]
        if subprocess.run(install, env=env, capture_output=True).returncode != 0:
            subprocess.run([apt, "update", "-qq"], env=env, capture_output=True)
            subprocess.run(install, env=env, capture_output=True)
        missing = [name for name, path in PACKAGES.items() if not os.path.exists(path)]
    if missing:
        return f"{' and '.join(missing)} (apt-get install {' '.join(missing)}, as root)"
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse (FUSE)"
    return None


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def as_the_pods_lock(path: Path) -> sqlite3.Connection:
    """A connection to a store file that pod b still writes, through the dot-file locks the pods take on
    sshfs (a plain connection's POSIX locks do not see theirs: it read a file mid-write, disk I/O error)."""
    return sqlite3.connect(f"file:{path}?vfs=unix-dotfile", uri=True, timeout=30)


@pytest.fixture
def two_mounts(tmp_path: Path) -> Iterator[tuple[Path, Path, Path]]:
    """(export, mount 1, mount 2): one directory served by a loopback sshd, mounted twice with sshfs."""
    if sys.platform != "linux":
        pytest.skip("not applicable here: sshfs mounts are made on Linux")
    if os.geteuid() != 0:
        pytest.skip("not applicable here: mounting sshfs and running sshd need root")
    missing = _install()
    if missing is not None:
        pytest.skip(f"the network filesystem test needs {missing}")
    keys, export = tmp_path / "ssh", tmp_path / "export"
    keys.mkdir(mode=0o700)
    export.mkdir()
    for name in ("host_key", "client_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(keys / name)], check=True)
    shutil.copy(keys / "client_key.pub", keys / "authorized_keys")
    port = _port()
    config = keys / "sshd_config"
    config.write_text(
        textwrap.dedent(
            f"""
            Port {port}
            ListenAddress 127.0.0.1
            HostKey {keys / "host_key"}
            AuthorizedKeysFile {keys / "authorized_keys"}
            PasswordAuthentication no
            PermitRootLogin prohibit-password
            StrictModes no
            UsePAM no
            PidFile {keys / "sshd.pid"}
            Subsystem sftp internal-sftp
            """
        )
    )
    os.makedirs("/run/sshd", exist_ok=True)
    sshd = subprocess.Popen(["/usr/sbin/sshd", "-D", "-f", str(config), "-E", str(keys / "sshd.log")])
    mounts = [tmp_path / "pod-a", tmp_path / "pod-b"]
    try:
        for _ in range(100):
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.05)
        for mount in mounts:
            mount.mkdir()
            options = (
                f"IdentityFile={keys / 'client_key'},StrictHostKeyChecking=no,UserKnownHostsFile=/dev/null,"
                f"BatchMode=yes,{MOUNT_OPTIONS}"
            )
            subprocess.run(
                ["sshfs", "-p", str(port), "-o", options, f"root@127.0.0.1:{export}", str(mount)],
                check=True,
                timeout=30,
            )
        yield export, mounts[0], mounts[1]
    finally:
        for mount in mounts:
            subprocess.run(["fusermount", "-u", str(mount)], capture_output=True)
        sshd.terminate()
        sshd.wait(10)


# One "pod": its stores on its mount, the state directory shared; requests and runs in a bounded loop.
POD = textwrap.dedent(
    """
    import asyncio, json, os, sys, time
    from jupyter_agent_tools.approvals.service import ApprovalPolicy
    from jupyter_agent_tools.auth.store import TokenStore
    from jupyter_agent_tools.runs.records import RunRecords
    import logging

    state, name, count, forever = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "forever"

    class Run:
        def __init__(self, i):
            self.id, self.owner, self.kind, self.target = f"{name}-{i}", name, "eval", "s"
            self.state, self.created, self.ended, self.message = "running", time.time(), None, None

    async def main():
        gate = ApprovalPolicy(db_path=os.path.join(state, "approvals.db"), max_pending_per_agent=10000)
        await gate.start()
        runs = RunRecords(os.path.join(state, "runs.db"), "/home/jovyan", logging.getLogger(name))
        await runs.open_async(3600)
        tokens = TokenStore(os.path.join(state, "tokens.db"), write_timeout=30)
        ids = []
        for i in range(count):
            a = await gate.request(agent=f"agent:{name}", door="http", action="edit", path=None,
                                   summary="s", details={"i": i})
            ids.append(a.id)
            runs.save(Run(i))
            await tokens.call(tokens.create, f"{name}-{i}", ["read"])
        runs.settle()
        print(json.dumps({"ids": ids, "pid": os.getpid()}), flush=True)
        i = count
        while forever:  # writing until killed
            await gate.request(agent=f"agent:{name}", door="http", action="edit", path=None, summary="s",
                               details={"i": i, "pad": "x" * 5000})
            runs.save(Run(i))
            i += 1
        await asyncio.sleep(3600)

    asyncio.run(main())
    """
)


def pod(mount: Path, name: str, count: int, forever: bool = False) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": ROOT}
    return subprocess.Popen(
        [sys.executable, "-c", POD, str(mount / "state"), name, str(count), "forever" if forever else "once"],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )


def test_two_pods_on_two_sshfs_mounts_of_one_home_share_the_stores_safely(
    two_mounts: tuple[Path, Path, Path],
) -> None:
    export, mount_a, mount_b = two_mounts
    count = 15
    pods = [pod(mount_a, "a", count), pod(mount_b, "b", count, forever=True)]
    try:
        answers = {}
        for name, process in zip("ab", pods, strict=True):
            assert process.stdout is not None
            line = process.stdout.readline()
            assert line, f"pod {name} failed"
            answers[name] = json.loads(line)
        ids_a, ids_b = answers["a"]["ids"], answers["b"]["ids"]
        assert len(set(ids_a) | set(ids_b)) == 2 * count  # distinct ids, from SQLite
        state = export / "state"
        # each pod's pending requests are untouched by the other's start; runs are each pod's own
        with as_the_pods_lock(state / "approvals.db") as conn:
            assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"  # not WAL on sshfs
            rows = dict(conn.execute("SELECT id, state FROM approvals").fetchall())
        conn.close()
        assert {rows[i] for i in ids_a + ids_b} == {"pending"}
        with as_the_pods_lock(state / "runs.db") as conn:
            owners = dict(conn.execute("SELECT id, owner FROM runs").fetchall())
            processes = {o for (o,) in conn.execute("SELECT DISTINCT process FROM runs")}
        conn.close()
        assert all(owners[f"a-{i}"] == "a" and owners[f"b-{i}"] == "b" for i in range(count))
        assert len(processes) == 2
        time.sleep(0.5)  # pod b writes on
        pods[1].send_signal(signal.SIGKILL)  # mid-write
        pods[1].wait(10)
    finally:
        for process in pods:
            process.kill()
            process.wait(10)
    for name in ("approvals.db", "runs.db", "tokens.db"):
        with sqlite3.connect(export / "state" / name) as conn:  # (rolls back a killed pod's hot journal)
            assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok", name
            if name == "tokens.db":
                assert conn.execute("SELECT count(*) FROM agent_tokens").fetchone()[0] == 2 * count
        conn.close()


# Two Jupyter servers with the extension, as z2jh runs them: each in a mount namespace of its own where its
# sshfs mount of the export is the home at the same path (a pod's /home/jovyan), the stores in the home's
# data directory (JUPYTER_AGENT_TOOLS_STATE_DIR), the same hub server name (so the same file names): the old
# and the new pod of one restart, both up for a while.
SERVER_NAME = "analysis"
GATE = {
    "ServerApp": {
        "identity_provider_class": "jupyter_agent_tools.auth.AgentIdentityProvider",
        "authorizer_class": "jupyter_agent_tools.auth.AgentAuthorizer",
    },
    "ApprovalPolicy": {"rules": [{"who": "agent:*", "actions": ["execute"], "decision": "ask"}]},
    "KernelPool": {"size": 0},
}
STORES = (
    "agent_tools_approvals.db",
    "agent_tools_ledger.db",
    "agent_tools_runs.db",
    os.path.join("jupyter_agent_tools", "agent_tokens.db"),
)
REQUESTS = 8  # approval requests per agent (under ApprovalPolicy.max_pending_per_agent, 20)
MOST_ROUNDS = 400  # of an agent's loop
# sh -c SCRIPT pod SOURCE TARGET COMMAND...: the mount, then the server's command in the same process
BIND_THEN_EXEC = 'mount --bind "$1" "$2" && shift 2 && exec "$@"'


def pod_server(unshare: str, mount: Path, home: Path, config: Path) -> AbstractContextManager[Server]:
    """A Jupyter server whose home (root dir, state dir) is ``mount``, seen at ``home``."""
    prefix = [unshare, "--mount", "--propagation", "private", "sh", "-c", BIND_THEN_EXEC, "pod"]
    env = {SERVER_NAME_ENV: SERVER_NAME, STATE_DIR_ENV: str(home / ".local" / "share" / "jupyter")}
    return jupyter_server(
        root_dir=home,
        extra_args=[f"--config={config}"],
        env=env,
        command_prefix=[*prefix, str(mount), str(home)],
    )


class Agent(threading.Thread):
    """An agent on one pod in a bounded loop: evals the person must approve (202: an approval id and a
    detached run waiting for it), REQUESTS of them, and edits of its notebook (ledger entries)."""

    def __init__(self, server: Server, token: str, notebook: str):
        super().__init__(daemon=True)
        self.server, self.token, self.notebook = server, token, notebook
        self.approvals: list[int] = []
        self.runs: list[str] = []
        self.changes: list[int] = []  # recorded edits (an edit made but not recorded is answered so)
        self.unrecorded = 0
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with Client(self.server.url, self.token, timeout=30) as client:
                for i in range(MOST_ROUNDS):
                    if self.stop.is_set():
                        return
                    if len(self.approvals) < REQUESTS:
                        body = {"cells": [{"code": f"print({i})"}], "approval_wait": 0}
                        started = client.json("POST", "api/agent/eval", body, expect=202)
                        self.approvals.append(int(started["approval_id"]))
                        self.runs.append(str(started["run_id"]))
                    edit = {"action": "insert", "content": f"x = {i}  # {'pad ' * 200}"}
                    edited = client.json("POST", f"api/agent/notebooks/{self.notebook}", edit)
                    if edited["recorded"]:
                        self.changes.append(int(edited["change_id"]))
                    else:  # the other pod held the ledger's lock past its wait (SHARED_LOCK_TIMEOUT)
                        self.unrecorded += 1
        except BaseException as e:  # (the killed pod's agent: its connection drops)
            self.error = e


def until(what: str, done: Callable[[], bool], agents: list[Agent], timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        for agent in agents:
            assert agent.error is None, repr(agent.error)
        time.sleep(0.02)


def test_two_jupyter_servers_on_two_sshfs_mounts_of_one_home(
    two_mounts: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    """Agents on both servers at once: approval ids distinct; the second server's start leaves the first's
    pending requests pending; ledger entries and runs name their server's process; no store in WAL mode;
    one server killed (kill -9) while its agent edits: every store passes PRAGMA integrity_check."""
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("not applicable here: mount namespaces need unshare (util-linux)")
    export, mount_a, mount_b = two_mounts
    home = tmp_path / "home"  # where each pod sees its mount (an empty directory outside the pods)
    home.mkdir()
    for name in ("a.ipynb", "b.ipynb"):
        nbformat.write(nbformat.v4.new_notebook(), str(export / name))
    config = tmp_path / "gate_config.json"
    config.write_text(json.dumps(GATE))

    def agent(server: Server, name: str) -> Agent:
        with server.client() as person:
            body = {"name": f"bot-{name}", "scopes": ["edit", "execute"]}
            token = person.json("POST", "api/agent/tokens", body, expect=201)["token"]
        return Agent(server, token, f"{name}.ipynb")

    with pod_server(unshare, mount_a, home, config) as a:
        agent_a = agent(a, "a")
        agent_a.start()
        try:
            until("pod a's first requests", lambda: len(agent_a.approvals) >= 3, [agent_a])
            before_b, runs_before_b = list(agent_a.approvals), list(agent_a.runs)
            with pod_server(unshare, mount_b, home, config) as b:
                with a.client() as person_a, b.client() as person_b:  # (b reads a's from the file)
                    for person in (person_a, person_b):
                        states = {person.json("GET", f"api/agent/approvals/{i}")["state"] for i in before_b}
                        assert states == {"pending"}, states
                    for r in runs_before_b:  # a's runs go on; b lists none of them (as lost)
                        assert person_a.json("GET", f"api/agent/runs/{r}")["state"] == "awaiting_approval"
                        assert person_b.request("GET", f"api/agent/runs/{r}")[0] == 404
                agent_b = agent(b, "b")
                agent_b.start()
                try:
                    both = [agent_a, agent_b]
                    until(
                        "both agents' requests and edits",
                        lambda: all(len(x.approvals) == REQUESTS and len(x.changes) >= 10 for x in both),
                        both,
                    )
                    with a.client() as person_a:
                        pending = {x["id"] for x in person_a.json("GET", "api/agent/approvals")["pending"]}
                        assert pending == set(agent_a.approvals)  # none expired, none taken over
                    edits = len(agent_a.changes)
                    until("pod a's agent editing on", lambda: len(agent_a.changes) >= edits + 3, both)
                    a.process.kill()  # kill -9, while its agent's edits go on
                    a.process.wait(10)
                    agent_a.join(30)
                    assert isinstance(agent_a.error, CONNECTION_ERRORS), repr(agent_a.error)
                finally:
                    agent_b.stop.set()
                    agent_b.join(30)
                assert agent_b.error is None, repr(agent_b.error)
        finally:
            agent_a.stop.set()
            agent_a.join(30)

    assert not any(home.iterdir())  # (all went through the pods' mounts)
    state = export / ".local" / "share" / "jupyter"
    files = {name: state / tagged(name, {SERVER_NAME_ENV: SERVER_NAME}) for name in STORES}
    found = {p for p in state.rglob("*.db")}
    assert found == set(files.values()), found  # the same four files for both pods
    ids = agent_a.approvals + agent_b.approvals
    assert len(set(ids)) == len(ids) == 2 * REQUESTS  # distinct approval ids
    changes = agent_a.changes + agent_b.changes
    assert len(set(changes)) == len(changes)
    pids = {"a": a.process.pid, "b": b.process.pid}
    owners: dict[str, str] = {}
    for name, path in files.items():
        with sqlite3.connect(path) as conn:  # (rolls back a killed server's hot journal)
            assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete", name  # not WAL on sshfs
            assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok", name
            if name == "agent_tools_approvals.db":
                rows = conn.execute("SELECT id, agent, owner FROM approvals").fetchall()
                owners.update({f"approval {i}": f"{agent}@{owner}" for i, agent, owner in rows})
            elif name == "agent_tools_runs.db":
                rows = conn.execute("SELECT id, owner, process FROM runs").fetchall()
                owners.update({f"run {i}": f"{owner}@{process}" for i, owner, process in rows})
            elif name == "agent_tools_ledger.db":
                rows = conn.execute("SELECT id, user, path FROM changes").fetchall()
                owners.update({f"change {i}": f"{user}@{path}" for i, user, path in rows})
        conn.close()
        assert not [p for p in path.parent.iterdir() if p.name.startswith(path.name + "-")]  # no -wal, -shm

    def pid_of(entry: str) -> int:
        identity = ProcessIdentity.parse(owners[entry].split("@", 1)[1])
        assert identity is not None, owners[entry]
        return identity.pid

    for name, agent_of in (("a", agent_a), ("b", agent_b)):
        for i in agent_of.approvals:
            assert owners[f"approval {i}"].startswith(f"agent:bot-{name}@")
            assert pid_of(f"approval {i}") == pids[name]
        for r in agent_of.runs:
            assert owners[f"run {r}"].startswith(f"agent:bot-{name}@")
            assert pid_of(f"run {r}") == pids[name]
        for c in agent_of.changes:
            assert owners[f"change {c}"] == f"agent:bot-{name}@{name}.ipynb"


# A server process in a PID namespace of its own (a container): PID 1 every time it starts.
CONTAINER = textwrap.dedent(
    """
    import logging, os, sys, time
    from jupyter_agent_tools.runs.records import RunRecords
    from jupyter_agent_tools.stores import StoreOptions

    class Run:
        id, owner, kind, target, state, created, ended, message = (
            "detached", "alice", "eval", "s", "running", time.time(), None, None)

    records = RunRecords(sys.argv[1], "/home/jovyan", logging.getLogger("c"), StoreOptions(owner_timeout=1.0))
    listed = records.open(3600)
    if sys.argv[2] == "run":
        records.save(Run())
        records.settle()
    print(os.getpid(), " ".join(f"{r['id']}:{r['state']}" for r in listed), flush=True)
    time.sleep(3600)
    """
)


def test_a_restarted_container_with_the_same_pid_lists_the_previous_ones_run_lost(tmp_path: Path) -> None:
    """Both starts get PID 1 (``unshare --pid --fork --mount-proc``); the first, killed with a detached run
    going, is not this PID: the second lists the run ``lost`` once the first's heartbeat stopped."""
    unshare = shutil.which("unshare")
    if sys.platform != "linux" or os.geteuid() != 0 or unshare is None:
        pytest.skip("not applicable here: PID namespaces need Linux, root and unshare")
    path = str(tmp_path / "runs.db")
    env = {**os.environ, "PYTHONPATH": ROOT}

    def start(what: str) -> tuple[subprocess.Popen[str], list[str]]:
        command = [unshare, "--pid", "--fork", "--mount-proc", sys.executable, "-c", CONTAINER, path, what]
        process = subprocess.Popen(
            command, stdout=subprocess.PIPE, text=True, env=env, start_new_session=True
        )
        assert process.stdout is not None
        return process, process.stdout.readline().split()

    first, said = start("run")
    try:
        assert said == ["1"]  # PID 1, with the run going
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(10)
    time.sleep(1.5)  # past its owner_timeout (1 s): the first's heartbeat is old
    second, said = start("list")
    try:
        assert said == ["1", "detached:lost"]
    finally:
        os.killpg(second.pid, signal.SIGKILL)
        second.wait(10)

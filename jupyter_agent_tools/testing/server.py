"""A real Jupyter server with the extension, in a subprocess, and a small HTTP client for it.

Shared by this project's tests and benchmarks, and usable by downstream projects (see
:mod:`jupyter_agent_tools.pytest_plugin`): each server gets its own config, data and runtime directories
(no user configuration leaks in), a free port on 127.0.0.1 and a random token.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

try:  # httpx when installed, else the standard library (both keep one connection alive)
    import httpx
except ImportError:  # pragma: no cover - depends on the environment
    httpx = None  # type: ignore[assignment]

# What a refused or dropped connection raises (httpx wraps OSError in its own TransportError).
CONNECTION_ERRORS: tuple[type[BaseException], ...] = (OSError,) + (
    (httpx.TransportError,) if httpx is not None else ()
)
# What polling a port that may be held by another process's socket raises: a refused connection, or a
# reply that is not HTTP (a kernel's ZeroMQ socket answers with its greeting).
NOT_SERVING_YET: tuple[type[BaseException], ...] = (*CONNECTION_ERRORS, http.client.HTTPException)
# What a Jupyter app (server, lab, Kernel Gateway, hub, proxy) logs when it cannot listen on its port.
PORT_TAKEN_SIGNS = ("is not available", "no available port", "already in use", "EADDRINUSE")
# The directory that holds this package: put first on the server's PYTHONPATH, so the server runs the
# very code the caller imported (a checkout, not another installed copy).
PACKAGE_PARENT = Path(__file__).resolve().parent.parent.parent


@dataclass
class Server:
    """A running Jupyter server: where it listens, its token, its root dir and its process."""

    url: str  # base URL with a trailing slash, e.g. http://127.0.0.1:8890/
    token: str
    root_dir: Path
    process: subprocess.Popen[bytes]
    log_path: Path
    runtime_dir: Path | None = None  # the server's JUPYTER_RUNTIME_DIR: kernel connection files live here

    def client(self, timeout: float = 300.0) -> Client:
        return Client(self.url, self.token, timeout)

    def rss_bytes(self) -> int | None:
        """Resident memory of the server process (Linux), or None when it cannot be read."""
        return self.memory().get("VmRSS")

    def memory(self) -> dict[str, int]:
        """``VmRSS`` (resident now) and ``VmHWM`` (peak resident) of the server process in bytes (Linux)."""
        found: dict[str, int] = {}
        try:
            with open(f"/proc/{self.process.pid}/status") as f:
                for line in f:
                    key = line.split(":", 1)[0]
                    if key in ("VmRSS", "VmHWM"):
                        found[key] = int(line.split()[1]) * 1024
        except OSError:
            pass
        return found

    def reset_peak_memory(self) -> bool:
        """Reset the server's ``VmHWM`` to its current RSS (``clear_refs`` 5, Linux >= 4.0); True if done."""
        try:
            with open(f"/proc/{self.process.pid}/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            return False
        return True

    def connection_file(self, kernel_id: str) -> Path:
        """The connection file of a kernel the server started (``kernel-<id>.json`` in its runtime dir)."""
        if self.runtime_dir is None:
            raise RuntimeError("this server's runtime dir is unknown")
        return self.runtime_dir / f"kernel-{kernel_id}.json"


# Where free_port looks first: below the range the OS hands out for port 0 (Linux's default is 32768-60999),
# from which kernels get their ports (jupyter_client binds port 0) and connections their local ends.
PORTS_BELOW_EPHEMERAL = (20000, 32768)


def _ephemeral_floor() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return PORTS_BELOW_EPHEMERAL[1]


def _bindable(port: int) -> int | None:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return None
        return int(s.getsockname()[1])


def free_port() -> int:
    """A port of 127.0.0.1 nobody listens on now, chosen below the OS's ephemeral range where it can be:
    a kernel (or a connection) started meanwhile cannot take it there, only another explicit bind.
    Start servers through :func:`on_a_free_port`, which copes with that too."""
    low, high = PORTS_BELOW_EPHEMERAL[0], min(PORTS_BELOW_EPHEMERAL[1], _ephemeral_floor())
    if high - low >= 1000:
        for _ in range(50):
            port = _bindable(low + secrets.randbelow(high - low))  # the global random may be seeded alike
            if port is not None:
                return port
    port = _bindable(0)
    assert port is not None, "cannot bind 127.0.0.1"
    return port


class PortTaken(RuntimeError):
    """A server could not listen on the port it was given: another process took it first."""


def port_taken(log: str) -> bool:
    """Whether a server's log says it exited because its port was taken."""
    return any(sign in log for sign in PORT_TAKEN_SIGNS)


Started = TypeVar("Started")


def on_a_free_port(start: Callable[[int], Started], attempts: int = 3) -> Started:
    """``start(port)`` with a free port; when it raises :class:`PortTaken`, again with another port.

    ``start`` must make its server exit rather than move to another port (``--port-retries=0``): a
    server that moved would leave the caller talking to whatever took the port."""
    for _ in range(attempts - 1):
        with contextlib.suppress(PortTaken):
            return start(free_port())
    return start(free_port())


def wait_serving(
    name: str,
    process: subprocess.Popen[bytes],
    status: Callable[[], int],
    ready: int,
    timeout: float,
    stop: Callable[[], object],
    log: Callable[[], str],
    interval: float = 0.1,
) -> None:
    """Poll ``status()`` (a request to the server just started) until it is ``ready``; what a port held by
    another process's socket raises counts as no answer yet. When the process exits or ``timeout`` passes
    first: ``stop()``, then :class:`PortTaken` if ``log()`` says its port was taken, else RuntimeError
    with the log."""
    deadline = time.monotonic() + timeout
    last = "no answer yet"
    while process.poll() is None and time.monotonic() < deadline:
        try:
            answered = status()
        except NOT_SERVING_YET as e:
            last = repr(e)
        else:
            if answered == ready:
                return
            last = f"HTTP {answered}"
        time.sleep(interval)
    exited = process.poll()
    stop()
    text = log()
    if port_taken(text):
        raise PortTaken(f"{name} could not listen on its port; its log:\n{text}")
    if exited is not None:
        raise RuntimeError(f"{name} exited with {exited} while starting; its log:\n{text}")
    raise RuntimeError(f"{name} did not answer within {timeout:.0f} s (last: {last}); its log:\n{text}")


# The server extensions an environment with JupyterLab enables for every server (its jupyter_server_config.d),
# turned off here: a test's server loads this extension (and jupyter_server_terminals, a door the gate
# covers) alone. Each of these cost a server start 0.6-0.9 s (lab, notebook, collaboration, lsp, fileid...).
OTHER_EXTENSIONS_OFF = (
    "jupyterlab",
    "notebook",
    "notebook_shim",
    "nbclassic",
    "jupyter_lsp",
    "jupyter_server_fileid",
    "jupyter_server_ydoc",
    "jupyter_collaboration",
    "jupyter_collaboration_ui",
    "jupyter_docprovider",
)


@contextlib.contextmanager
def jupyter_server(
    root_dir: Path | None = None,
    extra_args: Sequence[str] = (),
    env: dict[str, str] | None = None,
    startup_timeout: float = 60.0,
    profile_to: Path | None = None,
    on_stop: Callable[[Path, Path], None] | None = None,
    command_prefix: Sequence[str] = (),
) -> Iterator[Server]:
    """Start ``python -m jupyter_server`` with the extension enabled (and the other server extensions of the
    environment off but jupyter_server_terminals: OTHER_EXTENSIONS_OFF); yield it once it answers; stop it.

    The server gets its own config, data and runtime dirs (no user config leaks in), listens on a free
    port of 127.0.0.1 with a random token, and is terminated (then killed) on exit. Its log is kept in a
    temporary file and printed if it fails to start. With ``profile_to`` the server runs under
    ``pyinstrument`` (a raw session file); ``on_stop(session_file, profile_to)`` then turns it into a
    report once the server has stopped. ``command_prefix``: words in front of the server's command that
    end by exec-ing it (the process stays the server's), e.g. ``unshare`` for a mount namespace of its own.
    """
    # A kernel a killed server left behind removes its connection file from the runtime dir when it sees
    # its parent gone, which can race the removal of this directory: that is no failure of the test.
    with tempfile.TemporaryDirectory(prefix="agent-tools-bench-", ignore_cleanup_errors=True) as tmp:
        tmp_path = Path(tmp)
        root = Path(root_dir) if root_dir is not None else tmp_path / "root"
        root.mkdir(parents=True, exist_ok=True)
        for sub in ("config", "data", "runtime"):
            (tmp_path / sub).mkdir()
        token = secrets.token_hex(16)
        extensions = {"jupyter_agent_tools": True, **dict.fromkeys(OTHER_EXTENSIONS_OFF, False)}
        profiler: list[str] = []
        session_path = tmp_path / "server.pyisession"
        if profile_to is not None:
            profiler = ["-m", "pyinstrument", "-r", "pyisession", "-o", str(session_path)]
        full_env = dict(os.environ)
        full_env.update(
            JUPYTER_CONFIG_DIR=str(tmp_path / "config"),
            JUPYTER_DATA_DIR=str(tmp_path / "data"),
            JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"),
            PYTHONPATH=os.pathsep.join(filter(None, [str(PACKAGE_PARENT), os.environ.get("PYTHONPATH")])),
        )
        full_env.update(env or {})
        log_path = tmp_path / "server.log"

        def start(port: int) -> Server:
            cmd = [
                *command_prefix,
                sys.executable,
                *profiler,
                "-m",
                "jupyter_server",
                f"--ServerApp.jpserver_extensions={extensions!r}",
                "--ip=127.0.0.1",
                f"--port={port}",
                "--port-retries=0",
                "--ServerApp.log_level=WARN",
                f"--IdentityProvider.token={token}",
                f"--ServerApp.root_dir={root}",
                "--no-browser",
                *extra_args,
            ]
            if hasattr(os, "geteuid") and os.geteuid() == 0:
                cmd.append("--allow-root")  # containers and CI often run as root
            with open(log_path, "wb") as log:  # a port-taken attempt's log is of no interest
                process = subprocess.Popen(
                    cmd, stdout=log, stderr=subprocess.STDOUT, env=full_env, cwd=tmp, start_new_session=True
                )
            server = Server(f"http://127.0.0.1:{port}/", token, root, process, log_path, tmp_path / "runtime")

            def status() -> int:
                with server.client(timeout=5) as client:
                    answered, _ = client.request("GET", "api/agent/notebooks/__readiness_probe__.ipynb")
                return int(answered)

            wait_serving(  # a 404 from the extension's route: the server answers and the extension is loaded
                "the Jupyter server",
                process,
                status,
                404,
                startup_timeout,
                lambda: _stop(process),
                lambda: log_path.read_text(errors="replace")[-4000:],
            )
            return server

        server = on_a_free_port(start)
        try:
            yield server
        finally:
            _stop(server.process, timeout=120 if profile_to is not None else 15)
            if profile_to is not None and on_stop is not None and session_path.exists():
                on_stop(session_path, profile_to)


def _stop(process: subprocess.Popen[bytes], timeout: float = 15) -> None:
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=5)


class Client:
    """A minimal keep-alive HTTP client with the server's token: ``request(method, path, body)``."""

    def __init__(self, base_url: str, token: str, timeout: float = 300.0):
        self.base_url = base_url if base_url.endswith("/") else base_url + "/"
        self.headers = {"Authorization": f"token {token}"}
        self.timeout = timeout
        parsed = urllib.parse.urlsplit(self.base_url)
        self._host, self._port, self._prefix = parsed.hostname, parsed.port, parsed.path
        self._conn: Any = None
        if httpx is not None:
            self._conn = httpx.Client(base_url=self.base_url, headers=self.headers, timeout=timeout)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def request(
        self, method: str, path: str, body: Any = None, raw: bytes | None = None
    ) -> tuple[int, bytes]:
        """Send one request; ``body`` is JSON-encoded. Returns (status, response bytes)."""
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        if httpx is not None:
            if self._conn is None:
                self._conn = httpx.Client(base_url=self.base_url, headers=self.headers, timeout=self.timeout)
            response = self._conn.request(method, path, content=data)
            return response.status_code, response.content
        for attempt in (0, 1):
            if self._conn is None:
                self._conn = http.client.HTTPConnection(self._host, self._port, timeout=self.timeout)
            headers = dict(self.headers)
            if data is not None:
                headers["Content-Type"] = "application/json"
            try:
                self._conn.request(method, self._prefix + path, body=data, headers=headers)
                response = self._conn.getresponse()
                return response.status, response.read()
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                self.close()  # a kept-alive connection the server closed: retry once on a new one
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def json(self, method: str, path: str, body: Any = None, expect: int = 200) -> Any:
        status, content = self.request(method, path, body)
        if status != expect:
            raise RuntimeError(f"{method} {path}: HTTP {status} (expected {expect}): {content[:500]!r}")
        return json.loads(content) if content else None

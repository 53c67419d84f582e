"""Test infrastructure for gateway mode: a real Kernel Gateway process and a fault-injecting proxy.

Nothing here is product code. Two building blocks:

``start_kernel_gateway()``
    Starts ``python -m kernel_gateway`` on 127.0.0.1 with an auth token, in its own process group and its
    own temporary Jupyter runtime/config/data dirs, and waits until ``GET /api/kernelspecs`` answers 200 with
    the token. Kernel listing (``GET /api/kernels``) is enabled so tests can inspect the gateway.
    ``stop()`` terminates it gracefully and then SIGKILLs every process it spawned; ``kill()`` SIGKILLs the
    gateway and every kernel it spawned at once (for "gateway died mid-session" tests). Kernels are launched
    by jupyter_client with ``start_new_session=True``, i.e. in their OWN process groups, so killing the
    gateway's process group is not enough: both methods snapshot the process tree (psutil, or /proc) first.

``FaultProxy``
    A Tornado reverse proxy on 127.0.0.1 in front of a gateway. It runs in a daemon THREAD with its own
    asyncio loop, not in the pytest-jupyter loop: it then works with blocking clients too (``urllib``, the
    stock ``GatewayKernelClient``'s blocking websocket), does not depend on the test loop being driven, and
    can be controlled with plain synchronous calls from sync or async test code. It forwards every HTTP
    method (headers incl. ``Authorization``, body, status, reason, response headers) and websocket upgrades
    (subprotocols, text and binary frames both ways, close code/reason both ways). The upstream websocket is
    opened BEFORE the client's upgrade is accepted, so an upstream refusal (401 without token, 404 unknown
    kernel) reaches the client as that HTTP status. Faults: see ``fail_kernel_posts``,
    ``delay_kernel_posts``, ``delay_all``, ``refuse_connections``, ``close_websockets``, ``add_fault``.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from tornado import httpclient, httpserver, httputil, web, websocket
from tornado.log import app_log

from jupyter_agent_tools.testing.server import free_port, on_a_free_port, wait_serving

try:
    import psutil
except ImportError:  # pragma: no cover - psutil comes with ipykernel
    psutil = None

DEFAULT_TOKEN = "gateway-test-token"
KERNELS_PATH = "/api/kernels"

__all__ = [
    "DEFAULT_TOKEN",
    "Fault",
    "FaultProxy",
    "KernelGatewayProcess",
    "descendant_pids",
    "gateway_http",
    "make_gateway_server_config",
    "pid_alive",
    "start_kernel_gateway",
    "wait_pids_gone",
]


# --------------------------------------------------------------------------------------------------------
# small process / network helpers
# --------------------------------------------------------------------------------------------------------


def pid_alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie."""
    if psutil is not None:
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


def descendant_pids(pid: int) -> list[int]:
    """All live descendants of ``pid`` (children, grandchildren...)."""
    if psutil is not None:
        try:
            return [p.pid for p in psutil.Process(pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            return []
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out: list[int] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def wait_pids_gone(pids: Iterable[int], timeout: float = 10.0) -> list[int]:
    """Wait until none of ``pids`` is alive; return those still alive after ``timeout``."""
    pids = list(pids)
    deadline = time.monotonic() + timeout
    while True:
        alive = [p for p in pids if pid_alive(p)]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.05)


def _sigkill(pids: Iterable[int]) -> None:
    for p in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(p, signal.SIGKILL)


def gateway_http(
    url: str,
    method: str = "GET",
    path: str = "/api/kernelspecs",
    token: str | None = None,
    body: Any = None,
    timeout: float = 10.0,
) -> tuple[int, Any]:
    """Blocking HTTP call to a gateway (or the proxy); returns (status, parsed JSON or text or None).

    Never raises on HTTP error statuses. Safe to call from async tests only when the target is NOT served
    by the calling thread's event loop (true for the gateway process and for ``FaultProxy``).
    """
    data = None
    headers = {}
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    elif method in ("POST", "PUT", "PATCH"):
        data = b""
    if token:
        headers["Authorization"] = f"token {token}"
    req = urllib.request.Request(url.rstrip("/") + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read()
    if not raw:
        return status, None
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode(errors="replace")


def make_gateway_server_config(
    gateway_url: str,
    token: str,
    request_timeout: float = 60.0,
    connect_timeout: float = 10.0,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``jp_server_config`` dict for a pytest-jupyter server in gateway mode (extension enabled).

    ``request_timeout`` only takes effect if ``GatewayClient.KERNEL_LAUNCH_TIMEOUT + launch_timeout_pad``
    is not larger: jupyter_server raises ``request_timeout`` to that minimum (default 40 + 2 s). The
    ``gateway_server_config`` fixture patches ``KERNEL_LAUNCH_TIMEOUT`` so short timeouts work.
    """
    config: dict[str, Any] = {
        "ServerApp": {"jpserver_extensions": {"jupyter_agent_tools": True}},
        "GatewayClient": {
            "url": gateway_url,
            "auth_token": token,
            "request_timeout": float(request_timeout),
            "connect_timeout": float(connect_timeout),
            # jupyter_server retries lost gateway websockets with 1 s..30 s backoff: keep tests fast.
            "gateway_retry_interval": 0.2,
            "gateway_retry_interval_max": 1.0,
            "gateway_retry_max": 2,
        },
    }
    for section, values in (extra or {}).items():
        config.setdefault(section, {}).update(values)
    return config


# --------------------------------------------------------------------------------------------------------
# the real Kernel Gateway
# --------------------------------------------------------------------------------------------------------


class KernelGatewayProcess:
    """A running ``jupyter_kernel_gateway`` subprocess. Use ``start_kernel_gateway()`` to make one."""

    def __init__(self, proc: subprocess.Popen, port: int, token: str, workdir: str, log_path: str):
        self.proc = proc
        self.port = port
        self.token = token
        self.url = f"http://127.0.0.1:{port}"
        self.ws_url = f"ws://127.0.0.1:{port}"
        self.workdir = workdir
        self.log_path = log_path
        self._stopped = False
        atexit.register(self._atexit)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log(self) -> str:
        """The gateway's combined stdout/stderr so far."""
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()
        except FileNotFoundError:
            return ""

    def kernel_pids(self) -> list[int]:
        """PIDs of every live process the gateway spawned (its kernels)."""
        return descendant_pids(self.pid) if self.alive() else []

    def request(self, method: str = "GET", path: str = "/api/kernelspecs", **kwargs: Any) -> tuple[int, Any]:
        """Blocking request straight to the gateway with its token (see ``gateway_http``)."""
        kwargs.setdefault("token", self.token)
        return gateway_http(self.url, method, path, **kwargs)

    def list_kernels(self) -> list[dict[str, Any]]:
        status, body = self.request("GET", KERNELS_PATH)
        if status != 200:
            raise RuntimeError(f"GET /api/kernels on the gateway answered {status}: {body}")
        return body

    def delete_kernels(self, kernel_ids: Iterable[str] | None = None) -> None:
        """Best-effort DELETE of the given kernels (default: all) on the gateway; ignores errors."""
        if not self.alive():
            return
        try:
            ids = list(kernel_ids) if kernel_ids is not None else [k["id"] for k in self.list_kernels()]
        except Exception:
            return
        for kid in ids:
            with contextlib.suppress(Exception):
                self.request("DELETE", f"{KERNELS_PATH}/{kid}", timeout=15)

    def kill(self) -> list[int]:
        """SIGKILL the gateway and every process it spawned, right now. Returns the killed PIDs.

        Kernels live in their own process groups, so the tree is snapshotted before the gateway dies.
        """
        pids = [self.pid, *descendant_pids(self.pid)]
        _sigkill(pids)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        wait_pids_gone(pids, timeout=10)
        return pids

    def stop(self, timeout: float = 10.0) -> None:
        """Terminate gracefully (the gateway shuts its kernels down), then SIGKILL whatever is left."""
        if self._stopped:
            return
        self._stopped = True
        pids = [self.pid, *descendant_pids(self.pid)] if self.alive() else []
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                self.proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=timeout)
        _sigkill([self.pid, *[p for p in pids if pid_alive(p)]])
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        wait_pids_gone(pids, timeout=5)
        shutil.rmtree(self.workdir, ignore_errors=True)
        atexit.unregister(self._atexit)

    def _atexit(self) -> None:
        with contextlib.suppress(Exception):
            self.stop(timeout=3)

    def __enter__(self) -> KernelGatewayProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<KernelGatewayProcess pid={self.pid} url={self.url} alive={self.alive()}>"


def start_kernel_gateway(
    port: int | None = None,
    token: str = DEFAULT_TOKEN,
    startup_timeout: float = 60.0,
    extra_args: Iterable[str] = (),
    env: dict[str, str] | None = None,
) -> KernelGatewayProcess:
    """Start a real Kernel Gateway on 127.0.0.1 requiring ``token`` and wait until it serves requests.

    Raises ``RuntimeError`` with the gateway's output if it exits or does not answer within
    ``startup_timeout`` seconds. With ``port=None`` a free port is picked (retried if another process
    grabs it first).
    """

    def start(on_port: int) -> KernelGatewayProcess:
        return _start_once(on_port, token, startup_timeout, list(extra_args), env)

    return start(port) if port is not None else on_a_free_port(start)


def _start_once(
    port: int, token: str, startup_timeout: float, extra_args: list[str], env: dict[str, str] | None
) -> KernelGatewayProcess:
    workdir = tempfile.mkdtemp(prefix="kernel-gateway-")
    dirs = {name: os.path.join(workdir, name) for name in ("runtime", "config", "data", "ipython")}
    for d in dirs.values():
        os.makedirs(d)
    child_env = {k: v for k, v in os.environ.items() if not k.startswith(("KG_", "JUPYTER_GATEWAY_"))}
    child_env.update(
        {
            "JUPYTER_RUNTIME_DIR": dirs["runtime"],
            "JUPYTER_CONFIG_DIR": dirs["config"],
            "JUPYTER_DATA_DIR": dirs["data"],
            "IPYTHONDIR": dirs["ipython"],
            "PYTHONUNBUFFERED": "1",
        }
    )
    child_env.update(env or {})
    cmd = [
        sys.executable,
        "-m",
        "kernel_gateway",
        "--KernelGatewayApp.ip=127.0.0.1",
        f"--KernelGatewayApp.port={port}",
        "--KernelGatewayApp.port_retries=0",
        f"--KernelGatewayApp.auth_token={token}",
        "--JupyterWebsocketPersonality.list_kernels=True",
        *extra_args,
    ]
    log_path = os.path.join(workdir, "gateway.log")
    # A file, not a PIPE: nobody drains a pipe during the tests and a full pipe blocks the gateway.
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=child_env,
            cwd=workdir,
            start_new_session=True,  # own process group (and session), see kill()/stop()
        )
    gw = KernelGatewayProcess(proc, port, token, workdir, log_path)
    wait_serving(
        f"Kernel Gateway on port {port}",
        proc,
        lambda: gateway_http(gw.url, "GET", "/api/kernelspecs", token=token, timeout=2)[0],
        200,
        startup_timeout,
        gw.stop,
        gw.log,
    )
    return gw


# --------------------------------------------------------------------------------------------------------
# the fault-injecting proxy
# --------------------------------------------------------------------------------------------------------

# Hop-by-hop headers (RFC 9110 7.6.1) plus those Tornado computes itself.
_HOP_HEADERS = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "content-length",
    "host",
}
_WS_HANDSHAKE_HEADERS = {
    "sec-websocket-key",
    "sec-websocket-version",
    "sec-websocket-extensions",
    "sec-websocket-protocol",
    "sec-websocket-accept",
}
_KERNELS_RE = r"/api/kernels/?"


@dataclass
class Fault:
    """One injected fault. ``count=None`` means "until cleared"."""

    method: str | None  # None = any method
    path: str | None  # full-match regex on the request path; None = any path
    status: int | None = None  # answer this status instead of forwarding (after ``delay``)
    delay: float = 0.0  # seconds to wait before acting
    count: int | None = 1
    body: Any = None  # JSON-able body for ``status`` answers (default: KG-style {"reason","message"})
    headers: dict[str, str] = field(default_factory=dict)
    hits: int = 0

    def matches(self, method: str, path: str) -> bool:
        if self.count is not None and self.hits >= self.count:
            return False
        if self.method is not None and self.method.upper() != method.upper():
            return False
        return self.path is None or re.fullmatch(self.path, path) is not None


class FaultProxy:
    """Reverse proxy (HTTP + websockets) in front of ``target_url`` with fault injection.

    Runs in its own daemon thread and event loop; all public methods are synchronous and thread-safe.
    Use as a context manager or call ``start()``/``stop()``.
    """

    def __init__(self, target_url: str, host: str = "127.0.0.1", port: int | None = None):
        self.target_url = target_url.rstrip("/")
        self.target_ws_url = re.sub(r"^http", "ws", self.target_url)
        self.host = host
        self.port = port or free_port()  # of 127.0.0.1, the only host used
        self.url = f"http://{host}:{self.port}"
        self.ws_url = f"ws://{host}:{self.port}"
        self._lock = threading.Lock()
        self._faults: list[Fault] = []
        self._kernel_posts = 0
        self._requests: list[tuple[str, str, int]] = []
        self._created_kernel_ids: list[str] = []
        self._websockets: set[_ProxyHandler] = set()
        self._ws_opened = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: httpserver.HTTPServer | None = None
        self._refusing = False

    # ---- lifecycle -----------------------------------------------------------------------------------

    def start(self) -> FaultProxy:
        ready = threading.Event()
        errors: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            self._loop = loop
            try:
                loop.run_until_complete(self._listen())
            except BaseException as e:
                errors.append(e)
                ready.set()
                loop.close()
                return
            ready.set()
            try:
                loop.run_forever()
            finally:
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.close()

        self._thread = threading.Thread(target=run, name=f"FaultProxy:{self.port}", daemon=True)
        self._thread.start()
        if not ready.wait(10) or errors:
            raise RuntimeError(f"FaultProxy failed to start on {self.url}: {errors}")
        return self

    def stop(self) -> None:
        if self._loop is None or self._thread is None or not self._thread.is_alive():
            return
        with contextlib.suppress(Exception):
            self._call(self._shutdown(), timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _call(self, coro: Any, timeout: float = 10.0) -> Any:
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    async def _listen(self) -> None:
        app = web.Application(
            [(r".*", _ProxyHandler, {"proxy": self})],
            websocket_max_message_size=1 << 30,
        )
        self._server = httpserver.HTTPServer(app, max_body_size=1 << 30, idle_connection_timeout=60)
        self._server.listen(self.port, self.host)

    async def _shutdown(self) -> None:
        for handler in list(self._websockets):
            handler.close_both(1001, "proxy stopped")
        if self._server is not None:
            self._server.stop()
            await self._server.close_all_connections()

    # ---- observations ----------------------------------------------------------------------------------

    @property
    def kernel_posts(self) -> int:
        """How many ``POST /api/kernels`` the proxy received (failed, delayed and forwarded alike)."""
        with self._lock:
            return self._kernel_posts

    @property
    def requests(self) -> list[tuple[str, str, int]]:
        """(method, path, status answered) of every finished HTTP request, oldest first."""
        with self._lock:
            return list(self._requests)

    @property
    def created_kernel_ids(self) -> list[str]:
        """Ids of kernels the gateway created through this proxy (from 201 answers to POST /api/kernels)."""
        with self._lock:
            return list(self._created_kernel_ids)

    @property
    def websocket_count(self) -> int:
        """Websockets currently relayed."""
        with self._lock:
            return len(self._websockets)

    @property
    def websockets_opened(self) -> int:
        """Websockets relayed since start (successful upstream handshakes)."""
        with self._lock:
            return self._ws_opened

    # ---- fault control ---------------------------------------------------------------------------------

    def add_fault(
        self,
        method: str | None = None,
        path: str | None = None,
        *,
        status: int | None = None,
        delay: float = 0.0,
        count: int | None = 1,
        body: Any = None,
        headers: dict[str, str] | None = None,
    ) -> Fault:
        """Generic fault: the next ``count`` matching requests wait ``delay`` s, then are answered with
        ``status`` (if given) or forwarded. The first matching fault wins."""
        fault = Fault(method, path, status, delay, count, body, dict(headers or {}))
        with self._lock:
            self._faults.append(fault)
        return fault

    def fail_kernel_posts(
        self, count: int = 1, status: int = 500, retry_after: float | None = None, body: Any = None
    ) -> Fault:
        """Answer the next ``count`` ``POST /api/kernels`` with ``status`` without reaching the gateway."""
        headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
        return self.add_fault("POST", _KERNELS_RE, status=status, count=count, body=body, headers=headers)

    def delay_kernel_posts(
        self, seconds: float, count: int | None = None, status: int | None = None
    ) -> Fault:
        """Hold ``POST /api/kernels`` for ``seconds`` before forwarding (or answering ``status``).

        With ``seconds`` > ``GatewayClient.request_timeout`` jupyter_server gives up with 599. The proxy
        still forwards the POST afterwards (the gateway then creates a kernel nobody knows about, like a
        real slow gateway would); pass ``status=504`` to answer instead of forwarding.
        """
        return self.add_fault("POST", _KERNELS_RE, status=status, delay=seconds, count=count)

    def delay_all(self, seconds: float, count: int | None = None) -> Fault:
        """Delay every HTTP request and websocket upgrade by ``seconds`` before forwarding."""
        return self.add_fault(None, None, delay=seconds, count=count)

    def refuse_connections(self, enabled: bool = True) -> None:
        """Close (or reopen) the listening socket: new connections get ECONNREFUSED, so jupyter_server
        raises ``ConnectionRefusedError`` -> 503. Already open connections and websockets stay up
        (use ``close_websockets()`` for those). Pooled keep-alive connections are dropped too."""
        self._call(self._set_refusing(enabled))

    async def _set_refusing(self, enabled: bool) -> None:
        assert self._server is not None
        if enabled and not self._refusing:
            self._server.stop()
            await self._server.close_all_connections()
            self._refusing = True
        elif not enabled and self._refusing:
            await self._listen()  # a fresh server: a stopped TCPServer cannot listen again
            self._refusing = False

    def close_websockets(self, code: int = 1011, reason: str = "fault proxy") -> int:
        """Close every relayed websocket on both sides (like a network drop). Returns how many."""

        async def close() -> int:
            handlers = list(self._websockets)
            for h in handlers:
                h.close_both(code, reason)
            return len(handlers)

        return self._call(close())

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()
        if self._refusing:
            self.refuse_connections(False)

    def reset(self) -> None:
        """Clear faults and counters."""
        self.clear_faults()
        with self._lock:
            self._kernel_posts = 0
            self._requests.clear()
            self._created_kernel_ids.clear()

    # ---- used by the handler (proxy thread) ------------------------------------------------------------

    def _take_fault(self, method: str, path: str) -> Fault | None:
        with self._lock:
            if method == "POST" and re.fullmatch(_KERNELS_RE, path):
                self._kernel_posts += 1
            for fault in self._faults:
                if fault.matches(method, path):
                    fault.hits += 1
                    return fault
        return None

    def _record(self, method: str, path: str, status: int, body: bytes | None) -> None:
        with self._lock:
            self._requests.append((method, path, status))
            if method == "POST" and status == 201 and re.fullmatch(_KERNELS_RE, path) and body:
                with contextlib.suppress(ValueError, KeyError, TypeError):
                    self._created_kernel_ids.append(json.loads(body)["id"])


class _ProxyHandler(websocket.WebSocketHandler):
    """Forwards one request (or one websocket) to the proxy's target."""

    SUPPORTED_METHODS = ("GET", "HEAD", "POST", "DELETE", "PATCH", "PUT", "OPTIONS")

    def initialize(self, proxy: FaultProxy) -> None:
        self.proxy = proxy
        self.upstream: websocket.WebSocketClientConnection | None = None
        self._relay_task: asyncio.Task | None = None

    # no XSRF/origin logic of our own: the gateway decides
    def check_xsrf_cookie(self) -> None:
        pass

    def check_origin(self, origin: str) -> bool:
        return True

    def set_default_headers(self) -> None:
        self.clear_header("Content-Type")
        self.clear_header("Server")

    def _upstream_headers(self, drop: set[str]) -> httputil.HTTPHeaders:
        out = httputil.HTTPHeaders()
        for name, value in self.request.headers.get_all():
            if name.lower() not in drop:
                out.add(name, value)
        return out

    async def _apply_fault(self) -> bool:
        """Apply a matching fault. True if the request was answered (not to be forwarded)."""
        fault = self.proxy._take_fault(self.request.method or "", self.request.path)
        if fault is None:
            return False
        if fault.delay:
            await asyncio.sleep(fault.delay)
        if fault.status is None:
            return False
        self.set_status(fault.status)
        for name, value in fault.headers.items():
            self.set_header(name, value)
        body = fault.body
        if body is None:
            body = {"reason": "Injected fault", "message": f"FaultProxy answered {fault.status}"}
        raw = (
            body
            if isinstance(body, bytes)
            else (body if isinstance(body, str) else json.dumps(body)).encode()
        )
        if fault.status not in (204, 304):
            self.set_header("Content-Type", "application/json")
            self.write(raw)
        self._done(raw)
        return True

    # ---- plain HTTP ------------------------------------------------------------------------------------

    async def _forward(self) -> None:
        if await self._apply_fault():
            return
        method = self.request.method or "GET"
        headers = self._upstream_headers(_HOP_HEADERS)
        body = self.request.body if (self.request.body or method in ("POST", "PUT", "PATCH")) else None
        request = httpclient.HTTPRequest(
            self.proxy.target_url + self.request.uri,
            method=method,
            headers=headers,
            body=body,
            follow_redirects=False,
            decompress_response=False,
            allow_nonstandard_methods=True,
            connect_timeout=30,
            request_timeout=3600,
            validate_cert=False,
        )
        client = httpclient.AsyncHTTPClient()
        try:
            response = await client.fetch(request, raise_error=False)
        except Exception as e:
            self._bad_gateway(e)
            return
        if response.code == 599:
            self._bad_gateway(response.error)
            return
        self.set_status(response.code, response.reason)
        seen: set[str] = set()
        for name, value in response.headers.get_all():
            if name.lower() in _HOP_HEADERS:
                continue
            if name.lower() not in seen:
                self.clear_header(name)
                seen.add(name.lower())
            self.add_header(name, value)
        if response.body and response.code not in (204, 304) and method != "HEAD":
            self.write(response.body)
        self._done(response.body)

    def _bad_gateway(self, error: object) -> None:
        app_log.warning(
            "FaultProxy: upstream error for %s %s: %r", self.request.method, self.request.uri, error
        )
        self.set_status(502)
        self.set_header("Content-Type", "application/json")
        self.write(json.dumps({"reason": "Bad Gateway", "message": f"FaultProxy upstream error: {error}"}))
        self._done()

    def _done(self, body: bytes | None = None) -> None:
        """Record the answer, then finish. Recording first matters: once finish() flushed, a client in
        another thread may already look at the proxy's counters."""
        self.proxy._record(self.request.method or "", self.request.path, self.get_status(), body)
        self.finish()

    post = put = patch = delete = head = options = _forward

    async def get(self, *args: Any, **kwargs: Any) -> None:
        if self.request.headers.get("Upgrade", "").lower() != "websocket":
            await self._forward()
            return
        if await self._apply_fault():
            return
        protocols = self.request.headers.get("Sec-WebSocket-Protocol", "")
        subprotocols = [p.strip() for p in protocols.split(",") if p.strip()] or None
        request = httpclient.HTTPRequest(
            self.proxy.target_ws_url + self.request.uri,
            headers=self._upstream_headers(_HOP_HEADERS | _WS_HANDSHAKE_HEADERS),
            connect_timeout=30,
            request_timeout=30,
            validate_cert=False,
        )
        try:
            self.upstream = await websocket.websocket_connect(
                request, subprotocols=subprotocols, max_message_size=1 << 30
            )
        except httpclient.HTTPClientError as e:
            # The gateway refused the upgrade: pass its status (401, 403, 404...) on.
            code = e.code if e.code != 599 else 502
            self.set_status(code)
            if e.response is not None and e.response.body:
                self.set_header("Content-Type", e.response.headers.get("Content-Type", "text/plain"))
                self.write(e.response.body)
            self._done()
            return
        except Exception as e:
            self._bad_gateway(e)
            return
        await super().get(*args, **kwargs)
        if self.ws_connection is None and not self._on_close_called:
            self.upstream.close()  # the client's handshake failed: do not leak the upstream socket

    # ---- websocket relay -------------------------------------------------------------------------------

    def select_subprotocol(self, subprotocols: list[str]) -> str | None:
        return self.upstream.selected_subprotocol if self.upstream is not None else None

    def open(self, *args: Any, **kwargs: Any) -> None:
        with self.proxy._lock:
            self.proxy._websockets.add(self)
            self.proxy._ws_opened += 1
        self._relay_task = asyncio.ensure_future(self._relay_upstream())

    async def _relay_upstream(self) -> None:
        upstream = self.upstream
        assert upstream is not None
        while True:
            msg = await upstream.read_message()
            if msg is None:
                break
            try:
                await self.write_message(msg, binary=isinstance(msg, bytes))
            except websocket.WebSocketClosedError:
                break
        # upstream closed: propagate its close code/reason to the client
        if self.ws_connection is not None:
            self.close(upstream.close_code, upstream.close_reason)

    def on_message(self, message: str | bytes) -> None:
        if self.upstream is None:
            return
        with contextlib.suppress(websocket.WebSocketClosedError):
            self.upstream.write_message(message, binary=isinstance(message, bytes))

    def on_close(self) -> None:
        with self.proxy._lock:
            self.proxy._websockets.discard(self)
        if self.upstream is not None:
            self.upstream.close(self.close_code, self.close_reason)

    def close_both(self, code: int, reason: str) -> None:
        if self.upstream is not None:
            self.upstream.close(code, reason)
        if self.ws_connection is not None:
            self.close(code, reason)

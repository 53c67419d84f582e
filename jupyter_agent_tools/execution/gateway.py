"""Kernels on a remote gateway (``jupyter server --gateway-url=...``): the connection, the owner record, the
kernel cap.

- :class:`GatewayKernelConnection`: a kernel's messages over its websocket. The stock
  ``GatewayKernelClient`` opens its websocket without the gateway's auth headers and gets 401 from a
  gateway that requires a token. This connection opens a Tornado websocket with
  ``GatewayClient.instance().load_connection_args()`` — what the server's own
  ``GatewayWebSocketConnection`` does — and speaks the JSON message protocol on it.
- :class:`OwnedKernels`: the kernels this server started on the gateway, kept in a small JSON file in the
  stores' directory (:class:`~jupyter_agent_tools.stores.AgentStores`) with the server process that started
  each. A gateway's kernel listing does not show a kernel's environment (Enterprise Gateway's
  ``/api/kernels`` does not), so the owner tag the kernels carry (``KERNEL_AGENT_TOOLS_SERVER``,
  ``KERNEL_AGENT_TOOLS_PROCESS`` in their environment) is for people; the record is what the next process
  of the server reads at start to shut down the kernels a process that is gone left behind (:meth:`reap`).
- :func:`watch_kernel_cap`: a kernel creation the gateway refuses for its kernel cap (Enterprise Gateway's
  403 for ``EG_MAX_KERNELS_PER_USER``) — a person's notebook through ``/api/sessions`` as well as ours —
  releases the warm pool's kernels and is tried once more: a pooled kernel never takes a user's last slot.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Awaitable, Callable
from typing import Any
from uuid import uuid4

from jupyter_client.jsonutil import json_default
from jupyter_client.session import Session
from jupyter_core.utils import ensure_async
from jupyter_server.gateway.gateway_client import GatewayClient
from jupyter_server.utils import url_path_join
from tornado.escape import url_escape
from tornado.httpclient import HTTPRequest
from tornado.websocket import WebSocketClientConnection, websocket_connect

from ..compat import wrap_once
from ..stores import Worker, owner_alive, this_process
from .connection import MessageQueue, event
from .faults import http_status, is_kernel_cap

log = logging.getLogger(__name__)


class GatewayKernelConnection:
    """Messages of one gateway kernel over its ``/api/kernels/{id}/channels`` websocket."""

    def __init__(self, kernel_manager: Any, kernel_id: str):
        self.kernel_manager = kernel_manager
        self.kernel_id = kernel_id
        self.messages = MessageQueue()  # unbounded: the gateway holds what is not read yet
        self.session = Session(session=uuid4().hex, username="jupyter-agent-tools")
        self.lost_state = False
        self._ws: WebSocketClientConnection | None = None
        self._reader: asyncio.Task[None] | None = None

    async def start(self, ready_timeout: float) -> None:
        client = GatewayClient.instance()
        url = url_path_join(
            client.ws_url or "", client.kernels_endpoint, url_escape(self.kernel_id), "channels"
        )
        url += f"?session_id={url_escape(self.session.session)}"
        request = HTTPRequest(url, **client.load_connection_args())
        self._ws = await websocket_connect(request)
        self._reader = asyncio.ensure_future(self._read())
        try:
            await self._wait_for_ready(ready_timeout)
        except BaseException:
            await self.close()
            raise

    async def _wait_for_ready(self, timeout: float) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            msg_id = self._send("shell", "kernel_info_request", {})
            resend_at = min(deadline, loop.time() + 1.0)
            while loop.time() < resend_at:
                try:
                    msg = await asyncio.wait_for(self.messages.get(), resend_at - loop.time())
                except asyncio.TimeoutError:
                    break
                if msg.get("channel") == "event":
                    raise RuntimeError(f"Gateway websocket closed before kernel {self.kernel_id} was ready")
                if (msg.get("parent_header") or {}).get("msg_id") == msg_id and msg.get(
                    "msg_type", msg.get("header", {}).get("msg_type")
                ) == "kernel_info_reply":
                    return
            if loop.time() >= deadline:
                raise TimeoutError(f"Kernel {self.kernel_id} did not answer within {timeout:.0f} s")

    async def _read(self) -> None:
        assert self._ws is not None
        while True:
            try:
                raw = await self._ws.read_message()
            except Exception as e:
                # broad: the connection broke (closed stream, websocket error): a disconnect event
                self.messages.put_nowait(event("disconnected", reason=str(e)))
                return
            if raw is None:
                self.messages.put_nowait(event("disconnected", reason="gateway websocket closed"))
                return
            try:
                msg = json.loads(raw)
            except (ValueError, UnicodeDecodeError):
                log.debug("ignoring a non-JSON message from the gateway for kernel %s", self.kernel_id)
                continue
            content = msg.get("content") or {}
            if (
                msg.get("msg_type", msg.get("header", {}).get("msg_type")) == "status"
                and not (msg.get("parent_header") or {}).get("msg_id")
                and content.get("execution_state") in ("restarting", "dead")
            ):
                self.lost_state = True
            self.messages.put_nowait(msg)

    def _send(self, channel: str, msg_type: str, content: dict[str, Any], parent: Any = None) -> str:
        assert self._ws is not None
        msg = self.session.msg(msg_type, content, parent=parent)
        msg["channel"] = channel
        msg.setdefault("buffers", [])
        self._ws.write_message(json.dumps(msg, default=json_default))
        return str(msg["header"]["msg_id"])

    def execute(self, code: str, *, silent: bool = False, store_history: bool = True) -> str:
        content = {
            "code": code,
            "silent": silent,
            "store_history": store_history,
            "user_expressions": {},
            "allow_stdin": False,  # as LocalKernelConnection.execute
            "stop_on_error": False,
        }
        return self._send("shell", "execute_request", content)

    def input_reply(self, value: str, parent: dict[str, Any]) -> None:
        self._send("stdin", "input_reply", {"value": value}, parent=parent.get("header"))

    async def is_alive(self) -> bool:
        if self._ws is None or self._reader is None or self._reader.done():
            return False
        try:
            kernel = self.kernel_manager.get_kernel(self.kernel_id)
            alive = bool(await ensure_async(kernel.is_alive()))
        except Exception:  # broad: gateway HTTP errors, timeouts or a kernel gone from the manager: not alive
            return False
        # jupyter_server's is_alive answers True on the very request that finds the kernel gone (404: its
        # model becomes None, and only the next call says False); a gateway that culled the kernel does
        # not close its websocket either (Enterprise Gateway 3.3).
        return alive and getattr(kernel, "kernel", True) is not None

    async def close(self) -> None:
        if self._ws is not None:
            ws, self._ws = self._ws, None
            # broad: closing a websocket that already broke may fail any way: it is closed either way
            with contextlib.suppress(Exception):
                ws.close()
        if self._reader is not None:
            self._reader.cancel()
            # broad: awaiting the cancelled reader: its CancelledError or its own failure
            with contextlib.suppress(BaseException):
                await self._reader
            self._reader = None


# -- the kernels this server started ---------------------------------------------------------------

SERVER_ENV = "KERNEL_AGENT_TOOLS_SERVER"  # the server's stable id (kept in the record)
PROCESS_ENV = "KERNEL_AGENT_TOOLS_PROCESS"  # a hash of the server process's identity (stores.ProcessIdentity)
RECORD_NAME = "agent_tools_gateway_kernels.json"


def process_tag(key: str) -> str:
    """The owner tag of a server process (a hash of its :attr:`ProcessIdentity.key`: no host names or PIDs
    in a kernel's environment)."""
    return hashlib.sha256(key.encode()).hexdigest()[:16]


class OwnedKernels:
    """The kernels this server started on the gateway, by id, with the server process that started each,
    in the JSON file ``path`` (written atomically in a worker thread: the event loop never waits on it).

    A missing or unreadable file is a fresh start (logged). The file holds ids only: nothing secret.
    """

    def __init__(self, path: str, logger: logging.Logger | None = None):
        self.path = path
        self.log = logger or log
        self.me = this_process().key
        self._worker = Worker("agent-tools-gateway-record")
        self._data = self._read()
        self.server_id: str = self._data.setdefault("server", uuid4().hex)

    def _read(self) -> dict[str, Any]:
        try:
            with open(self.path, encoding="utf-8") as f:
                data = json.load(f)
        except FileNotFoundError:
            return {"kernels": {}}
        except (OSError, ValueError) as e:
            self.log.warning("the record of gateway kernels %s cannot be read (%s): a new one", self.path, e)
            return {"kernels": {}}
        if not isinstance(data, dict) or not isinstance(data.get("kernels"), dict):
            return {"kernels": {}}
        data["kernels"] = {str(k): str(v) for k, v in data["kernels"].items()}
        if not isinstance(data.get("server"), str):
            data.pop("server", None)
        return data

    def env(self) -> dict[str, str]:
        """The owner tag a kernel this server starts carries in its environment."""
        return {SERVER_ENV: self.server_id, PROCESS_ENV: process_tag(self.me)}

    @property
    def kernel_ids(self) -> list[str]:
        return list(self._data["kernels"])

    async def add(self, kernel_id: str) -> None:
        self._data["kernels"][kernel_id] = self.me
        await self._save()

    async def discard(self, kernel_id: str) -> None:
        if self._data["kernels"].pop(kernel_id, None) is not None:
            await self._save()

    def orphans(self) -> list[str]:
        """Kernels recorded for a server process that no longer runs (not this one)."""
        kernels = self._data["kernels"].items()
        return [k for k, owner in kernels if owner != self.me and not owner_alive(owner, None, 0)]

    async def reap(self, delete: Callable[[str], Awaitable[None]]) -> tuple[list[str], list[str]]:
        """Shut down the orphans with ``delete`` (a kernel already gone, 404, counts as shut down); those
        whose shutdown failed (the gateway is down) stay recorded for the next start. (reaped, kept)."""
        reaped, kept = [], []
        for kernel_id in self.orphans():
            try:
                await delete(kernel_id)
            except Exception as e:
                # broad: a gateway's HTTP or connection error keeps the kernel for the next clean-up; logged
                if http_status(e) != 404:
                    kept.append(kernel_id)
                    self.log.warning(
                        "shutting down orphaned gateway kernel %s failed (kept for the next start): %s",
                        kernel_id,
                        e,
                    )
                    continue
            reaped.append(kernel_id)
            self._data["kernels"].pop(kernel_id, None)
        if reaped:
            await self._save()
        return reaped, kept

    async def _save(self) -> None:
        snapshot = json.dumps(self._data, sort_keys=True)
        try:
            await self._worker.run(functools.partial(_write_atomically, self.path, snapshot))
        except Exception as e:
            # broad: a full disk must not fail a kernel start: the record is for clean-up; logged
            self.log.warning("writing the record of gateway kernels %s failed: %s", self.path, e)

    def close(self) -> None:
        self._worker.shutdown(wait=True)


def _write_atomically(path: str, text: str) -> None:
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, mode=0o700, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".gateway-kernels-", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


async def delete_gateway_kernel(kernel_id: str) -> None:
    """DELETE a kernel on the gateway that this process's kernel manager does not know (an orphan)."""
    from jupyter_server.gateway.gateway_client import gateway_request

    client = GatewayClient.instance()
    url = url_path_join(client.url or "", client.kernels_endpoint, url_escape(kernel_id))
    await gateway_request(url, method="DELETE")


# -- the kernel cap ------------------------------------------------------------------------------------

# Set while the warm pool starts a kernel: its own start hitting the cap must not release the pool.
POOL_START: contextvars.ContextVar[bool] = contextvars.ContextVar("agent_tools_pool_start", default=False)
CAP_MARK = "kernel cap"  # the key of its wrap (compat.wrap_once)


def watch_kernel_cap(
    kernel_manager: Any, release: Callable[[], Awaitable[list[str]]], logger: logging.Logger
) -> None:
    """Wrap the gateway kernel manager's ``start_kernel`` (once): a creation refused for the gateway's kernel
    cap, not the pool's own, calls ``release()`` (the pool's kernels go) and, when that freed any, is tried
    once more."""

    def wrap(original: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def start_kernel(*args: Any, **kwargs: Any) -> Any:
            try:
                return await original(*args, **kwargs)
            except Exception as e:
                # broad: any start failure is looked at; only the gateway's kernel cap is handled, the rest
                # re-raised
                if POOL_START.get() or not is_kernel_cap(e):
                    raise
                released = await release()
                if not released:
                    raise
                logger.warning(
                    "the kernel gateway refused a kernel for its kernel cap (%s): shut down %d warm pool "
                    "kernel(s) %s and trying once more",
                    e,
                    len(released),
                    released,
                )
            return await original(*args, **kwargs)

        return start_kernel

    wrap_once(kernel_manager, "start_kernel", CAP_MARK, wrap)

"""A kernel connection over a remote gateway's websocket (``jupyter server --gateway-url=...``).

The stock ``GatewayKernelClient`` opens its websocket without the gateway's auth headers and gets 401
from a gateway that requires a token. This connection opens a Tornado websocket with
``GatewayClient.instance().load_connection_args()`` — what the server's own
``GatewayWebSocketConnection`` does — and speaks the JSON message protocol on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
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

from .connection import event

log = logging.getLogger(__name__)


class GatewayKernelConnection:
    """Messages of one gateway kernel over its ``/api/kernels/{id}/channels`` websocket."""

    def __init__(self, kernel_manager: Any, kernel_id: str):
        self.kernel_manager = kernel_manager
        self.kernel_id = kernel_id
        self.messages: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
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
            except Exception as e:  # the connection broke
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
            return bool(await ensure_async(kernel.is_alive()))
        except Exception:
            return False

    async def close(self) -> None:
        if self._ws is not None:
            ws, self._ws = self._ws, None
            with contextlib.suppress(Exception):
                ws.close()
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(BaseException):
                await self._reader
            self._reader = None

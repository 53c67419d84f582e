"""Connections to one kernel: send execute requests, receive every message on one queue.

A connection merges the kernel's shell, iopub and stdin messages (each tagged with its ``channel``) and
the kernel manager's restart/death notices (``channel == "event"``) into a single queue the executor
reads from. :class:`LocalKernelConnection` uses a ZMQ client of the server's own kernel manager; a
gateway connection speaks the same interface over the gateway's websocket.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, Protocol
from uuid import uuid4

import zmq
from jupyter_core.utils import ensure_async

from .iopub import IopubReader, MessageQueue

log = logging.getLogger(__name__)


class Messages(Protocol):
    """A connection's queue of messages (an ``asyncio.Queue`` or :class:`.iopub.MessageQueue`)."""

    def get_nowait(self) -> dict[str, Any]: ...

    async def get(self) -> dict[str, Any]: ...

    def put_nowait(self, item: dict[str, Any]) -> None: ...


class KernelConnection(Protocol):
    """What the executor needs from a kernel."""

    kernel_id: str

    @property
    def messages(self) -> Messages: ...

    lost_state: bool  # the kernel was restarted under this connection (by its manager or gateway)

    async def start(self, ready_timeout: float) -> None: ...

    def execute(self, code: str, *, silent: bool = False, store_history: bool = True) -> str: ...

    def input_reply(self, value: str, parent: dict[str, Any]) -> None: ...

    async def is_alive(self) -> bool: ...

    async def close(self) -> None: ...


def event(name: str, **data: Any) -> dict[str, Any]:
    """A notice from the kernel manager (not a Jupyter message) put on a connection's queue."""
    return {"channel": "event", "event": name, **data}


def drain(queue: Messages) -> int:
    """Drop every queued message (left over from earlier executions); return how many."""
    if isinstance(queue, MessageQueue):
        return queue.discard()  # without decoding what waits raw
    dropped = 0
    while True:
        try:
            queue.get_nowait()
        except asyncio.QueueEmpty:
            return dropped
        dropped += 1


class LocalKernelConnection:
    """A ZMQ client of a kernel started by the server's (non-gateway) kernel manager.

    Each connection has its own session id (the ZMQ identity), so several clients of one kernel do not
    steal each other's replies, and its channels are always stopped on :meth:`close`.

    Its iopub messages are received by an :class:`.iopub.IopubReader` thread as fast as the kernel sends
    them (ZMQ PUB/SUB has no back-pressure: a slower subscriber loses messages) and held raw, at most
    ``iopub_buffer_bytes`` in memory and the rest in a private spool file, until the executor takes them.
    The shell and stdin channels receive at most ``iopub_hwm`` messages ahead of the executor.
    """

    def __init__(
        self,
        kernel_manager: Any,
        kernel_id: str,
        *,
        iopub_hwm: int = 2,
        iopub_buffer_bytes: int = 8 * 1024 * 1024,
    ):
        self.kernel_manager = kernel_manager
        self.kernel_id = kernel_id
        self.iopub_hwm = iopub_hwm
        self.iopub_buffer_bytes = iopub_buffer_bytes
        self.messages = MessageQueue(self._decode)
        self.reader: IopubReader | None = None
        self.lost_state = False
        self._client: Any = None
        self._tasks: list[asyncio.Task[None]] = []
        self._callbacks: list[tuple[Any, str]] = []

    async def start(self, ready_timeout: float) -> None:
        kernel = self.kernel_manager.get_kernel(self.kernel_id)
        client = kernel.client()
        client.session.session = uuid4().hex
        client.context.setsockopt(zmq.RCVHWM, self.iopub_hwm)  # the client's own context: its sockets only
        self._client = client
        client.start_channels(shell=True, iopub=True, stdin=True, hb=False, control=False)
        try:
            deadline = asyncio.get_running_loop().time() + ready_timeout
            await client.wait_for_ready(timeout=ready_timeout)
            await self._start_reader(client, deadline)
        except BaseException:
            await self.close()
            raise
        for name in ("shell", "stdin"):
            channel = getattr(client, f"{name}_channel")
            self._tasks.append(asyncio.create_task(self._pump(name, channel)))
        for kind in ("restart", "dead"):
            callback = self._notice(kind)
            try:
                self.kernel_manager.add_restart_callback(self.kernel_id, callback, kind)
            except Exception:  # the manager may not support restart callbacks
                continue
            self._callbacks.append((callback, kind))

    async def _start_reader(self, client: Any, deadline: float) -> None:
        """Subscribe the reader's own socket, wait until it receives (a SUB socket misses what is sent
        before its subscription reaches the kernel), then stop the client's iopub channel."""
        loop = asyncio.get_running_loop()
        # a sync view of the client's context: the socket belongs to the reader thread
        context: Any = zmq.Context.shadow(client.context.underlying)
        socket = context.socket(zmq.SUB)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.RCVHWM, 0)  # unlimited: the reader bounds memory by bytes, never drops
        socket.setsockopt(zmq.SUBSCRIBE, b"")
        try:
            socket.connect(client._make_url("iopub"))
        except BaseException:
            socket.close(linger=0)
            raise
        queue = self.messages

        def notify() -> None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
                loop.call_soon_threadsafe(queue.wake)

        self.reader = reader = IopubReader(socket, self.iopub_buffer_bytes, notify)
        queue.reader = reader
        reader.start()
        while not reader.received:
            if loop.time() >= deadline:
                raise TimeoutError("the kernel's output channel did not connect")
            client.kernel_info()  # its busy/idle status reaches every subscriber
            waited = loop.time() + 0.2
            while not reader.received and loop.time() < waited:
                await asyncio.sleep(0.01)
        client.iopub_channel.stop()
        queue.discard()

    def _decode(self, frames: list[bytes]) -> dict[str, Any]:
        session = self._client.session
        _, msg_list = session.feed_identities(frames)
        return dict(session.deserialize(msg_list))

    def _notice(self, kind: str) -> Any:
        def callback() -> None:
            self.lost_state = True
            self.messages.put_nowait(event("restarted" if kind == "restart" else "dead"))

        return callback

    async def _pump(self, name: str, channel: Any) -> None:
        while True:
            try:
                msg = await channel.get_msg(timeout=None)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                self.messages.put_nowait(event("disconnected", reason=f"{name} channel: {e}"))
                return
            msg["channel"] = name
            self.messages.put_nowait(msg)

    def execute(self, code: str, *, silent: bool = False, store_history: bool = True) -> str:
        return str(
            self._client.execute(
                code,
                silent=silent,
                store_history=store_history,
                allow_stdin=True,
                stop_on_error=False,
            )
        )

    def input_reply(self, value: str, parent: dict[str, Any]) -> None:
        msg = self._client.session.msg("input_reply", {"value": value}, parent=parent.get("header"))
        self._client.stdin_channel.send(msg)

    async def is_alive(self) -> bool:
        try:
            kernel = self.kernel_manager.get_kernel(self.kernel_id)
        except Exception:  # KeyError, or jupyter_server's HTTPError(404) once the kernel is removed
            return False
        try:
            return bool(await ensure_async(kernel.is_alive()))
        except Exception:
            return False

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(BaseException):
                await task
        self._tasks.clear()
        for callback, kind in self._callbacks:
            with contextlib.suppress(Exception):
                self.kernel_manager.remove_restart_callback(self.kernel_id, callback, kind)
        self._callbacks.clear()
        if self.reader is not None:
            reader, self.reader = self.reader, None
            self.messages.reader = None
            try:  # joins its thread: at most one poll interval, or a spool write, off the event loop
                await asyncio.get_running_loop().run_in_executor(None, reader.close)
            except RuntimeError:  # the executor is shut down (the server is stopping)
                reader.close()
        if self._client is not None:
            client, self._client = self._client, None
            try:
                client.stop_channels()
            except Exception:  # never let a failed stop leak the rest of the cleanup
                log.debug("stop_channels failed for kernel %s", self.kernel_id, exc_info=True)

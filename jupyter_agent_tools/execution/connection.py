"""Connections to one kernel: send execute requests, receive every message on one queue.

A connection merges the kernel's shell, iopub and stdin messages (each tagged with its ``channel``) and
the kernel manager's restart/death notices (``channel == "event"``) into a single queue the executor
reads from. :class:`LocalKernelConnection` uses a ZMQ client of the server's own kernel manager; a
gateway connection speaks the same interface over the gateway's websocket.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import os
from collections import deque
from typing import Any, Protocol
from uuid import uuid4

import zmq
from jupyter_client.session import json_unpacker
from jupyter_core.utils import ensure_async

from ..compat import ServerHTTPError, detach_from_loop, remember_signature
from .activity import KernelActivity
from .faults import KernelPortTaken
from .intake import IopubIntake
from .ports import ports_taken

log = logging.getLogger(__name__)
PORT_NAMES = ("shell", "iopub", "stdin", "control", "hb")
# How often a starting local kernel's ports are looked at for another process's listener (see .ports).
PORT_CHECK_INTERVAL = 0.5


class KernelConnection(Protocol):
    """What the executor needs from a kernel."""

    kernel_id: str
    lost_state: bool  # the kernel was restarted under this connection (by its manager or gateway)

    @property
    def messages(self) -> MessageQueue: ...

    async def start(self, ready_timeout: float) -> None: ...

    def execute(self, code: str, *, silent: bool = False, store_history: bool = True) -> str: ...

    def input_reply(self, value: str, parent: dict[str, Any]) -> None: ...

    async def is_alive(self) -> bool: ...

    async def close(self) -> None: ...


def event(name: str, **data: Any) -> dict[str, Any]:
    """A notice from the kernel manager (not a Jupyter message) put on a connection's queue."""
    return {"channel": "event", "event": name, **data}


def drain(queue: asyncio.Queue[dict[str, Any]]) -> int:
    """Drop every queued message (left over from earlier executions), and those a connection's intake
    holds for the queue; return how many."""
    intake = queue.intake if isinstance(queue, MessageQueue) else None
    dropped = intake.discard() if intake is not None else 0
    while True:
        try:
            queue.get_nowait()
        except asyncio.QueueEmpty:
            return dropped
        dropped += 1


class MessageQueue(asyncio.Queue[dict[str, Any]]):
    """A connection's queue of messages that counts the bytes of the messages it holds.

    A message of ``size`` bytes :meth:`fits` while the queue is empty or holds at most ``budget`` bytes
    with it (budget 0: always). ``taken`` is set by every get; ``waiting`` counts pumps holding a message
    that does not fit yet (the connection's intake holds the rest meanwhile); ``dropped`` counts the
    messages the connection could not hold for it (see :class:`~.intake.IopubIntake`).

    Its reader waits with :meth:`arrival` (one future, woken by the put itself) rather than ``get()``
    in a task raced against a timeout: a cell's few messages each cost a task and two more turns of
    the event loop that way, on the path of every eval's answer.
    """

    def __init__(self, budget: int = 0) -> None:
        super().__init__()
        self.budget = budget
        self.bytes = 0
        self.taken = asyncio.Event()
        self.waiting = 0
        self.intake: IopubIntake | None = None
        self._sizes: deque[int] = deque()
        self._next_size = 0
        self._arrival: asyncio.Future[None] | None = None

    @property
    def dropped(self) -> int:
        return self.intake.dropped if self.intake is not None else 0

    def fits(self, size: int) -> bool:
        return not self.budget or not self.qsize() or self.bytes + size <= self.budget

    async def arrival(self, timeout: float, also: asyncio.Future[Any] | None = None) -> bool:
        """Wait until a message is queued, ``also`` is done, or ``timeout`` seconds have passed; whether
        a message is there to take. One reader at a time."""
        if self.qsize():
            return True
        loop = asyncio.get_running_loop()
        waiter = self._arrival = loop.create_future()

        def wake(_: Any = None) -> None:
            if not waiter.done():
                waiter.set_result(None)

        timer = loop.call_later(timeout, wake)
        if also is not None:
            also.add_done_callback(wake)
        try:
            await waiter
        finally:
            timer.cancel()
            self._arrival = None
            if also is not None:
                also.remove_done_callback(wake)
        return bool(self.qsize())

    def put_sized(self, item: dict[str, Any], size: int) -> None:
        """Queue a message of ``size`` bytes (its frames, as received), whether it fits or not."""
        self._next_size = size
        self.put_nowait(item)

    # asyncio.Queue's hooks for subclasses, under every put and get
    def _put(self, item: dict[str, Any]) -> None:
        super()._put(item)
        size, self._next_size = self._next_size, 0
        self._sizes.append(size)
        self.bytes += size
        if self._arrival is not None and not self._arrival.done():
            self._arrival.set_result(None)

    def _get(self) -> dict[str, Any]:
        item: dict[str, Any] = super()._get()
        self.bytes -= self._sizes.popleft()
        self.taken.set()
        return item


def _recv_now(socket: zmq.Socket[Any]) -> list[bytes] | None:
    """The next message ZMQ has already received, or None (without waiting)."""
    try:
        return socket.recv_multipart(zmq.NOBLOCK)
    except zmq.Again:
        return None


# How long the iopub delivery may wait for room in its queue before jupyter_server watches the kernel's
# activity again (an eval drains the queue in far less; an idle connection may wait for its next call).
ACTIVITY_HANDBACK_AFTER = 1.0


def _decode(session: Any, frames: list[bytes], channel: str) -> Any:
    """A Jupyter message from its frames (signature checked as the session does), tagged with its channel.

    Protocol 5 messages packed as JSON (what kernels send) are decoded here rather than by
    ``Session.deserialize``: the same signature and replay checks and the same message, but the header
    dates stay ISO strings (nothing here reads them; dateutil parsing them was a fifth of the decode of
    every output message). ``frames`` is emptied and the content is parsed from its text once its bytes are
    gone: a 100 MB print (one message) then has at most two full-size copies at a time, not three.
    """
    _, parts = session.feed_identities(frames)
    frames.clear()
    if len(parts) < 5 or session.unpack is not json_unpacker or not _signed(session, parts):
        header = None
    else:
        header = json_unpacker(parts[1])
    if not isinstance(header, dict) or not str(header.get("version", "")).startswith("5."):
        msg = session.deserialize(parts)  # other packers, older protocols (adapted); raises for bad ones
        msg["channel"] = channel
        return msg
    if session.auth is not None:
        remember_signature(session, parts[0])  # jupyter_client's replay memory
    content = parts[4]
    msg = {
        "header": header,
        "msg_id": header["msg_id"],
        "msg_type": header["msg_type"],
        "parent_header": json_unpacker(parts[2]),
        "metadata": json_unpacker(parts[3]),
        "content": None,
        "buffers": [memoryview(b) for b in parts[5:]],
        "channel": channel,
    }
    parts.clear()
    text = content.decode("utf8", "replace")  # what json_unpacker does, with the bytes dropped first
    del content
    msg["content"] = json.loads(text)
    return msg


def _signed(session: Any, parts: list[bytes]) -> bool:
    """Whether the message's signature is the session's, and new to it (else deserialize raises)."""
    if session.auth is None:
        return True
    signature = parts[0]
    if not signature or signature in session.digest_history:
        return False
    return hmac.compare_digest(signature, session.sign(parts[1:5]))


class LocalKernelConnection:
    """A ZMQ client of a kernel started by the server's (non-gateway) kernel manager.

    Each connection has its own session id (the ZMQ identity), so several clients of one kernel do not
    steal each other's replies, and its channels are always stopped on :meth:`close`.

    Output is taken from the kernel as it comes, whatever the event loop does: a thread of the
    connection's own (:class:`~.intake.IopubIntake`) receives iopub and holds the raw messages in memory
    while they fit in ``iopub_buffer_bytes`` together with those decoded ahead of them, and past that in a
    spill file of at most ``iopub_spill_bytes``. On the event loop, :meth:`_deliver_iopub` takes them back
    in order, decodes them and moves them to :attr:`messages` while they fit in the same budget (the
    executor takes them from there; one message always fits an empty queue). ZMQ itself holds at most
    ``iopub_hwm`` messages more (its limit counts messages of any size; a kernel message may be 100 MB):
    the thread keeps up, and the kernel, which never waits for a reader, has nothing to drop.

    While it is open, the connection also keeps the kernel's activity for jupyter_server (see
    :mod:`.activity`): the server then reads each iopub message once, not twice.
    """

    def __init__(
        self,
        kernel_manager: Any,
        kernel_id: str,
        *,
        iopub_hwm: int = 2,
        iopub_buffer_bytes: int = 0,
        iopub_spill_bytes: int = 1024**3,
        hold_activity: bool = True,
        check_ports: bool = True,
    ):
        self.kernel_manager = kernel_manager
        self.kernel_id = kernel_id
        self.iopub_hwm = iopub_hwm
        self.iopub_spill_bytes = iopub_spill_bytes
        self.messages = MessageQueue(iopub_buffer_bytes)
        self.intake: IopubIntake | None = None
        self._lost_state = False
        self._pid: int | None = None  # the kernel's process when connected
        self._client: Any = None
        self._tasks: list[asyncio.Future[None]] = []
        self._iopub_paused = False  # delivery from the intake waits for room, or ended
        self._callbacks: list[tuple[Any, str]] = []
        self.hold_activity = hold_activity
        self.check_ports = check_ports
        self._activity: KernelActivity | None = None

    async def start(self, ready_timeout: float) -> None:
        kernel = self.kernel_manager.get_kernel(self.kernel_id)
        client = kernel.client()
        client.session.session = uuid4().hex
        client.context.setsockopt(zmq.RCVHWM, self.iopub_hwm)  # the client's own context: its sockets only
        self._client = client
        client.start_channels(shell=True, iopub=True, stdin=True, hb=False, control=False)
        try:
            await self._wait_for_ready(client, ready_timeout)
        except BaseException:
            await self.close()
            raise
        self._pid = self._process_id()
        if self.hold_activity:
            self._activity = KernelActivity.of(self.kernel_manager, self.kernel_id)
        if self._activity is not None:
            self._activity.hold()
        try:
            await self._start_intake(client.iopub_channel.socket)
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
            except Exception:
                # broad: managers without restart callbacks (gateway, others) fail in their own ways: none
                # here
                continue
            self._callbacks.append((callback, kind))

    async def _wait_for_ready(self, client: Any, ready_timeout: float) -> None:
        """The client's ``wait_for_ready``; on Linux, for TCP ports, it fails at once (not after
        ``ready_timeout``) when another process listens on one of the kernel's ports meanwhile: the kernel
        cannot bind it and hangs (see :mod:`.ports`); :class:`~.faults.KernelPortTaken`, which the recovery
        retries on a new kernel."""
        ready = asyncio.ensure_future(client.wait_for_ready(timeout=ready_timeout))
        info = client.get_connection_info()
        ports = {info[f"{name}_port"]: name for name in PORT_NAMES if info.get(f"{name}_port")}
        watch = self.check_ports and info.get("transport") == "tcp" and os.path.isdir("/proc")
        try:
            while watch and not ready.done():
                await asyncio.wait([ready], timeout=PORT_CHECK_INTERVAL)
                pid = self._process_id()
                if ready.done() or pid is None:
                    continue
                # a thread: reading /proc/net/tcp{,6} took ~8 ms here (the kernel walks its TCP tables)
                taken = await asyncio.to_thread(ports_taken, pid, ports)
                watch = taken is not None  # None: not to be told here (today's wait, to its timeout)
                if taken:
                    raise KernelPortTaken(
                        "another process took the kernel's "
                        + ", ".join(f"{ports[port]} port {port}" for port in taken)
                        + " before the kernel bound it (Address already in use): it could never answer"
                    )
            await ready
        finally:
            # (a closed loop: a start abandoned at server stop, closed by the garbage collector)
            if not ready.done() and not ready.get_loop().is_closed():
                ready.cancel()  # its end (cancelled, or a failure meanwhile) is not this call's
                ready.add_done_callback(lambda f: f.cancelled() or f.exception())

    @property
    def lost_state(self) -> bool:
        """The kernel was restarted (or went) under this connection: told by the manager's auto-restarter
        (callbacks), or seen as another process, which is all an explicit restart through the kernel
        manager leaves (JupyterLab's "Restart Kernel" fires no callback)."""
        if self._lost_state or self._pid is None:
            return self._lost_state
        now = self._process_id()  # None: gone from the manager, or between two processes (is_alive tells)
        return now is not None and now != self._pid

    @lost_state.setter
    def lost_state(self, value: bool) -> None:
        self._lost_state = value

    def _process_id(self) -> int | None:
        """The pid of the kernel's process (jupyter_client's provisioner), None when it has none."""
        try:
            kernel = self.kernel_manager.get_kernel(self.kernel_id)
        except (KeyError, ServerHTTPError):  # not in the manager (jupyter_server: 404)
            return None
        pid = getattr(getattr(kernel, "provisioner", None), "pid", None)
        return pid if isinstance(pid, int) else None

    def _notice(self, kind: str) -> Any:
        def callback() -> None:
            self.lost_state = True
            self.messages.put_nowait(event("restarted" if kind == "restart" else "dead"))

        return callback

    async def _start_intake(self, socket: Any) -> None:
        """Hand the iopub socket to a thread of its own (see :class:`~.intake.IopubIntake`)."""
        # From now on the intake's thread alone uses it, until close() stops the thread: the loop would
        # otherwise touch the socket from its own thread.
        detach_from_loop(socket)
        # a check of the socket pyzmq scheduled before (call_later(0)) runs in the next iteration: let it
        for _ in range(2):
            await asyncio.sleep(0)
        queue = self.messages
        self.intake = queue.intake = IopubIntake(
            zmq.Socket.shadow(socket.underlying),
            budget=queue.budget,
            spill_bytes=self.iopub_spill_bytes,
            held_elsewhere=lambda: (queue.bytes, queue.qsize()),
            name=f"iopub-{self.kernel_id[:8]}",
            on_arrival=self._deliver_iopub,
        )
        self.intake.start()

    async def _pump(self, name: str, channel: Any) -> None:
        """Move the channel's messages to the queue as they come."""
        socket, session, queue = channel.socket, self._client.session, self.messages
        # the same socket, for receives that never wait
        now: zmq.Socket[Any] = zmq.Socket.shadow(socket.underlying)
        while True:
            try:
                # copied into bytes as received: ZMQ's buffer goes at once (frames would keep it alive)
                frames = await socket.recv_multipart()
                while frames is not None:
                    queue.put_nowait(_decode(session, frames, name))
                    frames = _recv_now(now)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                # broad: any failure reading a channel (ZMQ, a message that does not decode) is a disconnect
                # event
                queue.put_nowait(event("disconnected", reason=f"{name} channel: {e}"))
                return

    def _deliver_iopub(self) -> None:
        """Move the intake's messages to the queue, decoded, in order, while they fit (they wait in the
        intake meanwhile, undecoded). Called on the loop by the intake's thread when messages came (a
        callback, not a task woken by an event: the last message of every execution is on the path of its
        answer), and again once the queue has room."""
        intake, queue, activity = self.intake, self.messages, self._activity
        if intake is None or self._client is None or self._iopub_paused:
            return  # closed, ended, or waiting for room (which delivers again)
        session = self._client.session
        while True:
            size = intake.next_size()
            if size is None:
                if intake.error is not None:
                    self._iopub_paused = True
                    queue.put_nowait(event("disconnected", reason=intake.error))
                    return
                if intake.rearm():
                    return  # nothing held: the thread calls again with the next message
                continue
            if not queue.fits(size):
                self._iopub_paused = True
                self._tasks.append(asyncio.ensure_future(self._resume_iopub(size)))
                return
            try:
                msg = _decode(session, intake.take(), "iopub")
            except Exception as e:
                # broad: a bad message, or a spilled one that could not be read back: a disconnect event
                self._iopub_paused = True
                queue.put_nowait(event("disconnected", reason=f"iopub channel: {e}"))
                return
            if activity is not None:
                activity.record(msg)
            queue.put_sized(msg, size)

    async def _resume_iopub(self, size: int) -> None:
        """Deliver again once the queue has room for the oldest message held (see :meth:`_wait_for_room`)."""
        await self._wait_for_room(size)
        self._tasks = [task for task in self._tasks if not task.done()]
        self._iopub_paused = False
        self._deliver_iopub()  # the oldest may be another one now (drain discards what is held)

    async def _wait_for_room(self, size: int) -> None:
        """Wait until the queue has room for ``size`` bytes; jupyter_server watches the kernel's activity
        again if that takes longer than ``ACTIVITY_HANDBACK_AFTER``, and this connection holds it after."""
        queue, activity = self.messages, self._activity
        handback = None
        if activity is not None:
            handback = asyncio.get_running_loop().call_later(ACTIVITY_HANDBACK_AFTER, activity.release)
        queue.waiting += 1
        try:
            while not queue.fits(size):
                queue.taken.clear()
                await queue.taken.wait()
        finally:
            queue.waiting -= 1
            if handback is not None:
                handback.cancel()
        if activity is not None:
            activity.hold()

    def execute(self, code: str, *, silent: bool = False, store_history: bool = True) -> str:
        return str(
            self._client.execute(
                code,
                silent=silent,
                store_history=store_history,
                allow_stdin=False,  # input() raises at once (ipykernel: StdinNotImplementedError)
                stop_on_error=False,
            )
        )

    def input_reply(self, value: str, parent: dict[str, Any]) -> None:
        msg = self._client.session.msg("input_reply", {"value": value}, parent=parent.get("header"))
        self._client.stdin_channel.send(msg)

    async def is_alive(self) -> bool:
        try:
            kernel = self.kernel_manager.get_kernel(self.kernel_id)
        except (KeyError, ServerHTTPError):  # jupyter_server answers 404 once the kernel is removed
            return False
        try:
            return bool(await ensure_async(kernel.is_alive()))
        except Exception:
            # broad: a kernel being removed or restarted answers is_alive with any error (provisioner, HTTP)
            return False

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            # broad: awaiting a cancelled task: its CancelledError or its own failure; gone either way
            with contextlib.suppress(BaseException):
                await task
        self._tasks.clear()
        if self.intake is not None:
            # broad: the intake stopping at close, cancelled or failed: the socket is closed after it
            with contextlib.suppress(BaseException):
                await self.intake.stop()  # before the socket is closed: the thread uses it until then
        if self._activity is not None:
            self._activity.release()
        for callback, kind in self._callbacks:
            # broad: the kernel may be gone (KeyError, 404) or the callback already removed: cleanup goes on
            with contextlib.suppress(Exception):
                self.kernel_manager.remove_restart_callback(self.kernel_id, callback, kind)
        self._callbacks.clear()
        if self._client is not None:
            client, self._client = self._client, None
            try:
                client.stop_channels()
            except Exception:
                # broad: never let a failed stop (any client kind) leak the rest of the cleanup; logged
                log.debug("stop_channels failed for kernel %s", self.kernel_id, exc_info=True)

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
import struct
import tempfile
from collections import deque
from collections.abc import Callable
from typing import Any, BinaryIO, Protocol
from uuid import uuid4

import zmq
from jupyter_client.session import json_unpacker
from jupyter_core.utils import ensure_async

from ..compat import remember_signature
from .activity import KernelActivity

log = logging.getLogger(__name__)


class KernelConnection(Protocol):
    """What the executor needs from a kernel."""

    kernel_id: str
    lost_state: bool  # the kernel was restarted under this connection (by its manager or gateway)

    @property
    def messages(self) -> asyncio.Queue[dict[str, Any]]: ...

    async def start(self, ready_timeout: float) -> None: ...

    def execute(self, code: str, *, silent: bool = False, store_history: bool = True) -> str: ...

    def input_reply(self, value: str, parent: dict[str, Any]) -> None: ...

    async def is_alive(self) -> bool: ...

    async def close(self) -> None: ...


def event(name: str, **data: Any) -> dict[str, Any]:
    """A notice from the kernel manager (not a Jupyter message) put on a connection's queue."""
    return {"channel": "event", "event": name, **data}


def drain(queue: asyncio.Queue[dict[str, Any]]) -> int:
    """Drop every queued message (left over from earlier executions); return how many."""
    dropped = queue.discard_spilled() if isinstance(queue, MessageQueue) else 0
    while True:
        try:
            queue.get_nowait()
        except asyncio.QueueEmpty:
            return dropped
        dropped += 1


class Spill:
    """Raw messages (their frames, undecoded) in an unnamed temporary file, first in, first out, at most
    ``max_bytes`` of frames at a time (the file is emptied each time the last one is taken back)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._file: BinaryIO | None = None
        self._records: deque[tuple[int, int]] = deque()  # (offset in the file, bytes of its frames)
        self._end = 0

    def __len__(self) -> int:
        return len(self._records)

    def room(self, size: int) -> bool:
        return self.bytes + size <= self.max_bytes

    @property
    def next_size(self) -> int:
        return self._records[0][1]

    def push(self, frames: list[bytes], size: int) -> None:
        if self._file is None:
            self._file = tempfile.TemporaryFile(prefix="agent-iopub-")  # noqa: SIM115 (closed by close())
        fd, offset = self._file.fileno(), self._end
        header = struct.pack(f"<I{len(frames)}Q", len(frames), *map(len, frames))
        for part in (header, *frames):
            _write_all(fd, part, self._end)
            self._end += len(part)
        self._records.append((offset, size))
        self.bytes += size

    def pop(self) -> list[bytes]:
        assert self._file is not None
        fd = self._file.fileno()
        offset, size = self._records.popleft()
        (count,) = struct.unpack("<I", _read_all(fd, 4, offset))
        lengths = struct.unpack(f"<{count}Q", _read_all(fd, 8 * count, offset + 4))
        position, frames = offset + 4 + 8 * count, []
        for length in lengths:
            frames.append(_read_all(fd, length, position))
            position += length
        self.bytes -= size
        if not self._records:
            self.clear()
        return frames

    def clear(self) -> int:
        """Forget every message held (the file keeps its descriptor, emptied); return how many."""
        count = len(self._records)
        self._records.clear()
        self.bytes = self._end = 0
        if self._file is not None:
            self._file.truncate(0)
        return count

    def close(self) -> None:
        self.clear()
        if self._file is not None:
            self._file.close()
            self._file = None


def _write_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written


def _read_all(fd: int, size: int, offset: int) -> bytes:
    data = os.pread(fd, size, offset)
    if len(data) == size:
        return data
    parts = [data]
    while size > (got := sum(map(len, parts))):
        part = os.pread(fd, size - got, offset + got)
        if not part:
            raise OSError(f"the iopub spill file ended {size - got} bytes early")
        parts.append(part)
    return b"".join(parts)


class MessageQueue(asyncio.Queue[dict[str, Any]]):
    """A connection's queue of messages that counts the bytes of the messages it holds.

    A message of ``size`` bytes :meth:`fits` while the queue is empty or holds at most ``budget`` bytes
    with it (budget 0: always). ``taken`` is set by every get.

    :meth:`offer` never refuses a message the kernel sent: one that does not fit (or arrives while others
    are spilled) goes, undecoded, to a :class:`Spill` of at most ``spill_bytes`` on disk, and comes back,
    decoded by ``decode``, in order as gets make room. Only past that too is a message dropped (counted in
    ``dropped``), and so is every one after it until the queue has been emptied: one gap, not many.
    """

    def __init__(
        self,
        budget: int = 0,
        spill_bytes: int = 0,
        decode: Callable[[list[bytes]], dict[str, Any]] | None = None,
    ) -> None:
        super().__init__()
        self.budget = budget
        self.bytes = 0
        self.taken = asyncio.Event()
        self.dropped = 0
        self._dropping = False
        self.spill = Spill(spill_bytes)
        self.decode = decode
        self._sizes: deque[int] = deque()
        self._next_size = 0

    @property
    def waiting(self) -> int:
        """Messages waiting (spilled) for room in the queue."""
        return len(self.spill)

    def fits(self, size: int) -> bool:
        return not self.budget or not self.qsize() or self.bytes + size <= self.budget

    def put_sized(self, item: dict[str, Any], size: int) -> None:
        """Queue a message of ``size`` bytes (its frames, as received), whether it fits or not."""
        self._next_size = size
        self.put_nowait(item)

    def offer(self, frames: list[bytes], size: int) -> bool:
        """Queue a message from its frames, or spill them while it does not fit; False: dropped (the
        spill is full too)."""
        self._dropping = self._dropping and bool(self.qsize())
        if self._dropping:
            pass
        elif not self.spill and self.fits(size):
            assert self.decode is not None
            self.put_sized(self.decode(frames), size)
            return True
        elif self.spill.room(size):
            try:
                self.spill.push(frames, size)
                return True
            except OSError:  # no room on the disk: as past the spill's limit
                log.warning("could not spill an iopub message", exc_info=True)
        self.dropped += 1
        self._dropping = True
        return False

    def discard_spilled(self) -> int:
        return self.spill.clear()

    # asyncio.Queue's hooks for subclasses, under every put and get
    def _put(self, item: dict[str, Any]) -> None:
        super()._put(item)
        size, self._next_size = self._next_size, 0
        self._sizes.append(size)
        self.bytes += size

    def _get(self) -> dict[str, Any]:
        item: dict[str, Any] = super()._get()
        self.bytes -= self._sizes.popleft()
        self.taken.set()
        # the spill's oldest come back as room is made (only a get makes room, and it is never emptied
        # with messages spilled: a spill starts only behind a message that is queued)
        while self.spill and self.fits(self.spill.next_size):
            size = self.spill.next_size
            assert self.decode is not None
            try:
                back = self.decode(self.spill.pop())
            except Exception as e:  # as the pump treats a message it cannot decode (or read back)
                self.spill.clear()
                back, size = event("disconnected", reason=f"iopub channel: {e}"), 0
            self._next_size = size
            self._put(back)
        return item


def _recv_now(socket: zmq.Socket[Any]) -> list[bytes] | None:
    """The next message ZMQ has already received, or None (without waiting)."""
    try:
        return socket.recv_multipart(zmq.NOBLOCK)
    except zmq.Again:
        return None


# How long iopub messages may stay spilled (undecoded, so their activity unrecorded) before jupyter_server
# watches the kernel's activity again (an eval drains them in far less; an idle connection may not).
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

    No output the kernel sends is lost to a slow reader. The kernel's iopub is a ZMQ PUB socket: it
    never waits for a subscriber, it drops what the subscriber's pipe cannot take (past ZMQ's high-water
    marks), so it cannot be slowed down by reading less. This connection's iopub therefore has no receive
    high-water mark (ZMQ's own I/O thread takes every message off the kernel's socket as it comes, even
    while the server's event loop is busy), and its pump moves every message ZMQ has received to
    :attr:`messages` while it fits in ``iopub_buffer_bytes`` (the executor takes them from there; one
    message always fits an empty queue); past it, to a spill file of at most ``iopub_spill_bytes``, from
    which they come back in order as the executor takes. Only past both are messages dropped (counted in
    ``messages.dropped``, logged).

    While it is open, the connection also keeps the kernel's activity for jupyter_server (see
    :mod:`.activity`): the server then reads each iopub message once, not twice.
    """

    def __init__(
        self,
        kernel_manager: Any,
        kernel_id: str,
        *,
        iopub_buffer_bytes: int = 0,
        iopub_spill_bytes: int = 0,
        hold_activity: bool = True,
    ):
        self.kernel_manager = kernel_manager
        self.kernel_id = kernel_id
        self.messages = MessageQueue(iopub_buffer_bytes, iopub_spill_bytes, self._decode_iopub)
        self._handback: asyncio.TimerHandle | None = None
        self._lost_state = False
        self._pid: int | None = None  # the kernel's process when connected
        self._client: Any = None
        self._tasks: list[asyncio.Task[None]] = []
        self._callbacks: list[tuple[Any, str]] = []
        self.hold_activity = hold_activity
        self._activity: KernelActivity | None = None

    async def start(self, ready_timeout: float) -> None:
        kernel = self.kernel_manager.get_kernel(self.kernel_id)
        client = kernel.client()
        client.session.session = uuid4().hex
        # no receive limit (the client's own context: its sockets only): the kernel's PUB socket drops what
        # a subscriber's pipe cannot take, so ZMQ's I/O thread must take every message as it comes
        client.context.setsockopt(zmq.RCVHWM, 0)
        self._client = client
        client.start_channels(shell=True, iopub=True, stdin=True, hb=False, control=False)
        try:
            await client.wait_for_ready(timeout=ready_timeout)
        except BaseException:
            await self.close()
            raise
        self._pid = self._process_id()
        if self.hold_activity:
            self._activity = KernelActivity.of(self.kernel_manager, self.kernel_id)
        if self._activity is not None:
            self._activity.hold()
        for name in ("shell", "iopub", "stdin"):
            channel = getattr(client, f"{name}_channel")
            self._tasks.append(asyncio.create_task(self._pump(name, channel)))
        for kind in ("restart", "dead"):
            callback = self._notice(kind)
            try:
                self.kernel_manager.add_restart_callback(self.kernel_id, callback, kind)
            except Exception:  # the manager may not support restart callbacks
                continue
            self._callbacks.append((callback, kind))

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
        except Exception:  # KeyError, or jupyter_server's HTTPError(404): not in the manager
            return None
        pid = getattr(getattr(kernel, "provisioner", None), "pid", None)
        return pid if isinstance(pid, int) else None

    def _notice(self, kind: str) -> Any:
        def callback() -> None:
            self.lost_state = True
            self.messages.put_nowait(event("restarted" if kind == "restart" else "dead"))

        return callback

    async def _pump(self, name: str, channel: Any) -> None:
        """Move the channel's messages to the queue as they come (iopub's through :meth:`MessageQueue.offer`:
        spilled while they do not fit, never waited for)."""
        socket, session, queue = channel.socket, self._client.session, self.messages
        # the same socket, for receives that never wait
        now: zmq.Socket[Any] = zmq.Socket.shadow(socket.underlying)
        iopub = name == "iopub"
        while True:
            try:
                # copied into bytes as received: ZMQ's buffer goes at once (frames would keep it alive)
                frames = await socket.recv_multipart()
                while frames is not None:
                    if not iopub:
                        queue.put_nowait(_decode(session, frames, name))
                    elif not queue.offer(frames, sum(map(len, frames))) and queue.dropped == 1:
                        log.warning(
                            "kernel %s: iopub messages dropped (iopub_buffer_bytes and iopub_spill_bytes "
                            "are both full)",
                            self.kernel_id,
                        )
                    if iopub and queue.spill and self._activity is not None and self._handback is None:
                        self._handback = asyncio.get_running_loop().call_later(
                            ACTIVITY_HANDBACK_AFTER, self._activity.release
                        )
                    frames = _recv_now(now)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                queue.put_nowait(event("disconnected", reason=f"{name} channel: {e}"))
                return

    def _decode_iopub(self, frames: list[bytes]) -> dict[str, Any]:
        """An iopub message from its frames, its activity recorded (held again once nothing is spilled)."""
        msg: dict[str, Any] = _decode(self._client.session, frames, "iopub")
        activity = self._activity
        if activity is not None:
            if self._handback is not None and not self.messages.spill:
                self._handback.cancel()
                self._handback = None
                activity.hold()
            activity.record(msg)
        return msg

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
        self.messages.spill.close()
        if self._handback is not None:
            self._handback.cancel()
        if self._activity is not None:
            self._activity.release()
        for callback, kind in self._callbacks:
            with contextlib.suppress(Exception):
                self.kernel_manager.remove_restart_callback(self.kernel_id, callback, kind)
        self._callbacks.clear()
        if self._client is not None:
            client, self._client = self._client, None
            try:
                client.stop_channels()
            except Exception:  # never let a failed stop leak the rest of the cleanup
                log.debug("stop_channels failed for kernel %s", self.kernel_id, exc_info=True)

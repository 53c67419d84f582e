"""A lossless, byte-bounded intake of a local kernel's iopub messages.

ZMQ PUB/SUB has no back-pressure: a subscriber that reads slower than the kernel prints loses messages
once the high-water marks fill (the kernel's PUB socket drops them). The server's event loop is slower
than a flooding kernel, so a thread does nothing but receive the raw frames as fast as ZMQ delivers them
(unlimited receive high-water mark) and queue them in order: in memory up to ``budget`` bytes, past it in
a private spool file (an anonymous temporary file, removed when closed), read back in order as the
consumer catches up. Memory stays about ``budget`` plus one message; a single huge message (one 100 MB
print) is held whole. The event loop decodes a message only when the executor asks for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import struct
import tempfile
import threading
from collections import deque
from collections.abc import Callable
from typing import IO, Any

import zmq

log = logging.getLogger(__name__)

_COUNT = struct.Struct("<I")
_LENGTH = struct.Struct("<Q")
POLL_MS = 50  # the reader checks its stop flag (and refills from the spool) at least this often
REFILL_POLL_MS = 5  # while spooled messages wait for room in memory


class _Spool:
    """An in-order file of multipart messages, written and read by the reader thread only."""

    def __init__(self) -> None:
        self._file: IO[bytes] | None = None
        self._read = self._write = 0
        self.count = 0  # messages written and not yet read back
        self.bytes = 0
        self.pushed = self.popped = 0  # messages ever written, read back
        self._next_size: int | None = None  # size of the next record's frames, once peeked

    def push(self, frames: list[bytes]) -> None:
        if self._file is None:
            self._file = tempfile.TemporaryFile(prefix="jupyter-agent-iopub-")  # noqa: SIM115 - closed in close()
        fd = self._file.fileno()
        header = _COUNT.pack(len(frames)) + b"".join(_LENGTH.pack(len(f)) for f in frames)
        for part in (header, *frames):
            view = memoryview(part)
            while view:
                written = os.pwrite(fd, view, self._write)
                self._write += written
                view = view[written:]
        self.bytes += sum(len(f) for f in frames)
        self.pushed += 1
        self.count += 1

    def _pread(self, size: int) -> bytes:
        assert self._file is not None
        parts: list[bytes] = []
        while size:
            part = os.pread(self._file.fileno(), size, self._read)
            if not part:
                raise OSError("iopub spool truncated")
            parts.append(part)
            self._read += len(part)
            size -= len(part)
        return b"".join(parts)

    def next_size(self) -> int:
        """Bytes of the next message's frames (0 when the spool is empty)."""
        if not self.count:
            return 0
        if self._next_size is None:
            start = self._read
            (n,) = _COUNT.unpack(self._pread(_COUNT.size))
            lengths = self._pread(_LENGTH.size * n)
            self._read = start
            self._next_size = sum(length for (length,) in _LENGTH.iter_unpack(lengths))
        return self._next_size

    def pop(self) -> list[bytes]:
        (n,) = _COUNT.unpack(self._pread(_COUNT.size))
        lengths = [length for (length,) in _LENGTH.iter_unpack(self._pread(_LENGTH.size * n))]
        frames = [self._pread(length) for length in lengths]
        self.count -= 1
        self.popped += 1
        self.bytes -= sum(lengths)
        self._next_size = None
        if not self.count and self._file is not None:  # caught up: give the disk space back
            self._file.truncate(0)
            self._read = self._write = 0
        return frames

    def close(self) -> None:
        if self._file is not None:
            file, self._file = self._file, None
            file.close()


class IopubReader:
    """Receives a kernel's iopub messages on a thread; hands their raw frames over in order.

    ``notify`` is called (from the reader thread) when frames become available after none were.
    """

    def __init__(self, socket: zmq.Socket[Any], budget: int, notify: Callable[[], None]):
        self._socket = socket
        self.budget = budget
        self._notify = notify
        self._lock = threading.Lock()
        self._memory: deque[list[bytes]] = deque()
        self.memory_bytes = 0
        self.peak_memory_bytes = 0
        self.spooled_total = 0  # messages that went through the spool file
        self._spool = _Spool()
        self._drop_before = 0  # spooled messages before this index were discarded
        self._stop = threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="agent-tools-iopub", daemon=True)
        self.received = 0

    def start(self) -> None:
        self._thread.start()

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._memory) + self._spool.count

    def pop(self) -> list[bytes] | None:
        """The next message's frames, or None when nothing is in memory yet."""
        with self._lock:
            if not self._memory:
                return None
            frames = self._memory.popleft()
            self.memory_bytes -= sum(len(f) for f in frames)
            return frames

    def discard(self) -> int:
        """Drop every queued message without decoding it; return how many (the spooled ones are dropped
        by the reader thread, which alone touches the spool)."""
        with self._lock:
            dropped = len(self._memory) + self._spool.count
            self._memory.clear()
            self.memory_bytes = 0
            self._drop_before = self._spool.pushed
            return dropped

    def _fits(self, size: int) -> bool:
        return not self._memory or self.memory_bytes + size <= self.budget

    def _keep(self, frames: list[bytes]) -> None:
        wake = not self._memory
        self._memory.append(frames)
        self.memory_bytes += sum(len(f) for f in frames)
        self.peak_memory_bytes = max(self.peak_memory_bytes, self.memory_bytes)
        if wake:
            self._notify()

    def _refill(self) -> bool:
        """Move spooled messages back into memory while they fit (file reads outside the lock, so the
        event loop never waits for the disk); whether some are left."""
        spool = self._spool
        while spool.count:
            if spool.popped < self._drop_before:
                spool.pop()
                continue
            size = spool.next_size()
            with self._lock:
                if not self._fits(size):
                    return True
            frames = spool.pop()  # memory only shrank meanwhile: it still fits
            with self._lock:
                if spool.popped > self._drop_before:  # not discarded meanwhile
                    self._keep(frames)
        return False

    def _run(self) -> None:
        socket = self._socket
        try:
            while not self._stop.is_set():
                waiting = self._refill()
                try:
                    frames = socket.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    socket.poll(REFILL_POLL_MS if waiting else POLL_MS)
                    continue
                self.received += 1
                with self._lock:  # only this thread changes the spool: its count is stable here
                    in_memory = not self._spool.count and self._fits(sum(len(f) for f in frames))
                    if in_memory:
                        self._keep(frames)
                if not in_memory:
                    self._spool.push(frames)
                    self.spooled_total += 1
        except BaseException as e:  # a failed spool write: tell the consumer
            if not self._stop.is_set():
                log.warning("iopub reader stopped: %s", e)
                self.error = e
                self._notify()
        finally:
            with contextlib.suppress(Exception):
                socket.close(linger=0)

    def close(self) -> None:
        """Stop and join the thread, close its socket and remove the spool."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        elif not self._thread.ident:  # never started: the socket is still ours
            with contextlib.suppress(Exception):
                self._socket.close(linger=0)
        with self._lock:
            self._memory.clear()
            self.memory_bytes = 0
            self._spool.close()


class MessageQueue:
    """The connection's message queue: decoded shell/stdin messages and events put by the event loop,
    then iopub messages decoded from the reader's frames only when taken (so an unread flood stays raw
    and bounded). Shell/stdin messages and events go first; iopub keeps its own order."""

    def __init__(self, decode: Callable[[list[bytes]], dict[str, Any]]) -> None:
        self._decode = decode
        self._items: deque[dict[str, Any]] = deque()
        self._ready = asyncio.Event()
        self.reader: IopubReader | None = None
        self._failed = False

    def put_nowait(self, item: dict[str, Any]) -> None:
        self._items.append(item)
        self._ready.set()

    def wake(self) -> None:
        """Frames arrived (or the reader failed); on the event loop's thread."""
        self._ready.set()

    def qsize(self) -> int:
        return len(self._items) + (self.reader.pending if self.reader is not None else 0)

    def get_nowait(self) -> dict[str, Any]:
        if self._items:
            return self._items.popleft()
        reader = self.reader
        if reader is not None:
            while (frames := reader.pop()) is not None:
                try:
                    msg = self._decode(frames)
                except Exception as e:  # a malformed or wrongly signed message: skip it, as jupyter_client
                    log.warning("dropping an undecodable iopub message: %s", e)
                    continue
                msg["channel"] = "iopub"
                return msg
            if reader.error is not None and not self._failed:
                self._failed = True
                reason = f"iopub reader: {reader.error}"
                return {"channel": "event", "event": "disconnected", "reason": reason}
        raise asyncio.QueueEmpty

    async def get(self) -> dict[str, Any]:
        while True:
            try:
                return self.get_nowait()
            except asyncio.QueueEmpty:
                self._ready.clear()
            await self._ready.wait()

    def discard(self) -> int:
        dropped = len(self._items)
        self._items.clear()
        if self.reader is not None:
            dropped += self.reader.discard()
        return dropped

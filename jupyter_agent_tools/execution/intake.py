"""A kernel's iopub, drained by a thread of its own into memory and past that into a spill file.

A kernel's iopub is a ZMQ PUB socket: it never waits for a subscriber, and drops what the subscriber's
pipe cannot take (past the high-water marks of both ends and what the sockets buffer). A reader on the
server's event loop falls behind whenever the loop does (a loaded machine, a busy server), and what it
did not take in time was lost (issue 42). Letting ZMQ receive without a limit does not help either: ZMQ
then holds whatever the loop has not read yet, without bound (a display flood grew the server by 114 MB).

So :class:`IopubIntake` receives in a thread that does nothing else (it waits in ``zmq_poll`` and copies
the frames, without the event loop), keeps the raw frames in memory while the connection's byte budget
has room, and writes the rest to a :class:`Spill` file on disk. The event loop takes them back in order
as the executor makes room (:meth:`IopubIntake.take`), decoding each there. ZMQ's own receive limit stays
small: the thread keeps up. Only past the spill file's limit (or when the disk refuses a write) are
messages dropped, counted and logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import struct
import tempfile
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

import zmq

log = logging.getLogger(__name__)


class Spill:
    """Raw messages (their frames, undecoded) in a file, first in, first out, at most ``max_bytes`` of
    frames at a time (the file is emptied each time the last one is taken back).

    The file is made on the first push, in a directory of its own created private (``0700``); its name
    is removed at once (the open descriptor keeps it, and a crashed server leaves no output behind), and
    the directory on :meth:`close`.
    """

    def __init__(self, max_bytes: int, parent: str | None = None) -> None:
        self.max_bytes = max_bytes
        self.parent = parent
        self.bytes = 0
        self.directory: str | None = None
        self._fd: int | None = None
        # (offset in the file, bytes there, bytes of its frames)
        self._records: deque[tuple[int, int, int]] = deque()
        self._end = 0

    def __len__(self) -> int:
        return len(self._records)

    def room(self, size: int) -> bool:
        return self.bytes + size <= self.max_bytes

    @property
    def next_size(self) -> int:
        return self._records[0][2]

    def _open(self) -> int:
        if self._fd is None:
            if self.directory is None:
                self.directory = tempfile.mkdtemp(prefix="jupyter-agent-iopub-", dir=self.parent)
            path = os.path.join(self.directory, "messages")
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600)
            with contextlib.suppress(OSError):  # where a name cannot go while open (Windows) it goes at close
                os.unlink(path)
            self._fd = fd
        return self._fd

    def push(self, frames: list[bytes], size: int) -> None:
        fd, offset = self._open(), self._end
        header = struct.pack(f"<I{len(frames)}Q", len(frames), *map(len, frames))
        length = len(header) + size
        _write_all(fd, [header, *frames], offset)  # one system call for the message (the thread keeps up)
        self._end += length
        self._records.append((offset, length, size))
        self.bytes += size

    def pop(self) -> list[bytes]:
        assert self._fd is not None
        offset, length, size = self._records.popleft()
        self.bytes -= size
        try:
            record = memoryview(_read_all(self._fd, length, offset))
            (count,) = struct.unpack_from("<I", record)
            lengths = struct.unpack_from(f"<{count}Q", record, 4)
            position, frames = 4 + 8 * count, []
            for part in lengths:
                frames.append(bytes(record[position : position + part]))
                position += part
            if position != length:
                raise OSError("the iopub spill file holds a damaged message")
        finally:
            if not self._records:
                self.clear()
        return frames

    def clear(self) -> int:
        """Forget every message held (the file keeps its descriptor, emptied); return how many."""
        count = len(self._records)
        self._records.clear()
        self.bytes = self._end = 0
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, 0)
        return count

    def close(self) -> None:
        self.clear()
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)
        if self.directory is not None:
            directory, self.directory = self.directory, None
            shutil.rmtree(directory, ignore_errors=True)


def _write_all(fd: int, parts: list[bytes], offset: int) -> None:
    views = [memoryview(p) for p in parts if p]
    vectored = hasattr(os, "pwritev")  # not on Windows, nor macOS before 11: a write per part there
    while views:
        written = os.pwritev(fd, views, offset) if vectored else os.pwrite(fd, views[0], offset)
        offset += written
        while views and written >= len(views[0]):
            written -= len(views.pop(0))
        if written:
            views[0] = views[0][written:]


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


class _Wake:
    """A descriptor ``zmq_poll`` can wait on next to a socket, to stop the intake's thread at once."""

    def __init__(self) -> None:
        if hasattr(os, "eventfd"):  # Linux: one descriptor
            self.read_fd = self.write_fd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        else:
            self.read_fd, self.write_fd = os.pipe()

    def set(self) -> None:
        with contextlib.suppress(OSError):
            os.write(self.write_fd, (1).to_bytes(8, "little"))

    def close(self) -> None:
        for fd in {self.read_fd, self.write_fd}:
            with contextlib.suppress(OSError):
                os.close(fd)


class IopubIntake:
    """Receives a kernel's iopub in a thread and holds what the event loop has not taken yet.

    ``socket`` is used by the thread alone from :meth:`start` until :meth:`stop` has returned. Raw
    messages are kept in memory while ``held_elsewhere() + bytes in memory + size <= budget`` (budget 0:
    always; a message always fits when nothing at all is held), in the spill file past that, and once a
    message is spilled every later one follows it there until the file is empty again (the order is
    kept). Past the spill's ``spill_bytes``, messages are dropped (``dropped`` counts them), and so is
    every later one until what was held has been taken: one gap, not many.
    """

    def __init__(
        self,
        socket: zmq.Socket[Any],
        *,
        budget: int,
        spill_bytes: int,
        held_elsewhere: Any = None,
        spill_parent: str | None = None,
        on_arrival: Callable[[], None],
        name: str = "iopub",
    ) -> None:
        self.socket = socket
        self.budget = budget
        self.held_elsewhere = held_elsewhere or (lambda: (0, 0))  # (bytes, messages) decoded ahead of us
        self.spill = Spill(spill_bytes, spill_parent)
        self.memory: deque[tuple[list[bytes], int]] = deque()
        self.memory_bytes = 0
        self.dropped = 0
        self.error: str | None = None  # why the thread stopped receiving (None: it did not)
        # Called on the loop when messages came: it takes what is held, then :meth:`rearm` (one call at
        # a time: the thread calls again only once re-armed).
        self.on_arrival = on_arrival
        self._dropping = False
        self._notified = False
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: _Wake | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._wake = _Wake()
        try:
            self._thread.start()
        except BaseException:
            self._wake.close()
            self._wake = None
            raise

    async def stop(self) -> None:
        """Stop the thread (the socket is then free for its owner to close) and remove the spill."""
        try:
            if self._wake is not None:
                self._wake.set()
                while self._thread.is_alive():  # it leaves zmq_poll at once (or a spill write)
                    await asyncio.sleep(0.001)
        finally:
            if self._wake is not None:
                self._thread.join()  # only if cancelled above: the thread is on its way out
                self._wake.close()
                self._wake = None
            with self._lock:
                self.memory.clear()
                self.memory_bytes = 0
                self.spill.close()

    # -- the event loop's side

    def next_size(self) -> int | None:
        """Bytes of the oldest message held, None when none is."""
        with self._lock:
            if self.memory:
                return self.memory[0][1]
            return self.spill.next_size if self.spill else None

    def take(self) -> list[bytes]:
        """The oldest message held, its frames (OSError: the spill file could not be read back)."""
        with self._lock:
            if self.memory:
                frames, size = self.memory.popleft()
                self.memory_bytes -= size
                return frames
            try:
                return self.spill.pop()
            except Exception:
                # broad: any failure reading back (OS error, a damaged record) drops the rest of the spill;
                # re-raised
                self.spill.clear()  # what follows it cannot be trusted either
                raise

    def discard(self) -> int:
        """Forget every message held (left over from earlier executions); return how many."""
        with self._lock:
            count = len(self.memory) + self.spill.clear()
            self.memory.clear()
            self.memory_bytes = 0
            self._dropping = False
            return count

    def rearm(self) -> bool:
        """For ``on_arrival``: True when nothing is held (the thread calls again with the next message),
        False when something came meanwhile (to take now)."""
        with self._lock:
            if self.memory or self.spill or self.error is not None:
                return False
            self._notified = False
            return True

    def __len__(self) -> int:
        """Messages held (in memory and spilled)."""
        return len(self.memory) + len(self.spill)

    # -- the thread's side

    def _run(self) -> None:
        assert self._wake is not None
        socket, wake = self.socket, self._wake.read_fd
        poller = zmq.Poller()
        poller.register(socket, zmq.POLLIN)
        poller.register(wake, zmq.POLLIN)
        try:
            while True:
                ready = dict(poller.poll())
                if wake in ready:
                    return
                while True:  # what ZMQ has received, before waiting again
                    try:
                        frames = socket.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    self._hold(frames)
                self._notify()
        except Exception as e:
            # broad: the socket is gone (its context terminated, a failed receive): the error ends the intake
            self.error = f"iopub channel: {e}"
            self._notify()

    def _hold(self, frames: list[bytes]) -> None:
        size = sum(map(len, frames))
        with self._lock:
            if self._dropping and (self.memory or self.spill):
                self.dropped += 1
                return
            self._dropping = False
            if not self.spill and self._fits(size):
                self.memory.append((frames, size))
                self.memory_bytes += size
                return
            if self.spill.room(size):
                try:
                    self.spill.push(frames, size)
                    return
                except OSError:  # no room on the disk: as past the spill's limit
                    log.warning("could not spill an iopub message", exc_info=True)
            self.dropped += 1
            self._dropping = True
        log.warning(
            "iopub messages dropped: more than the connection holds in memory and in its spill file "
            "(KernelService.iopub_buffer_bytes, iopub_spill_bytes) waits for a reader"
        )

    def _fits(self, size: int) -> bool:
        if not self.budget:
            return True
        held, count = self.held_elsewhere()
        if not self.memory and not count:
            return True
        return bool(held + self.memory_bytes + size <= self.budget)

    def _notify(self) -> None:
        with self._lock:
            if self._notified:
                return
            self._notified = True
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody takes them any more
                loop.call_soon_threadsafe(self.on_arrival)

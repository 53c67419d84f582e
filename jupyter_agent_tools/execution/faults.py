"""What went wrong starting a kernel: descriptor exhaustion (EMFILE/ENFILE), HTTP 5xx from a gateway.

Classification only; what to do about it is the recovery policy's (:mod:`.recovery`).
"""

from __future__ import annotations

import errno
import os
import re
import resource
from collections.abc import Iterator
from dataclasses import dataclass

FD_ERRNOS = (errno.EMFILE, errno.ENFILE)
FD_MESSAGES = ("too many open files", "emfile", "enfile")


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    stack = [exc]
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        for linked in (current.__cause__, current.__context__):
            if linked is not None:
                stack.append(linked)


def is_fd_exhaustion(exc: BaseException) -> bool:
    """Whether ``exc`` (or anything in its cause/context chain) means "out of file descriptors".

    ``start_kernel`` raises a plain ``OSError`` with errno 24 (EMFILE) or 23 (ENFILE); starting client
    channels raises ``zmq.error.ZMQError`` with that errno, which is not an ``OSError``; wrappers may only
    keep the text.
    """
    for item in _chain(exc):
        if getattr(item, "errno", None) in FD_ERRNOS:
            return True
        text = str(item).lower()
        if any(marker in text for marker in FD_MESSAGES):
            return True
    return False


class KernelPortTaken(RuntimeError):
    """A local kernel that had not answered yet lost one of its TCP ports to another process (seen in
    ``/proc``, :mod:`.ports`): it cannot bind it, and ipykernel then hangs instead of exiting."""


def died_at_start(exc: BaseException) -> bool:
    """A local kernel that exited before it answered its first request (jupyter_client's message), or
    lost a port before it did (:class:`KernelPortTaken`). Most often it lost its ports: jupyter_client picks
    free TCP ports, and another process may bind one before the kernel does (``Address already in use`` in
    the kernel's log), which a second start does not meet."""
    return any(
        isinstance(item, KernelPortTaken)
        or (isinstance(item, RuntimeError) and "died before replying" in str(item))
        for item in _chain(exc)
    )


def is_kernel_cap(exc: BaseException) -> bool:
    """Whether a gateway refused a kernel because a kernel limit is reached: Enterprise Gateway answers
    403 "A max kernels per user limit has been set to N ..." (``EG_MAX_KERNELS_PER_USER``), "A max kernels
    limit ..." or "Resource Limit" (``EG_MAX_KERNELS``)."""
    if http_status(exc) != 403:
        return False
    text = " ".join(str(item) for item in _chain(exc)) + " " + http_message(exc)
    return bool(re.search(r"max kernels|resource limit", text, re.IGNORECASE))


def http_status(exc: BaseException) -> int | None:
    """The HTTP status of a gateway failure (``tornado.web.HTTPError`` or an HTTP client error)."""
    for item in _chain(exc):
        for attr in ("status_code", "code"):
            value = getattr(item, attr, None)
            if isinstance(value, int) and 100 <= value <= 599:
                return value
    return None


def http_message(exc: BaseException) -> str:
    """The most informative message of an HTTP failure."""
    for item in _chain(exc):
        message = getattr(item, "log_message", None) or getattr(item, "message", None)
        if isinstance(message, str) and message:
            return message
    return str(exc) or type(exc).__name__


@dataclass(frozen=True)
class FdUsage:
    """Open descriptors of this process and its soft limit."""

    open: int
    limit: int

    @property
    def headroom(self) -> int:
        return self.limit - self.open

    def describe(self) -> str:
        return f"{self.open} of {self.limit} file descriptors open (RLIMIT_NOFILE soft limit)"


def fd_usage() -> FdUsage | None:
    """How many descriptors this process has open, and its limit (None where that cannot be read)."""
    try:
        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        count = len(os.listdir("/proc/self/fd" if os.path.isdir("/proc/self/fd") else "/dev/fd"))
    except (OSError, ValueError):
        return None
    if soft == resource.RLIM_INFINITY:
        return None
    return FdUsage(open=count, limit=int(soft))


def check_fd_headroom(minimum: int) -> None:
    """Raise ``OSError(EMFILE)`` before spawning a kernel when fewer than ``minimum`` descriptors are free.

    libzmq can abort the process instead of raising when it runs out of descriptors, so running out must
    be prevented, not only caught.
    """
    if minimum <= 0:
        return
    usage = fd_usage()
    if usage is not None and usage.headroom < minimum:
        raise OSError(
            errno.EMFILE,
            f"Too many open files: {usage.describe()}, fewer than the {minimum} a kernel start needs",
        )

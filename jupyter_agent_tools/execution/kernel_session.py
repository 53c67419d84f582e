"""One eval session: its kernel, its queue of calls, and every state transition of both, in one place.

The state is that of the session's kernel::

    NEW ──start──▶ STARTING ──started──▶ READY ──found dead──▶ DEAD ──start──▶ STARTING
                      │ failed             │ replace / reset
                      ▼                    ▼
                     NEW                STARTING                 any ──close──▶ CLOSED (final)

(``STARTING`` falls back to ``DEAD`` instead of ``NEW`` when the session had a kernel before; ``READY``
goes back to ``NEW`` when a call gave its kernel up and already told its caller.)
Calls take turns in arrival order; the call whose turn it is holds the session (``busy``) until it ends.
Only this class changes a session's state; the manager, the service and the recovery policy call its
methods.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from ..audit.context import display_name
from .connection import KernelConnection
from .kernel_service import KernelService, close_quietly

log = logging.getLogger(__name__)


class SessionState(str, Enum):
    """Where a session's kernel is in its life."""

    NEW = "new"  # no kernel yet
    STARTING = "starting"  # a kernel is being started (and connected)
    READY = "ready"  # a kernel runs and is connected
    DEAD = "dead"  # the kernel was lost and cleaned up; the next call starts a new one and says so
    CLOSED = "closed"  # shut down for good


TRANSITIONS: dict[SessionState, frozenset[SessionState]] = {
    SessionState.NEW: frozenset({SessionState.STARTING, SessionState.CLOSED}),
    SessionState.STARTING: frozenset(
        {SessionState.READY, SessionState.NEW, SessionState.DEAD, SessionState.CLOSED}
    ),
    SessionState.READY: frozenset(
        {SessionState.STARTING, SessionState.DEAD, SessionState.NEW, SessionState.CLOSED}
    ),
    SessionState.DEAD: frozenset({SessionState.STARTING, SessionState.CLOSED}),
    SessionState.CLOSED: frozenset(),
}


class InvalidTransition(RuntimeError):
    """A state change the session's life does not allow (a bug in the caller)."""


@dataclass(frozen=True)
class InitSpec:
    """What the init step put into a kernel: working directory, environment, session file."""

    cwd: str
    env: tuple[tuple[str, str], ...]
    session_file: str | None


Launch = Callable[[], Awaitable[tuple[str, KernelConnection]]]


class KernelSession:
    """A named (or per-call) session and the one kernel it owns."""

    def __init__(self, name: str, kernels: KernelService, mode: str = "session", key: str | None = None):
        self.name = name  # as callers name it (a named session's name is its owner's, see .sessions)
        self.key = key or name  # unique among all sessions: the manager's key, the artifact directory
        self.mode = mode
        self.kernels = kernels
        self.state = SessionState.NEW
        self.kernel_name: str | None = None
        self.kernel_id: str | None = None
        self.owns_kernel = True  # False for a notebook's own kernel: closing only disconnects
        self.notebook: str | None = None  # the notebook path a "notebook" session runs
        self.owner: str | None = None  # the username that created the session (None: unknown)
        self.cwd: str | None = None  # the working directory of its last call, relative to the server root
        self.last_output_at: float | None = None  # when a call last produced output
        # A notice of a call whose caller had gone (cancelled): the next call hears it too.
        self.undelivered_notice: str | None = None
        # Why an earlier session of this name went (EvalSessionManager.gone), told to this one's first call.
        self.predecessor_gone: dict[str, Any] | None = None
        self.connection: KernelConnection | None = None
        self.init: InitSpec | None = None
        # The init step's notice when its cwd does not exist in the kernel (a remote one): told each call.
        self.cwd_notice: str | None = None
        self.start_seconds: float | None = None  # the running call's kernel start(s), not in its timeout
        self.created = self.last_used = time.time()
        self.restarts = 0
        self.executions = 0
        self.execution_count: int | None = None  # the kernel's, from its last execute_reply seen here
        self.recoveries: Counter[str] = Counter()
        self.cancel: asyncio.Event | None = None  # the running call's; set means "stop it"
        self.busy_since: float | None = None  # when the running call took its turn
        # The cell the running call runs: {"index", "cell_id", "of"} (cell_id: a notebook run's; of: an
        # eval's cell count); None between cells' calls.
        self.running_cell: dict[str, Any] | None = None
        self.waiting = 0
        # Told each step of a call (call_queued, call_started, cell_started, call_ended): session events.
        self.on_turn: Callable[[KernelSession, str], None] | None = None
        self._turns = asyncio.Lock()  # wakes waiters first-in first-out

    # -- state -----------------------------------------------------------------------------------

    def _to(self, state: SessionState) -> None:
        if state not in TRANSITIONS[self.state]:
            raise InvalidTransition(f"session {self.name!r}: {self.state.value} -> {state.value}")
        self.state = state

    @property
    def closed(self) -> bool:
        return self.state is SessionState.CLOSED

    @property
    def busy(self) -> bool:
        """A call holds the session."""
        return self.cancel is not None

    @property
    def idle(self) -> bool:
        """Nobody holds or waits for the session: it may be evicted, swept or released."""
        return not self.busy and self.waiting == 0 and not self._turns.locked() and not self.closed

    # -- calls take turns ----------------------------------------------------------------------------

    async def take_turn(self, cancel: asyncio.Event) -> bool:
        """Wait for this call's turn (FIFO) and hold the session; False if the caller cancelled first.

        A session closed while the call waited is still returned held: the caller releases it with
        :meth:`end_turn` and moves on to the session's successor.
        """
        self.waiting += 1
        try:
            if self._turns.locked():
                self._tell("call_queued")
            acquired = await self._acquire(cancel)
        finally:
            self.waiting -= 1
        if acquired:
            self.cancel = cancel
            self.busy_since = time.time()
            self._tell("call_started")
        return acquired

    def cell_started(self, index: int, cell_id: str | None, of: int | None = None) -> None:
        """The running call starts a cell: its index in the request (eval) or the notebook (a run)."""
        self.running_cell = {"index": index, "cell_id": cell_id, "of": of}
        self._tell("cell_started")

    def _tell(self, step: str) -> None:
        if self.on_turn is not None:
            self.on_turn(self, step)

    async def _acquire(self, cancel: asyncio.Event) -> bool:
        if not self._turns.locked():
            await self._turns.acquire()
            return True
        acquire = asyncio.ensure_future(self._turns.acquire())
        cancelled = asyncio.ensure_future(cancel.wait())
        try:
            await asyncio.wait({acquire, cancelled}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            cancelled.cancel()
        if acquire.done() and not acquire.cancelled():
            if cancel.is_set():
                self._turns.release()
                return False
            return True
        acquire.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await acquire
        if acquire.done() and not acquire.cancelled():
            self._turns.release()
        return False

    async def end_turn(self) -> None:
        """The call is over: release the session to the next caller.

        A session closed during the call (deleted, evicted) gives up any kernel started meanwhile.
        """
        self.cancel = self.busy_since = self.running_cell = None
        self.last_used = time.time()
        self._tell("call_ended")
        try:
            if self.closed:
                await self._stop_kernel()
        finally:
            self._turns.release()

    # -- the kernel ------------------------------------------------------------------------------

    async def start_kernel(self, kernel_name: str, launch: Launch, *, owned: bool = True) -> None:
        """Start a kernel with ``launch`` in place of the current one (if any); READY once connected.

        ``owned=False``: ``launch`` connects to a kernel someone else owns (a notebook's kernel from
        jupyter_server's sessions); the session never shuts it down, only disconnects.
        """
        had_kernel = self.state is not SessionState.NEW
        self._to(SessionState.STARTING)
        await self._stop_kernel()
        try:
            kernel_id, connection = await launch()
        except BaseException:
            if not self.closed:
                self._to(SessionState.DEAD if had_kernel else SessionState.NEW)
            raise
        self.kernel_id, self.kernel_name, self.connection = kernel_id, kernel_name, connection
        self.owns_kernel = owned
        if self.closed:  # closed while the kernel started: nothing may outlive the session
            await self._stop_kernel()
            return
        self._to(SessionState.READY)

    async def reconnect(self) -> None:
        """A new connection to the same kernel (its manager restarted it on new ports); init re-runs."""
        assert self.state is SessionState.READY and self.kernel_id is not None
        connection, self.connection = self.connection, None
        await close_quietly(connection)
        self.init = self.cwd_notice = None
        self.connection = await self.kernels.connect(self.kernel_id)

    async def mark_dead(self) -> None:
        """The kernel is lost: shut down what is left of it; the next call starts a new one."""
        if self.state is SessionState.READY:
            self._to(SessionState.DEAD)
            await self._stop_kernel()

    async def drop_kernel(self) -> None:
        """Stop the kernel after a call gave up on it and said so: the next call starts a fresh one
        without another notice."""
        if self.state is SessionState.READY:
            self._to(SessionState.NEW)
            await self._stop_kernel()

    async def close(self) -> None:
        """Shut the session down for good: its running call is cancelled and its kernel stopped."""
        if self.closed:
            return
        self._to(SessionState.CLOSED)
        if self.cancel is not None:
            self.cancel.set()
        await self._stop_kernel()

    async def _stop_kernel(self) -> None:
        connection, kernel_id = self.connection, self.kernel_id
        self.connection, self.kernel_id, self.init, self.cwd_notice = None, None, None, None
        await close_quietly(connection)
        if kernel_id and self.owns_kernel:
            await self.kernels.shutdown(kernel_id)

    # -- reporting -------------------------------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kernel_id": self.kernel_id,
            "kernel_name": self.kernel_name,
            "mode": self.mode,
            "notebook": self.notebook,
            "state": self.state.value,
            "created": _iso(self.created),
            "last_used": _iso(self.last_used),
            "busy": self.busy,
            "busy_since": None if self.busy_since is None else _iso(self.busy_since),
            "running_cell": self.running_cell,
            "queue_depth": self.waiting,
            "restarts": self.restarts,
            "executions": self.executions,
            "recoveries": dict(self.recoveries),
            "owner": display_name(self.owner),
            "cwd": self.cwd,
            "last_output_at": None if self.last_output_at is None else _iso(self.last_output_at),
        }


def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts)) + f".{int(ts % 1 * 1000):03d}Z"

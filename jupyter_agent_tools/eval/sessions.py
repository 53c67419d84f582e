"""Named kernel sessions: LRU with a cap, idle/dead sweep, a FIFO queue per session.

A session owns at most one kernel of the server's kernel manager and a connection to it. Requests on
one session run one at a time, in arrival order (``asyncio.Lock`` wakes waiters first-in first-out).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Any
from uuid import uuid4

from ..artifacts import ArtifactStore
from ..errors import Unavailable
from .connection import KernelConnection
from .kernels import KernelService, close_quietly

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class InitSpec:
    """What the init step put into a kernel: working directory, environment, session file."""

    cwd: str
    env: tuple[tuple[str, str], ...]
    session_file: str | None


@dataclass
class KernelSession:
    """One named session and its kernel."""

    name: str
    mode: str = "session"
    kernel_name: str | None = None
    kernel_id: str | None = None
    connection: KernelConnection | None = None
    init: InitSpec | None = None
    created: float = field(default_factory=time.time)
    last_used: float = field(default_factory=time.time)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    waiting: int = 0
    busy: bool = False
    restarts: int = 0
    executions: int = 0
    recoveries: Counter[str] = field(default_factory=Counter)
    cancel: asyncio.Event | None = None
    closed: bool = False
    lost_kernel: bool = False  # its kernel died while idle and was cleaned up; the next run restarts it

    @property
    def idle(self) -> bool:
        return not self.busy and self.waiting == 0 and not self.lock.locked()

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kernel_id": self.kernel_id,
            "kernel_name": self.kernel_name,
            "mode": self.mode,
            "created": _iso(self.created),
            "last_used": _iso(self.last_used),
            "busy": self.busy,
            "queue_depth": self.waiting,
            "restarts": self.restarts,
            "executions": self.executions,
            "recoveries": dict(self.recoveries),
        }


def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts)) + f".{int(ts % 1 * 1000):03d}Z"


class SessionManager:
    """Keeps the named sessions, evicts and sweeps them, and shuts their kernels down."""

    def __init__(
        self,
        kernels: KernelService,
        artifacts: ArtifactStore,
        *,
        max_sessions: int = 4,
        idle_timeout: float = 300.0,
        cleanup_interval: float = 30.0,
        heartbeat_interval: float = 5.0,
        log: logging.Logger | None = None,
    ):
        self.kernels = kernels
        self.artifacts = artifacts
        self.max_sessions = max_sessions
        self.idle_timeout = idle_timeout
        self.cleanup_interval = cleanup_interval
        self.heartbeat_interval = heartbeat_interval
        self.log = log or logging.getLogger(__name__)
        self.sessions: OrderedDict[str, KernelSession] = OrderedDict()
        self.totals: Counter[str] = Counter()
        self.per_call: dict[str, KernelSession] = {}
        self._closing = 0  # sessions unlisted whose kernels are still shutting down
        self._slot_freed = asyncio.Condition()
        self._sweeper: asyncio.Task[None] | None = None
        self._heartbeat: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start the periodic sweep and heartbeat (needs a running event loop)."""
        if self._sweeper is None and self.cleanup_interval > 0:
            self._sweeper = asyncio.ensure_future(self._sweep_forever())
        if self._heartbeat is None and self.heartbeat_interval > 0:
            self._heartbeat = asyncio.ensure_future(self._heartbeat_forever())

    def get(self, name: str) -> KernelSession | None:
        return self.sessions.get(name)

    def describe_all(self) -> list[dict[str, Any]]:
        return [s.describe() for s in (*self.sessions.values(), *self.per_call.values())]

    def record(self, session: KernelSession, kind: str, message: str, *args: Any) -> None:
        """Count a recovery or cleanup on the session and log it once at warning level."""
        session.recoveries[kind] += 1
        self.totals[kind] += 1
        self.log.warning("agent session %r (kernel %s): " + message, session.name, session.kernel_id, *args)

    async def acquire(self, name: str) -> KernelSession:
        """The session called ``name``, created if needed (evicting the least recently used idle one).

        A session being shut down still counts against ``max_sessions`` until its kernel is gone, so
        evictions never let more than ``max_sessions`` kernels live at once.
        """
        self.start()
        while True:
            session = self.sessions.get(name)
            if session is not None:
                self.sessions.move_to_end(name)
                return session
            if len(self.sessions) + self._closing < self.max_sessions:
                session = KernelSession(name=name)
                self.sessions[name] = session
                return session
            victim = next((s for s in self.sessions.values() if s.idle), None)
            if victim is not None:
                del self.sessions[victim.name]
                self.record(
                    victim, "evictions", "evicted (least recently used, max_sessions=%d)", self.max_sessions
                )
                await self.close_session(victim)
            elif self._closing:
                async with self._slot_freed:
                    await self._slot_freed.wait()
            else:
                raise Unavailable(
                    f"All {self.max_sessions} agent sessions are busy; retry later, reuse a session, or "
                    "raise c.AgentToolsApp.max_sessions",
                    retry_after=5,
                )

    def discard_unstarted(self, session: KernelSession) -> None:
        """Drop a session whose first kernel never started, so a failed start holds no slot."""
        unstarted = session.kernel_id is None and session.executions == 0
        if unstarted and self.sessions.get(session.name) is session:
            del self.sessions[session.name]
            session.closed = True  # requests queued on it take a successor

    def find(self, name: str) -> KernelSession | None:
        """A named or a running per-call session."""
        return self.sessions.get(name) or self.per_call.get(name)

    def open_per_call(self, cancel: asyncio.Event) -> KernelSession:
        """A new per-call session, listed (and deletable) while its call runs."""
        session = KernelSession(name=f"per-call-{uuid4().hex[:12]}", mode="per-call")
        session.busy, session.cancel = True, cancel
        self.per_call[session.name] = session
        return session

    async def close_per_call(self, session: KernelSession) -> None:
        """End a per-call session: its kernel goes; artifacts it spilled stay until their retention."""
        self.per_call.pop(session.name, None)
        session.closed = True
        await self.stop_kernel(session)
        self.artifacts.discard_if_empty(session.name)

    async def stop_kernel(self, session: KernelSession) -> None:
        """Close the session's connection and shut its kernel down (the session itself stays)."""
        conn, kernel_id = session.connection, session.kernel_id
        session.connection, session.kernel_id, session.init = None, None, None
        await close_quietly(conn)
        if kernel_id:
            await self.kernels.shutdown(kernel_id)

    async def close_session(self, session: KernelSession) -> None:
        """Shut a session down for good and remove its artifacts (the caller has unlisted it)."""
        session.closed = True
        if session.cancel is not None:
            session.cancel.set()
        self._closing += 1
        try:
            await self.stop_kernel(session)
            self.artifacts.remove_session(session.name)
        finally:
            self._closing -= 1
            async with self._slot_freed:
                self._slot_freed.notify_all()

    async def remove(self, name: str) -> KernelSession | None:
        session = self.sessions.pop(name, None)
        if session is not None:
            await self.close_session(session)
        return session

    async def sweep(self) -> None:
        """Shut down sessions whose kernel died and those idle longer than ``idle_timeout``."""
        now = time.time()
        for session in list(self.sessions.values()):
            if not session.idle:
                continue
            reason = None
            connection = session.connection
            if session.kernel_id is not None and connection is not None and not await connection.is_alive():
                reason = ("dead_sweeps", "kernel found dead by the sweep; session removed")
            if reason is None and self.idle_timeout > 0 and now - session.last_used > self.idle_timeout:
                reason = ("idle_shutdowns", "idle for %.0f s (idle_timeout=%.0f); session removed")
            if reason is None or not session.idle or self.sessions.get(session.name) is not session:
                continue
            del self.sessions[session.name]
            kind, message = reason
            if kind == "idle_shutdowns":
                self.record(session, kind, message, now - session.last_used, self.idle_timeout)
            else:
                self.record(session, kind, message)
            await self.close_session(session)
        self.artifacts.sweep(keep={*self.sessions, *self.per_call})

    async def heartbeat(self) -> None:
        """Check that each idle session's kernel is alive; clean up the kernels that died."""
        for session in list(self.sessions.values()):
            connection = session.connection
            if not session.idle or session.kernel_id is None or connection is None:
                continue
            if await connection.is_alive() or not session.idle or session.connection is not connection:
                continue
            self.record(
                session, "deaths", "kernel found dead by the heartbeat; it will be restarted on next use"
            )
            session.lost_kernel = True
            await self.stop_kernel(session)

    async def release_idle(self, exclude: KernelSession | None = None) -> list[str]:
        """Shut down every idle session with a kernel (but ``exclude``); return their names."""
        victims = [
            s for s in self.sessions.values() if s is not exclude and s.idle and s.kernel_id is not None
        ]
        for victim in victims:
            if self.sessions.get(victim.name) is victim:
                del self.sessions[victim.name]
        await asyncio.gather(*(self.close_session(v) for v in victims), return_exceptions=True)
        return [v.name for v in victims]

    async def _heartbeat_forever(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_interval)
            try:
                await self.heartbeat()
            except Exception:
                self.log.exception("agent session heartbeat failed")

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(self.cleanup_interval)
            try:
                await self.sweep()
            except Exception:
                self.log.exception("agent session sweep failed")

    async def shutdown(self) -> None:
        """Stop the sweep and heartbeat and shut down every session's kernel (server shutdown)."""
        for task in (self._sweeper, self._heartbeat):
            if task is not None:
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        self._sweeper = self._heartbeat = None
        sessions = list(self.sessions.values())
        self.sessions.clear()
        running = list(self.per_call.values())
        for session in running:
            if session.cancel is not None:
                session.cancel.set()
        await asyncio.gather(
            *(self.close_session(s) for s in sessions),
            *(self.close_per_call(s) for s in running),
            return_exceptions=True,
        )

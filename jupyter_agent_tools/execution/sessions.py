"""The registry of eval sessions: named ones (LRU with a cap) and running per-call ones.

The manager decides which sessions exist: it creates them, evicts the least recently used idle one at
the cap, sweeps idle and dead ones, checks idle kernels' heartbeat, and shuts everything down with the
server. A session belongs to its owner (who created it): to an agent, another's session does not exist
(404 on every route that names it, left out of the list), as a notebook's session does not unless its
notebook is inside the agent's paths (:func:`~..auth.context.may_see`). What happens to a session
itself (its kernel, its state) is the session's own business (:class:`~.session.KernelSession`): the
manager only calls its methods.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any
from uuid import uuid4

from traitlets import Float, Instance, Int, default, validate

from ..artifacts import ArtifactStore
from ..audit import NO_AUDIT, Audit, current_user, set_user
from ..audit import metrics as audit_metrics
from ..auth.context import may_see
from ..errors import RETRY_AFTER_BUSY_SESSIONS, NotFound, Unavailable
from ..traits import Service, at_least
from .kernels import KernelService
from .session import KernelSession

log = logging.getLogger(__name__)

# Named sessions that went (evicted, culled, deleted...) are remembered by name, at most this many, so
# that a later call naming one is told its state is gone instead of meeting a NameError unexplained.
GONE_REMEMBERED = 1000


def gone_record(reason: str, message: str) -> dict[str, Any]:
    """What a call naming a session that went is told: why (``reason``), when (``at``), in words."""
    at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return {"reason": reason, "at": at, "message": message}


class EvalSessionManager(Service):
    """Keeps the sessions, evicts and sweeps them, and shuts them down.

    Configured as ``c.EvalSessionManager.*``: a class named SessionManager would share its configuration
    section with jupyter_server's own session manager.

    The application builds the class named by ``AgentToolsApp.session_manager_class``.
    """

    kernels = Instance(KernelService, help="Starts, checks and shuts down the sessions' kernels.")
    artifacts = Instance(ArtifactStore, help="Where the sessions' spilled outputs live.")
    max_sessions = Int(
        4,
        help="Most named eval sessions (kernels) at once. A new session evicts the least recently used "
        "idle one; when all are busy the request answers 503 with Retry-After.",
    ).tag(config=True)
    idle_timeout = Float(
        300.0, help="Seconds a session may stay unused before the sweep shuts its kernel down (0: never)."
    ).tag(config=True)
    cleanup_interval = Float(
        30.0, help="Seconds between sweeps for idle and dead sessions and expired artifacts (0: no sweep)."
    ).tag(config=True)
    heartbeat_interval = Float(
        5.0,
        help="Seconds between liveness checks of each idle session's kernel; a dead kernel is cleaned up "
        "and restarted on the session's next call (0: no heartbeat).",
    ).tag(config=True)
    audit = Instance(Audit, help="Records lifecycle steps and recoveries (audit events and metrics).")

    @default("audit")
    def _default_audit(self) -> Audit:
        return NO_AUDIT

    @validate("max_sessions")
    def _valid_max_sessions(self, proposal: Any) -> int:
        return int(at_least(proposal, 1))

    @validate("idle_timeout", "cleanup_interval", "heartbeat_interval")
    def _valid_seconds(self, proposal: Any) -> float:
        return float(at_least(proposal, 0))

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self.sessions: OrderedDict[str, KernelSession] = OrderedDict()
        self.per_call: dict[str, KernelSession] = {}
        self.notebooks: dict[str, KernelSession] = {}  # by notebook path: connections to their kernels
        self.totals: Counter[str] = Counter()
        self.gone: OrderedDict[str, dict[str, Any]] = OrderedDict()  # see GONE_REMEMBERED
        self._gone_owners: dict[str, str | None] = {}  # whose the session that went was
        self._closing = 0  # sessions unlisted whose kernels are still shutting down
        self._slot_freed = asyncio.Condition()
        self._sweeper: asyncio.Task[None] | None = None
        self._heartbeat: asyncio.Task[None] | None = None
        audit_metrics.track(sessions=self, artifacts=self.artifacts)
        if self.artifacts is not None:
            self.artifacts.running_calls = self.running_calls
            self.artifacts.session_owner = self.owner_of
        self._ending: set[asyncio.Task[None]] = set()  # per-call kernels being shut down in the background
        # More upkeep at each sweep (the kernels notebook runs started: .notebook_kernels)
        self.sweepers: list[Callable[[], Awaitable[object]]] = []

    def start(self) -> None:
        """Start the periodic sweep and heartbeat (needs a running event loop)."""
        if self._sweeper is None and self.cleanup_interval > 0:
            self._sweeper = asyncio.ensure_future(self._every(self.cleanup_interval, self.sweep, "sweep"))
        if self._heartbeat is None and self.heartbeat_interval > 0:
            self._heartbeat = asyncio.ensure_future(
                self._every(self.heartbeat_interval, self.heartbeat, "heartbeat")
            )

    def get(self, name: str) -> KernelSession | None:
        return self.sessions.get(name)

    def find(self, name: str) -> KernelSession | None:
        """A named or a running per-call session the request being served may see."""
        session = self.sessions.get(name) or self.per_call.get(name)
        return session if session is not None and visible(session) else None

    def owner_of(self, name: str) -> tuple[str | None, str | None] | None:
        """(owner, notebook) of the session called ``name`` (its artifacts record them), or None. Safe
        from a worker thread (it reads snapshots of the registries)."""
        every = [*list(self.sessions.values()), *list(self.per_call.values()), *list(self.notebooks.values())]
        found = next((s for s in every if s.name == name), None)
        return None if found is None else (found.owner, found.notebook)

    def running_calls(self) -> dict[str, object]:
        """{name: the running call's cancel event} of the sessions a call holds: the artifacts' cap keeps
        what those calls wrote. Safe from a worker thread (it reads snapshots of the registries)."""
        every = [*list(self.sessions.values()), *list(self.per_call.values()), *list(self.notebooks.values())]
        return {s.name: s.cancel for s in every if s.cancel is not None}

    def kernels_of_others(self, user: str | None) -> set[str]:
        """Ids of the kernels of named and per-call sessions that ``user`` does not own."""
        every = (*self.sessions.values(), *self.per_call.values())
        return {s.kernel_id for s in every if s.kernel_id and (s.owner is None or s.owner != user)}

    def describe_all(self) -> list[dict[str, Any]]:
        """The sessions the request being served may see."""
        every = (*self.sessions.values(), *self.per_call.values(), *self.notebooks.values())
        return [s.describe() for s in every if visible(s)]

    def record(
        self, session: KernelSession, kind: str, message: str, *args: Any, audit: dict[str, Any] | None = None
    ) -> None:
        """Count a recovery or cleanup on the session, log it once at warning level and record it
        (:meth:`Audit.recorded`, with the ``audit`` fields)."""
        session.recoveries[kind] += 1
        self.totals[kind] += 1
        self.log.warning("agent session %r (kernel %s): " + message, session.name, session.kernel_id, *args)
        self.audit.recorded(session, kind, message % args if args else message, **(audit or {}))

    # -- named sessions ----------------------------------------------------------------------------

    async def acquire(self, name: str) -> KernelSession:
        """The session called ``name``, created if needed (evicting the least recently used idle one).

        A session being shut down still counts against ``max_sessions`` until its kernel is gone, so
        evictions never let more than ``max_sessions`` kernels live at once.
        """
        self.start()
        while True:
            session = self.sessions.get(name)
            if session is not None and not visible(session):
                raise NotFound(
                    f"Session {name!r} is not available to this agent (another user's session has that "
                    "name): choose another session name"
                )
            if session is not None:
                self.sessions.move_to_end(name)
                return session
            if len(self.sessions) + self._closing < self.max_sessions:
                session = KernelSession(name, self.kernels)
                session.owner = current_user()
                session.on_turn = self.audit.call
                went, owner = self.gone.pop(name, None), self._gone_owners.pop(name, None)
                # told only to whom the session that went belonged
                session.predecessor_gone = went if went is not None and may_see(owner) else None
                self.sessions[name] = session
                self.audit.session(session, "created")
                return session
            victim = next((s for s in self.sessions.values() if s.idle), None)
            if victim is not None:
                self.record(
                    victim,
                    "evictions",
                    "evicted (least recently used, max_sessions=%d)",
                    self.max_sessions,
                    audit={"idle_seconds": round(time.time() - victim.last_used, 3)},
                )
                gone = f"evicted to make room for session {name!r} (least recently used idle session; "
                gone += f"max_sessions={self.max_sessions})"
                await self._close(victim, gone_record("evicted", gone))
            elif self._closing:
                async with self._slot_freed:
                    await self._slot_freed.wait()
            else:
                raise Unavailable(
                    f"All {self.max_sessions} agent sessions are busy; retry later, reuse a session, or "
                    "raise c.EvalSessionManager.max_sessions",
                    retry_after=RETRY_AFTER_BUSY_SESSIONS,
                )

    async def discard_if_never_started(self, session: KernelSession) -> None:
        """Drop a session whose first kernel never started, so a failed start holds no slot."""
        never_started = session.kernel_id is None and session.executions == 0
        if never_started and self.sessions.get(session.name) is session:
            await self._close(session)

    async def remove(self, name: str) -> KernelSession | None:
        """Shut the named session ``name`` down (DELETE); None if there is none."""
        session = self.sessions.get(name)
        if session is not None:
            await self._close(session, gone_record("deleted", "deleted (DELETE /api/agent/sessions)"))
        return session

    async def _close(self, session: KernelSession, gone: dict[str, Any] | None = None) -> None:
        """Unlist a session, shut it down and remove its artifacts; it counts until its kernel is gone.

        ``gone`` (see :func:`gone_record`) is remembered for the next call that names the session."""
        if self.sessions.get(session.name) is session:
            del self.sessions[session.name]
            if gone is not None:
                self.gone[session.name] = gone
                self._gone_owners[session.name] = session.owner
                self.gone.move_to_end(session.name)
                while len(self.gone) > GONE_REMEMBERED:
                    self._gone_owners.pop(self.gone.popitem(last=False)[0], None)
        self._closing += 1
        try:
            await session.close()
            self.artifacts.remove_session(session.name)
        finally:
            self._closing -= 1
            async with self._slot_freed:
                self._slot_freed.notify_all()

    # -- per-call sessions ---------------------------------------------------------------------------

    def open_per_call(self) -> KernelSession:
        """A new per-call session, listed (and deletable) while its call runs."""
        session = KernelSession(f"per-call-{uuid4().hex[:12]}", self.kernels, mode="per-call")
        session.on_turn = self.audit.call
        session.owner = current_user()
        self.per_call[session.name] = session
        return session

    async def close_per_call(self, session: KernelSession, *, wait: bool = True) -> None:
        """End a per-call session: its kernel goes; artifacts it spilled stay until their retention.

        ``wait=False``: the kernel is shut down in the background (the call's answer does not wait for
        the process to exit); server shutdown waits for it.
        """
        self.per_call.pop(session.name, None)
        if wait:
            await self._shut_per_call(session)
        else:
            task = asyncio.ensure_future(self._shut_per_call(session))
            self._ending.add(task)
            task.add_done_callback(self._ending.discard)
        self.artifacts.discard_if_empty(session.name)  # the call is over: nothing writes there any more

    @property
    def per_call_ending(self) -> int:
        """Per-call kernels being shut down in the background."""
        return len(self._ending)

    async def _shut_per_call(self, session: KernelSession) -> None:
        try:
            await session.close()
        except Exception:
            self.log.warning("shutting down per-call kernel %s failed", session.kernel_id, exc_info=True)

    # -- notebook sessions --------------------------------------------------------------------------

    def for_notebook(self, path: str) -> KernelSession:
        """The session that runs ``path``'s cells in the notebook's own kernel (it never owns it).

        Its name (``nb-`` and a hash of the path) names its artifact directory; ``notebook`` is the path.
        """
        self.start()  # the sweep also shuts down kernels the runs started (see .notebook_kernels)
        session = self.notebooks.get(path)
        if session is None or session.closed:
            name = "nb-" + hashlib.sha256(path.encode("utf-8", "surrogatepass")).hexdigest()[:12]
            session = KernelSession(name, self.kernels, mode="notebook")
            session.notebook = path
            session.owner = current_user()
            session.on_turn = self.audit.call
            self.notebooks[path] = session
        return session

    # -- upkeep ------------------------------------------------------------------------------------

    async def sweep(self) -> None:
        """Shut down sessions whose kernel died and those idle longer than ``idle_timeout``; then run the
        other ``sweepers``."""
        now = time.time()
        for session in list(self.sessions.values()):
            if not session.idle:
                continue
            connection = session.connection
            args: tuple[float, ...] = ()
            if connection is not None and not await connection.is_alive():
                kind, message = "dead_sweeps", "kernel found dead by the sweep; session removed"
                gone = gone_record("dead", "removed after its kernel was found dead")
            elif self.idle_timeout > 0 and now - session.last_used > self.idle_timeout:
                kind, message = "idle_shutdowns", "idle for %.0f s (idle_timeout=%.0f); session removed"
                args = (now - session.last_used, self.idle_timeout)
                unused = f"shut down after {args[0]:.0f} s unused (idle_timeout={args[1]:.0f})"
                gone = gone_record("idle", unused)
            else:
                continue
            if session.idle and self.sessions.get(session.name) is session:
                idle = {"idle_seconds": round(now - session.last_used, 3)} if args else {}
                self.record(session, kind, message, *args, audit=idle)
                await self._close(session, gone)
        self.artifacts.sweep(
            keep={*self.sessions, *self.per_call, *(s.name for s in self.notebooks.values())}
        )
        for sweeper in list(self.sweepers):
            try:
                await sweeper()
            except Exception:
                self.log.exception("agent sweep step %r failed", sweeper)

    async def heartbeat(self) -> None:
        """Check that each idle session's kernel is alive; clean up the kernels that died."""
        for session in list(self.sessions.values()):
            connection = session.connection
            if not session.idle or connection is None:
                continue
            if await connection.is_alive() or not session.idle or session.connection is not connection:
                continue
            self.record(
                session, "deaths", "kernel found dead by the heartbeat; it will be restarted on next use"
            )
            await session.mark_dead()

    async def release_idle(self, exclude: KernelSession | None = None) -> list[str]:
        """Shut down every idle session with a kernel (but ``exclude``); return their names."""
        victims = [
            s for s in self.sessions.values() if s is not exclude and s.idle and s.kernel_id is not None
        ]
        gone = gone_record("released", "shut down to free file descriptors for another kernel (EMFILE)")
        await asyncio.gather(*(self._close(v, gone) for v in victims), return_exceptions=True)
        return [v.name for v in victims]

    async def _every(self, interval: float, work: Callable[[], Awaitable[Any]], what: str) -> None:
        """Run ``work`` every ``interval`` seconds until cancelled; a failure is logged, not fatal."""
        set_user(None)  # the server's own work, whichever request started the task
        while True:
            await asyncio.sleep(interval)
            try:
                await work()
            except Exception:
                self.log.exception("agent session %s failed", what)

    async def shutdown(self) -> None:
        """Stop the sweep and heartbeat and shut down every session's kernel (server shutdown)."""
        for task in (self._sweeper, self._heartbeat):
            if task is not None:
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        self._sweeper = self._heartbeat = None
        for session in self.sessions.values():
            self.audit.session(session, "shutdown")
        notebooks = list(self.notebooks.values())
        self.notebooks.clear()
        await asyncio.gather(
            *(self._close(s) for s in list(self.sessions.values())),
            *(self.close_per_call(s) for s in list(self.per_call.values())),
            *(s.close() for s in notebooks),  # disconnects; the notebooks' kernels are the server's
            *list(self._ending),
            return_exceptions=True,
        )


def visible(session: KernelSession) -> bool:
    """Whether the request being served may see ``session``: its owner, a notebook's session within the
    agent's paths, anyone not an agent."""
    return may_see(session.owner, session.notebook)


# The name the rest of the package imports (its configuration section is EvalSessionManager).
SessionManager = EvalSessionManager

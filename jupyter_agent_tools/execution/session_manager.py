"""The registry of eval sessions: named ones (LRU with a cap) and running per-call ones.

The manager decides which sessions exist: it creates them, evicts the least recently used idle one at
the cap, sweeps idle and dead ones, checks idle kernels' heartbeat, and shuts everything down with the
server. A session belongs to its owner (the acting identity that created it, :func:`~..audit.current_user`)
and session names are per owner: two identities naming ``default`` get two sessions, two kernels
(:func:`session_key`). An eval runs in the caller's own session of that name, always. To an agent,
another's session does not exist (404 on every route that names it, left out of the list), as a
notebook's session does not unless its notebook is inside the agent's paths
(:func:`~..auth.context.may_see`); anyone else (the person) also reaches another identity's session by
its name when no session of their own has it, or by naming its owner.

At the cap, a new session evicts an idle session (:meth:`_victim`): the caller's own, or another
identity's only while that identity holds more than its fair share (:meth:`fair_share`: ``max_sessions``
divided by the identities holding sessions, the caller included, at least 1). What
happens to a session itself (its kernel, its state) is the session's own business
(:class:`~.kernel_session.KernelSession`): the manager only calls its methods.
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
from ..audit.context import display_name
from ..auth.context import may_see
from ..errors import RETRY_AFTER_BUSY_SESSIONS, AgentToolsError, Conflict, Unavailable
from ..service import Service, at_least
from .kernel_service import KernelService
from .kernel_session import KernelSession

log = logging.getLogger(__name__)

# Named sessions that went (evicted, culled, deleted...) are remembered by name, at most this many, so
# that a later call naming one is told its state is gone instead of meeting a NameError unexplained.
GONE_REMEMBERED = 1000
# Seconds between heartbeats of idle sessions whose kernels run on a gateway (a request each).
GATEWAY_HEARTBEAT = 60.0


def _owned_by(session: KernelSession, owner: str) -> bool:
    """Whether ``owner`` (as a caller names it: the identity, or the name the listing shows) owns it."""
    return session.owner is not None and owner in (session.owner, display_name(session.owner))


def session_key(owner: str | None, name: str) -> str:
    """The registry key (and artifact directory name) of ``owner``'s session ``name``: the name, cut to
    fit, and a hash of owner and name. Keys of two identities' sessions of one name differ; no per-call
    (``per-call-…``), notebook (``nb-…``) or other artifact directory name has the ``.`` before the hash.
    """
    who = "\x00" if owner is None else owner  # no username is a NUL: None has a namespace of its own
    digest = hashlib.sha256(f"{who}\x00{name}".encode("utf-8", "surrogatepass")).hexdigest()[:10]
    return f"{name[:53]}.{digest}"


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
        help="Most named eval sessions (kernels) at once, all identities together. At the cap a new "
        "session evicts the caller's own least recently used idle session, or one of an identity holding "
        "more than its fair share (max_sessions / identities holding sessions, the caller included; at "
        "least 1): the caller's own first once it holds its share, the others' first while it holds "
        "less. Never another's within its share: when none can go the request answers 503 with "
        "Retry-After.",
    ).tag(config=True)
    idle_timeout = Float(
        300.0, help="Seconds a session may stay unused before the sweep shuts its kernel down (0: never)."
    ).tag(config=True)
    cleanup_interval = Float(
        30.0, help="Seconds between sweeps for idle and dead sessions and expired artifacts (0: no sweep)."
    ).tag(config=True)
    heartbeat_interval = Float(
        5.0,  # the gateway's default: _default_heartbeat
        help="Seconds between liveness checks of each idle session's kernel; a dead kernel is cleaned up "
        "and restarted on the session's next call (0: no heartbeat). Default 5; 60 when the kernels run on "
        "a gateway (GatewayClient.url set), where a check is an HTTP request to the gateway and a kernel "
        "whose websocket closed is known dead without one: at most one request per idle session a minute.",
    ).tag(config=True)
    audit = Instance(Audit, help="Records lifecycle steps and recoveries (audit events and metrics).")

    @default("audit")
    def _default_audit(self) -> Audit:
        return NO_AUDIT

    @default("heartbeat_interval")
    def _default_heartbeat(self) -> float:
        return GATEWAY_HEARTBEAT if self.kernels is not None and self.kernels.gateway else 5.0

    @validate("max_sessions")
    def _valid_max_sessions(self, proposal: Any) -> int:
        return int(at_least(proposal, 1))

    @validate("idle_timeout", "cleanup_interval", "heartbeat_interval")
    def _valid_seconds(self, proposal: Any) -> float:
        return float(at_least(proposal, 0))

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self.sessions: OrderedDict[str, KernelSession] = OrderedDict()  # by key (session_key), LRU first
        self.per_call: dict[str, KernelSession] = {}
        self.notebooks: dict[str, KernelSession] = {}  # by notebook path: connections to their kernels
        self.totals: Counter[str] = Counter()
        self.gone: OrderedDict[str, dict[str, Any]] = OrderedDict()  # by key; see GONE_REMEMBERED
        self._closing = 0  # sessions unlisted whose kernels are still shutting down
        self._slot_freed = asyncio.Condition()
        self._sweeper: asyncio.Task[None] | None = None
        self._heartbeat: asyncio.Task[None] | None = None
        audit_metrics.track(sessions=self, artifacts=self.artifacts)
        if self.artifacts is not None:
            self.artifacts.running_calls = self.running_calls
            self.artifacts.session_owner = self.owner_of
        self._ending: set[asyncio.Task[None]] = set()  # per-call kernels being shut down in the background
        # More upkeep at each sweep (the kernels notebook runs started: .run_kernels)
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
        """The named session ``name`` the request being served reaches (see :meth:`find`), or None (also
        when several identities' sessions have that name)."""
        with contextlib.suppress(Conflict):
            return self._named(name, None)
        return None

    def find(self, name: str, owner: str | None = None) -> KernelSession | None:
        """A named or a running per-call session the request being served may see: its own named session
        ``name``; else, for anyone but an agent, the one of ``owner`` (when given) or the only one of
        that name (:class:`Conflict` when several identities have one and ``owner`` is not given)."""
        named = self._named(name, owner)
        if named is not None:
            return named
        session = self.per_call.get(name)
        if session is None or not visible(session) or (owner is not None and not _owned_by(session, owner)):
            return None
        return session

    def _named(self, name: str, owner: str | None) -> KernelSession | None:
        mine = current_user()
        if owner is None or owner == mine:
            session = self.sessions.get(session_key(mine, name))
            if session is not None or owner is not None:
                return session
        if owner is not None:
            session = self.sessions.get(session_key(owner, name)) or next(
                (s for s in self.sessions.values() if s.name == name and _owned_by(s, owner)), None
            )
            return session if session is not None and visible(session) else None
        others = [s for s in self.sessions.values() if s.name == name and visible(s)]
        if len(others) > 1:
            owners = ", ".join(sorted(repr(display_name(s.owner)) for s in others))
            raise Conflict(
                f"Several identities have a session named {name!r} (owners {owners}): name the one meant "
                "with its owner (owner=<owner>, as GET /api/agent/sessions lists it)"
            )
        return others[0] if others else None

    def owner_of(self, key: str) -> tuple[str | None, str | None] | None:
        """(owner, notebook) of the session whose key is ``key`` (its artifacts record them), or None.
        Safe from a worker thread (it reads snapshots of the registries)."""
        every = [*list(self.sessions.values()), *list(self.per_call.values()), *list(self.notebooks.values())]
        found = next((s for s in every if s.key == key), None)
        return None if found is None else (found.owner, found.notebook)

    def running_calls(self) -> dict[str, object]:
        """{key: the running call's cancel event} of the sessions a call holds: the artifacts' cap keeps
        what those calls wrote. Safe from a worker thread (it reads snapshots of the registries)."""
        every = [*list(self.sessions.values()), *list(self.per_call.values()), *list(self.notebooks.values())]
        return {s.key: s.cancel for s in every if s.cancel is not None}

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
        """The acting identity's own session called ``name``, created if needed (at the cap, evicting
        an idle session: :meth:`_victim`).

        A session being shut down still counts against ``max_sessions`` until its kernel is gone, so
        evictions never let more than ``max_sessions`` kernels live at once.
        """
        self.start()
        owner = current_user()
        key = session_key(owner, name)
        while True:
            session = self.sessions.get(key)
            if session is not None:
                self.sessions.move_to_end(key)
                return session
            if len(self.sessions) + self._closing < self.max_sessions:
                session = KernelSession(name, self.kernels, key=key)
                session.owner = owner
                session.on_turn = self.audit.call
                session.predecessor_gone = self.gone.pop(key, None)  # the key is the owner's: told to them
                self.sessions[key] = session
                self.audit.session(session, "created")
                return session
            victim = self._victim(owner)
            if victim is not None:
                self.record(
                    victim,
                    "evictions",
                    "evicted (least recently used, max_sessions=%d)",
                    self.max_sessions,
                    audit={"idle_seconds": round(time.time() - victim.last_used, 3)},
                )
                if victim.owner == owner:
                    gone = f"evicted to make room for session {name!r} (least recently used idle session; "
                else:  # another identity's name is none of this owner's business
                    gone = "evicted to make room for another identity's session (it held more than its fair "
                    gone += f"share, {self.fair_share(owner)}; least recently used idle session; "
                gone += f"max_sessions={self.max_sessions})"
                await self._close(victim, gone_record("evicted", gone))
            elif self._closing:
                async with self._slot_freed:
                    await self._slot_freed.wait()
            else:
                raise self._no_room(owner)

    def holders(self, owner: str | None) -> Counter[str | None]:
        """{identity: named sessions it holds}, with ``owner`` (the caller) among them."""
        held: Counter[str | None] = Counter(s.owner for s in self.sessions.values())
        held[owner] += 0
        return held

    def fair_share(self, owner: str | None) -> int:
        """Named sessions each identity may keep against others' evictions: ``max_sessions`` divided by
        the identities holding sessions, ``owner`` (the caller) included; at least 1."""
        return max(1, self.max_sessions // len(self.holders(owner)))

    def _victim(self, owner: str | None) -> KernelSession | None:
        """The idle session a new one of ``owner`` evicts, least recently used first: ``owner``'s own,
        then one of an identity holding more than its fair share; while ``owner`` holds less than its
        share, those others' first. Never one of another identity within its share; None if none."""
        idle = [s for s in self.sessions.values() if s.idle]  # least recently used first
        held, share = self.holders(owner), self.fair_share(owner)
        own = next((s for s in idle if s.owner == owner), None)
        over = next((s for s in idle if s.owner != owner and held[s.owner] > share), None)
        return (own or over) if held[owner] >= share else (over or own)

    def _no_room(self, owner: str | None) -> AgentToolsError:
        """Why no session can be made for ``owner`` now, and what to do (503 with Retry-After, as when
        every session is busy): ``owner``'s own are all busy, or the others' are busy or within their
        fair share."""
        held, share = self.holders(owner), self.fair_share(owner)
        extra: dict[str, object] = {"max_sessions": self.max_sessions, "fair_share": share}
        extra["held"] = held[owner]
        if held[owner] >= share:
            message = (
                f"All {self.max_sessions} agent sessions are busy; you hold {held[owner]} (your fair share: "
                f"{share}), all running calls: retry once one of your calls ends, reuse one of your "
                "sessions, or shut one down (DELETE /api/agent/sessions/<name>)"
            )
        else:
            message = (
                f"All {self.max_sessions} agent sessions are busy or held by other identities within their "
                f"fair share ({share} each, {len(held)} identities): retry later, reuse one of your "
                "sessions, or raise c.EvalSessionManager.max_sessions"
            )
        return Unavailable(message, retry_after=RETRY_AFTER_BUSY_SESSIONS, extra=extra)

    async def discard_if_never_started(self, session: KernelSession) -> None:
        """Drop a session whose first kernel never started, so a failed start holds no slot."""
        never_started = session.kernel_id is None and session.executions == 0
        if never_started and self.sessions.get(session.key) is session:
            await self._close(session)

    async def remove(self, session: KernelSession) -> bool:
        """Shut the named ``session`` down (DELETE); False if it is not listed (a per-call one)."""
        if self.sessions.get(session.key) is not session:
            return False
        await self._close(session, gone_record("deleted", "deleted (DELETE /api/agent/sessions)"))
        return True

    async def _close(self, session: KernelSession, gone: dict[str, Any] | None = None) -> None:
        """Unlist a session, shut it down and remove its artifacts; it counts until its kernel is gone.

        ``gone`` (see :func:`gone_record`) is remembered for the next call that names the session."""
        if self.sessions.get(session.key) is session:
            del self.sessions[session.key]
            if gone is not None:
                self.gone[session.key] = gone
                self.gone.move_to_end(session.key)
                while len(self.gone) > GONE_REMEMBERED:
                    self.gone.popitem(last=False)
        self._closing += 1
        try:
            await session.close()
            self.artifacts.remove_session(session.key)
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
        self.artifacts.discard_if_empty(session.key)  # the call is over: nothing writes there any more

    @property
    def per_call_ending(self) -> int:
        """Per-call kernels being shut down in the background."""
        return len(self._ending)

    async def _shut_per_call(self, session: KernelSession) -> None:
        try:
            await session.close()
        except Exception:
            # broad: a per-call kernel's shutdown failing any way must not stop the others; logged
            self.log.warning("shutting down per-call kernel %s failed", session.kernel_id, exc_info=True)

    # -- notebook sessions --------------------------------------------------------------------------

    def for_notebook(self, path: str) -> KernelSession:
        """The session that runs ``path``'s cells in the notebook's own kernel (it never owns it).

        Its name (``nb-`` and a hash of the path) names its artifact directory; ``notebook`` is the path.
        """
        self.start()  # the sweep also shuts down kernels the runs started (see .run_kernels)
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
            # On a gateway a liveness check is a request to it: the heartbeat alone makes them, at its pace.
            check = connection is not None and not (self.kernels.gateway and self.heartbeat_interval > 0)
            if check and connection is not None and not await connection.is_alive():
                kind, message = "dead_sweeps", "kernel found dead by the sweep; session removed"
                gone = gone_record("dead", "removed after its kernel was found dead")
            elif self.idle_timeout > 0 and now - session.last_used > self.idle_timeout:
                kind, message = "idle_shutdowns", "idle for %.0f s (idle_timeout=%.0f); session removed"
                args = (now - session.last_used, self.idle_timeout)
                unused = f"shut down after {args[0]:.0f} s unused (idle_timeout={args[1]:.0f})"
                gone = gone_record("idle", unused)
            else:
                continue
            if session.idle and self.sessions.get(session.key) is session:
                idle = {"idle_seconds": round(now - session.last_used, 3)} if args else {}
                self.record(session, kind, message, *args, audit=idle)
                await self._close(session, gone)
        self.artifacts.sweep(keep={*self.sessions, *self.per_call, *(s.key for s in self.notebooks.values())})
        for sweeper in list(self.sweepers):
            try:
                await sweeper()
            except Exception:  # broad: a sweep step failing any way must not end the periodic sweep; logged
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
                # broad: a background session task failing any way is logged, never lost silently
                self.log.exception("agent session %s failed", what)

    async def shutdown(self) -> None:
        """Stop the sweep and heartbeat and shut down every session's kernel (server shutdown)."""
        for task in (self._sweeper, self._heartbeat):
            if task is not None:
                task.cancel()
                # broad: awaiting the cancelled sweep or heartbeat: cancelled or failed, shutdown goes on
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

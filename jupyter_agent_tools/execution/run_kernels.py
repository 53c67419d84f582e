"""The kernels that notebook runs started: shut down when idle, and only so many kept.

A run of a notebook that has no jupyter_server session creates one, with its kernel, as JupyterLab would
(:class:`~.notebook_run.NotebookRunner`). Nobody else would ever shut those down, so this does: a kernel a
run started is shut down once idle for ``idle_timeout`` (at the session manager's sweep, every
``cleanup_interval``), and when a run starts one more than ``max_kernels``, the least recently used go
first. Never one that is busy (its kernel runs code, or a run holds or waits for its notebook) nor one a
client is connected to (a browser's websocket: the kernel model's ``connections``, what jupyter_server's
own culler looks at unless ``cull_connected``); kernels a run did not start (JupyterLab opened the
notebook) are never touched. Shutting down deletes the jupyter_server session (which shuts its kernel
down), so ``/api/sessions`` and ``/api/kernels`` stay consistent. :meth:`NotebookKernels.listing` lists
every notebook that has a kernel (the sessions listing's ``notebook_kernels``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from jupyter_core.utils import ensure_async
from traitlets import Any as AnyTrait
from traitlets import Float, Instance, Int, validate

from ..auth.context import path_allowed
from ..compat import ServerHTTPError
from ..service import Service, at_least
from .kernel_session import KernelSession
from .session_manager import EvalSessionManager


@dataclass
class Started:
    """A jupyter_server session (and its kernel) a notebook run created."""

    session_id: str
    kernel_id: str
    created: float


class NotebookKernels(Service):
    """Keeps track of the kernels notebook runs started and shuts down those nobody uses."""

    session_manager = AnyTrait(help="jupyter_server's session manager (deleting a session shuts its kernel).")
    sessions = Instance(EvalSessionManager, help="The runs' connections, and the sweep this joins.")
    idle_timeout = Float(
        600.0,
        help="Seconds a kernel that a notebook run started (the notebook had no jupyter session) may stay "
        "unused before the sweep shuts it down with its session; never one that is busy or that a client "
        "(a browser) is connected to, nor one JupyterLab started. 0: never.",
    ).tag(config=True)
    max_kernels = Int(
        8,
        help="Most kernels started by notebook runs kept at once: a run that starts one more shuts down the "
        "least recently used unused one first (never a busy or connected one).",
    ).tag(config=True)

    @validate("idle_timeout")
    def _valid_idle(self, proposal: Any) -> float:
        return float(at_least(proposal, 0))

    @validate("max_kernels")
    def _valid_max(self, proposal: Any) -> int:
        return int(at_least(proposal, 1))

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self.started: dict[str, Started] = {}  # by notebook path
        self.sessions.sweepers.append(self.sweep)

    def note(self, path: str, session_id: str, kernel_id: str) -> None:
        """A run of ``path`` created this jupyter_server session and kernel."""
        self.started[path] = Started(session_id, kernel_id, time.time())

    async def listing(self) -> list[dict[str, Any]]:
        """Every notebook that has a kernel (jupyter_server's notebook sessions, JupyterLab's included):
        path, kernel, state, people connected, whether a run started it, whether runs attached to it."""
        listed = []
        for model in await ensure_async(self.session_manager.list_sessions()):
            kernel = model.get("kernel") or {}
            path = model.get("path")
            if model.get("type") != "notebook" or not kernel.get("id") or not isinstance(path, str):
                continue
            if not path_allowed(path):  # an agent's list names no notebook outside its paths
                continue
            session = self.sessions.notebooks.get(path)
            connections = int(kernel.get("connections") or 0)
            listed.append(
                {
                    "path": path,
                    "kernel_id": str(kernel["id"]),
                    "kernel_name": kernel.get("name"),
                    "state": str(kernel.get("execution_state") or "unknown"),
                    "connections": connections,
                    "person_connected": connections > 0,
                    "started_by_run": path in self.started,
                    "attached": session is not None and session.kernel_id == kernel["id"],
                }
            )
        return sorted(listed, key=lambda k: k["path"])

    async def make_room(self, path: str) -> None:
        """Before a run of ``path`` starts a kernel: shut down the least recently used unused kernels
        until one more fits under ``max_kernels``."""
        await self._keep_at_most(self.max_kernels - 1, spare=path)

    async def sweep(self) -> None:
        """Shut down the kernels idle longer than ``idle_timeout``, then those past ``max_kernels``."""
        if self.idle_timeout > 0:
            for path in list(self.started):
                await self.shut_down(path, idle_for=self.idle_timeout)
        await self._keep_at_most(self.max_kernels)

    async def _keep_at_most(self, limit: int, spare: str | None = None) -> None:
        def count() -> int:
            return sum(1 for p in self.started if p != spare)

        if count() <= limit:
            return
        ranked = []
        for path, record in list(self.started.items()):
            if path != spare:
                last = await self._last_used(path, record, held=False)
                if last is not None:
                    ranked.append((last, path))
        for _, path in sorted(ranked):
            if count() <= limit:
                return
            await self.shut_down(path)

    async def shut_down(self, path: str, *, idle_for: float | None = None) -> bool:
        """Shut the kernel a run of ``path`` started down, unless it is in use (or, with ``idle_for``,
        was used in the last ``idle_for`` seconds); True if it was. Without ``idle_for`` the reason is
        ``max_kernels``.

        A run of the notebook that arrives meanwhile waits for its turn and then starts a new kernel.
        """
        record = self.started.get(path)
        session = self.sessions.notebooks.get(path)
        if record is None:
            return False
        held = False
        if session is not None and not session.closed:
            if not session.idle:
                return False
            # Free and nobody waiting: the turn is taken at once (no await in between), so no run starts.
            held = await session.take_turn(asyncio.Event())
            last_used = session.last_used  # a look is not a use: end_turn below must not reset it
        try:
            last = await self._last_used(path, record, held=held)
            now = time.time()
            if last is None or (idle_for is not None and now - last <= idle_for):
                return False
            if self.started.get(path) is not record:
                return False
            del self.started[path]
            if session is not None and not session.closed:
                self._record(session, now - last, idle_for)
                await session.close()  # disconnects only: the kernel is the jupyter session's
            if self.sessions.notebooks.get(path) is session:
                del self.sessions.notebooks[path]
            await self._delete(record)
            return True
        finally:
            if held and session is not None:
                await session.end_turn()
                session.last_used = last_used

    async def discard(self, path: str) -> None:
        """Shut down the kernel a run of ``path`` just started and gave up on (it never answered): killed
        at once, as it holds nothing to save and a graceful shutdown would send its request over the
        control channel of a kernel that is not there; then its session goes."""
        record = self.started.pop(path, None)
        if record is not None:
            await self.sessions.kernels.forget_failed_start(record.kernel_id)
            await self._delete(record)

    def _record(self, session: KernelSession, idle: float, idle_for: float | None) -> None:
        """Count, log and audit the shutdown as the session's ``idle_culled`` or ``evicted`` step."""
        audit = {"idle_seconds": round(idle, 3)}
        if idle_for is not None:
            self.sessions.record(
                session,
                "idle_shutdowns",
                "notebook kernel started by a run, unused for %.0f s (NotebookKernels.idle_timeout=%.0f); "
                "shut down",
                idle,
                idle_for,
                audit=audit,
            )
        else:
            self.sessions.record(
                session,
                "evictions",
                "notebook kernel started by a run, least recently used (NotebookKernels.max_kernels=%d); "
                "shut down",
                self.max_kernels,
                audit=audit,
            )

    async def _last_used(self, path: str, record: Started, *, held: bool) -> float | None:
        """When the kernel was last used (epoch seconds), or None while it must stay: busy, connected,
        or no longer the one the run started (then it is forgotten). ``held``: this holds the turn."""
        session = self.sessions.notebooks.get(path)
        if session is not None and not session.closed and not held and not session.idle:
            return None
        try:
            model = await ensure_async(self.session_manager.get_session(session_id=record.session_id))
            kernel = await ensure_async(self.sessions.kernels.kernel_manager.kernel_model(record.kernel_id))
        except (KeyError, ServerHTTPError):  # the session or its kernel is gone (a person shut it down)
            model = None
        if model is None or (model.get("kernel") or {}).get("id") != record.kernel_id:
            if self.started.get(path) is record:
                del self.started[path]  # gone, or a person switched the notebook to another kernel
            return None
        if kernel.get("execution_state") == "busy" or kernel.get("connections"):
            return None
        last = record.created
        if session is not None:
            last = max(last, session.last_used)
        activity = kernel.get("last_activity")
        if isinstance(activity, str):
            with contextlib.suppress(ValueError):
                last = max(last, datetime.fromisoformat(activity.replace("Z", "+00:00")).timestamp())
        return last

    async def _delete(self, record: Started) -> None:
        try:
            await ensure_async(self.session_manager.delete_session(record.session_id))
        except KeyError:  # its kernel was gone already: jupyter_server removed the session's row itself
            pass
        except Exception:
            # broad: a session deletion failing any way (manager, kernel) must not stop the sweep; logged
            self.log.warning(
                "shutting down notebook kernel %s (session %s) failed",
                record.kernel_id,
                record.session_id,
                exc_info=True,
            )

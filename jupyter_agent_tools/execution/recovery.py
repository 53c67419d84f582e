"""The recovery policy of eval sessions, in one place: what is done when a kernel fails.

- A kernel creation that fails with HTTP >= 500 (a gateway's error, 503 unreachable, 599 timeout), or a
  local kernel that dies before it answers (it lost its ports to another process), is retried once after
  ``retry_backoff`` seconds.
- Running out of file descriptors (EMFILE/ENFILE) shuts down the warm pooled kernels first, then (unless
  that freed enough) this extension's idle sessions, and retries once; failing again answers 503 with
  Retry-After.
- Before a call: a kernel its manager restarted is reconnected (init re-runs); a kernel found dead is
  replaced. Either is reported to the caller with a notice.
- During a call: a kernel that dies is replaced and the call re-run from its first cell, at most
  :data:`RERUNS_AFTER_DEATH` times; a kernel that does not settle after an interrupt is replaced.

Every recovery is counted on the session and logged once (:meth:`EvalSessionManager.record`).
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from traitlets import Float, Instance, validate

from ..errors import Unavailable
from ..service import Service, at_least
from .connection import KernelConnection
from .faults import died_at_start, fd_usage, http_message, http_status, is_fd_exhaustion
from .kernel_service import KernelService
from .kernel_session import KernelSession, SessionState
from .pool import KernelPool
from .session_manager import EvalSessionManager

RERUNS_AFTER_DEATH = 1
Started = TypeVar("Started")
RESTART_LIMIT_MESSAGE = "Python kernel restarted too many times in this session"


def died_notice(cell: int) -> str:
    """The notice of a call re-run after its kernel died in ``cell`` (1-based place in the call)."""
    return (
        f"[Kernel died during this call while running cell {cell} and was restarted; state from earlier "
        "calls was lost. The call was run again from its first cell.]"
    )


def gave_up_message(cell: int) -> str:
    """The error of a call whose kernel died again on the re-run, in ``cell``."""
    return (
        f"{RESTART_LIMIT_MESSAGE}: the kernel died while running cell {cell}, and again on the re-run, so "
        "the call stopped and the session has no kernel; its next call starts a new one"
    )


DEAD_BEFORE_RUN_NOTICE = "[Kernel had died and was restarted before this call; earlier state was lost.]"
WEDGED_NOTICE = (
    "[The kernel did not stop after the interrupt and was replaced by a fresh one; state from earlier "
    "calls was lost.]"
)
RESTARTED_BY_MANAGER_NOTICE = (
    "[Kernel was restarted by the server since the last call; earlier state was lost.]"
)
# Seconds a client is asked to wait when the server is out of descriptors: long enough for idle kernels
# and connections elsewhere to go.
EMFILE_RETRY_AFTER = 30


class KernelRecovery(Service):
    """Starts and revives session kernels according to the policy above."""

    kernels = Instance(KernelService, help="Starts, connects to and shuts down kernels.")
    sessions = Instance(EvalSessionManager, help="The sessions (idle ones are released on EMFILE).")
    pool = Instance(KernelPool, allow_none=True, help="Warm kernels, released first on EMFILE.")
    retry_backoff = Float(
        1.0,
        help="Seconds to wait before the single retry of a kernel creation that failed with HTTP >= 500 "
        "(a remote gateway's error, 503 unreachable, 599 timeout) or whose kernel died before answering.",
    ).tag(config=True)

    @validate("retry_backoff")
    def _valid_backoff(self, proposal: Any) -> float:
        return float(at_least(proposal, 0))

    async def launch(
        self, session: KernelSession, kernel_name: str, cwd: str
    ) -> tuple[str, KernelConnection]:
        """Start and connect a kernel for ``session``, recovering from gateway 5xx and EMFILE."""
        try:
            return await self._launch_retrying(session, kernel_name, cwd)
        except Exception as first:
            # broad: any start failure is classified here (descriptor exhaustion or not), the rest re-raised
            if not is_fd_exhaustion(first):
                raise
            usage = fd_usage()
            pooled = await self.pool.release() if self.pool is not None else []
            released: list[str] = []
            if not pooled or not self._headroom_restored():
                released = await self.sessions.release_idle(exclude=session)
            self.sessions.record(
                session,
                "emfile_recoveries",
                "out of file descriptors starting a kernel (%s: %s); shut down %d pooled kernel(s) and %d "
                "idle agent session(s) %s and retrying once",
                usage.describe() if usage else "descriptor count unknown",
                first,
                len(pooled),
                len(released),
                released,
            )
            gc.collect()
        audit = self.sessions.audit
        try:
            launched = await self._launch_retrying(session, kernel_name, cwd)
        except Exception as second:
            # broad: the retried start failing any way is audited, then raised as the recovery's failure
            audit.recovery(
                session, "emfile_recoveries", "failed", f"the retried kernel start failed: {second}"
            )
            if not is_fd_exhaustion(second):
                raise
            usage = fd_usage()
            self.sessions.log.warning(
                "agent session %r: kernel start failed again after the EMFILE recovery: %s",
                session.name,
                second,
            )
            raise Unavailable(
                "The server is out of file descriptors and could not start a kernel, even after "
                f"shutting down {len(pooled)} pooled kernel(s) and {len(released)} idle agent session(s): "
                f"{usage.describe() if usage else second}. Raise the server's limit (ulimit -n, "
                "systemd LimitNOFILE) or stop unused kernels and terminals, then retry.",
                retry_after=EMFILE_RETRY_AFTER,
            ) from second
        audit.recovery(session, "emfile_recoveries", "recovered", "the retried kernel start succeeded")
        return launched

    def _headroom_restored(self) -> bool:
        """Whether enough descriptors are free again for a kernel start (after the pool was released)."""
        gc.collect()
        usage = fd_usage()
        return usage is not None and usage.headroom >= max(self.kernels.fd_headroom, 16)

    async def _launch_retrying(
        self, session: KernelSession, kernel_name: str, cwd: str
    ) -> tuple[str, KernelConnection]:
        def retryable(e: Exception) -> bool:
            return not is_fd_exhaustion(e) and ((http_status(e) or 0) >= 500 or died_at_start(e))

        return await self.retry_once(
            session, lambda: self.kernels.launch(kernel_name, cwd), retryable, self.kernels.translate
        )

    async def retry_once(
        self,
        session: KernelSession,
        start: Callable[[], Awaitable[Started]],
        retryable: Callable[[Exception], bool],
        translate: Callable[[Exception, bool], Exception] | None = None,
    ) -> Started:
        """``start()``; when it fails as ``retryable`` says, once more after ``retry_backoff``: counted as
        the session's ``create_retries``, logged, audited. A failure is raised as ``translate(e, retried)``
        (a kernel start's failure as the caller's error), or as it is. Eval's kernel launches and notebook
        runs' kernel starts both go through here."""

        def failed(e: Exception, retried: bool) -> Exception:
            error = translate(e, retried) if translate is not None else e
            if error is not e:
                error.__cause__ = e
            return error

        try:
            return await start()
        except Exception as e:
            # broad: any start failure is classified (retryable or not); the rest raised as failed
            if not retryable(e):
                raise failed(e, False)  # noqa: B904 - failed() sets the cause
            status = http_status(e)
            self.sessions.record(
                session,
                "create_retries",
                "kernel creation failed (%s); retrying once",
                f"HTTP {status}: {http_message(e)}" if status else str(e),
            )
        await asyncio.sleep(self.retry_backoff)
        audit = self.sessions.audit
        try:
            started = await start()
        except Exception as e:
            # broad: the retried creation failing any way is audited, then raised as the recovery's failure
            audit.recovery(session, "create_retries", "failed", f"the retried kernel creation failed: {e}")
            raise failed(e, True)  # noqa: B904 - failed() sets the cause
        audit.recovery(session, "create_retries", "recovered", "the retried kernel creation succeeded")
        return started

    async def revive(self, session: KernelSession) -> str | None:
        """Before a call: recover a kernel that was restarted under the session or died; return the
        notice for the caller, or None when nothing happened."""
        connection = session.connection
        if session.state is SessionState.DEAD:  # found dead while idle (heartbeat) or given up on
            session.restarts += 1
            return DEAD_BEFORE_RUN_NOTICE
        if session.state is not SessionState.READY or connection is None:
            return None
        # Checked before liveness: while the manager's restarter is at work the kernel looks dead, and
        # replacing it then would race the restarter.
        if connection.lost_state and await self.kernels.wait_until_restarted(connection.kernel_id):
            self.sessions.record(
                session, "manager_restarts", "kernel was restarted by its kernel manager; re-running init"
            )
            await session.reconnect()  # the restarter gives the new kernel process new ports
            session.restarts += 1
            return RESTARTED_BY_MANAGER_NOTICE
        if connection.lost_state or not await connection.is_alive():
            self.sessions.record(session, "restarts", "kernel found dead before a run; restarting it")
            await session.mark_dead()
            session.restarts += 1
            return DEAD_BEFORE_RUN_NOTICE
        return None

    def after_death(self, session: KernelSession, reruns: int) -> bool:
        """A kernel died during a call: whether to replace it and run the call again."""
        if reruns >= RERUNS_AFTER_DEATH:
            self.sessions.record(session, "restart_limit", "kernel died again after a restart")
            return False
        session.restarts += 1
        self.sessions.record(session, "restarts", "kernel died during a run; restarting and re-running")
        return True

    def after_wedge(self, session: KernelSession) -> None:
        """A kernel did not settle after an interrupt: it is replaced (the caller is told)."""
        session.restarts += 1
        self.sessions.record(
            session, "wedged_restarts", "kernel did not settle after an interrupt; restarting it"
        )

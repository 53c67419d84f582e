"""The eval service: run a request's cells in a session (or per-call) kernel and build the answer.

Handlers call :meth:`EvalService.run` with an ``emit`` callback for streamed events and a ``cancel``
event (set when the client goes away). The request walk is one-directional: parse the request, take the
session's turn (:class:`~.kernel_session.KernelSession`), let the recovery policy (:mod:`.recovery`) revive or
start its kernel, run the cells (the one cell loop, :meth:`~.cells.CellExecutor.run_cells`, with this
module's policy for a session's kernel that died or would not stop), answer. Eval with ``notebook`` is
not run here: the front doors give it to :meth:`~.notebook_run.NotebookRunner.eval`.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any

from jupyter_core.utils import ensure_async
from traitlets import Any as AnyTrait
from traitlets import Float, Instance, Int, default, validate

from ..answers import EvalAnswer
from ..artifacts import ArtifactStore
from ..audit import Audit
from ..compat import ServerHTTPError, pending_ready, settle_abandoned_start
from ..errors import RETRY_AFTER_MOMENT, AgentToolsError, BadRequest, Conflict, NotFound
from ..service import Service, at_least
from .cells import CellExecutor, CellHooks, CellsRun, KeepKernel, Ran, Told
from .connection import KernelConnection
from .eval_answer import eval_answer, eval_cells, parse_recorded
from .executor import Emit, noop
from .kernel_service import KernelService
from .kernel_session import InitSpec, KernelSession, SessionState
from .pace import StreamPace
from .pool import KernelPool
from .recovery import WEDGED_NOTICE, KernelRecovery, died_notice, gave_up_message
from .request import EvalRequest
from .run_kernels import NotebookKernels
from .session_manager import EvalSessionManager

# The init step's error when the working directory does not exist in the kernel (a kernel on a gateway
# runs where the server's paths may not exist): its value is "<cwd>|<the kernel's working directory>".
CWD_MISSING = "AgentToolsCwdMissing"


def build_init_code(spec: InitSpec) -> str:
    """The silent init step: environment, cwd, and cwd on ``sys.path``. A cwd the kernel cannot enter
    fails the step with a :data:`CWD_MISSING` error, after the environment was set."""
    env = dict(spec.env)
    return (
        "def __agent_tools_init():\n"
        "    import os, sys\n"
        f"    cwd = {spec.cwd!r}\n"
        f"    os.environ.update({env!r})\n"
        "    try:\n"
        "        os.chdir(cwd)\n"
        "    except OSError as e:\n"
        f"        raise type({CWD_MISSING!r}, (Exception,), {{}})(cwd + '|' + os.getcwd()) from None\n"
        "    if cwd not in sys.path:\n"
        "        sys.path.insert(0, cwd)\n"
        "try:\n"
        "    __agent_tools_init()\n"
        "finally:\n"
        "    del __agent_tools_init\n"
    )


def cwd_missing_notice(error: dict[str, Any] | None) -> str | None:
    """The notice of an init step whose working directory does not exist in the kernel, else None."""
    if not error or error.get("ename") != CWD_MISSING:
        return None
    cwd, _, actual = str(error.get("evalue") or "").partition("|")
    return (
        f"[The working directory {cwd} does not exist where this kernel runs (a kernel on a remote gateway "
        f"sees its own filesystem, not the server's); the code runs in {actual or 'its start directory'} "
        "instead. Pass paths that exist in the kernel, or have the gateway mount the server's files "
        "(Enterprise Gateway: EG_MIRROR_WORKING_DIRS).]"
    )


def start_notice(seconds: float, timeout: float) -> str:
    """The notice of a call that waited for a new kernel longer than its own timeout allows for work."""
    return (
        f"[A new kernel was started for this call in {seconds:.1f} s; the call's timeout ({timeout:g} s) "
        "counts from when it answered.]"
    )


# A kernel start this long (seconds) is told in the answer's text, not only in kernel_start_seconds.
SLOW_START_SECONDS = 5.0


def lost_notice(name: str, gone: dict[str, Any]) -> str:
    """The notice of a call whose session's earlier incarnation went (see ``EvalSessionManager.gone``)."""
    return (
        f"[Session {name!r} was {gone['message']} at {gone['at']}: its variables and imports are gone; "
        "this call runs in a new kernel.]"
    )


class _StillStarting(Exception):
    """The call was cancelled while its session's kernel started: it answers ``answer`` at once, and
    ``start`` goes on in the background, holding the session's turn until it ends."""

    def __init__(self, answer: EvalAnswer, start: asyncio.Future[Any]):
        super().__init__("cancelled while the kernel starts")
        self.answer, self.start = answer, start


async def _unless_cancelled(start: asyncio.Future[Any], cancel: asyncio.Event) -> bool:
    """Wait for ``start`` (its result or error) unless ``cancel`` comes first: False then."""
    cancelled = asyncio.ensure_future(cancel.wait())
    try:
        await asyncio.wait({start, cancelled}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        cancelled.cancel()
    if start.done():
        start.result()  # its error, if any
        return True
    return False


@dataclass
class _ReplaceKernel:
    """The policy for a session's kernel after a cell: one that would not stop after the interrupt is
    replaced (nothing re-runs); one that died is replaced and the call re-run from its first cell, once
    (dying again, the call stops and the session is left without a kernel)."""

    service: EvalService
    request: EvalRequest
    cwd: str

    async def after(
        self, session: KernelSession, ran: Ran, reruns: int, cancel: asyncio.Event
    ) -> Told | None:
        last = ran.execution
        if session.closed:
            return None
        start = functools.partial(self.service._start_kernel, session, self.request, self.cwd)
        if last.cancelled and not last.settled and not last.kernel_died:
            self.service.recovery.after_wedge(session)
            if cancel.is_set():  # the caller may have gone (closed its stream): tell the next one
                session.undelivered_notice = WEDGED_NOTICE
            return Told(notice=WEDGED_NOTICE, then=start)
        if not last.kernel_died or cancel.is_set():
            return None
        died_in = ran.cell.index + 1
        if not self.service.recovery.after_death(session, reruns):
            await session.drop_kernel()
            return Told(error=gave_up_message(died_in))
        return Told(notice=died_notice(died_in), rerun=True, then=start)


class EvalService(Service):
    """Runs eval requests on the server's kernel manager.

    The application builds the class named by ``AgentToolsApp.eval_service_class``.
    """

    sessions = Instance(EvalSessionManager, help="The named and per-call sessions.")
    kernels = Instance(KernelService, help="Starts, checks and shuts down kernels.")
    artifacts = Instance(ArtifactStore, help="Where spilled outputs live.")
    contents_manager = AnyTrait(help="The server's contents manager (the kernels' working directory).")
    recovery = Instance(
        KernelRecovery, help="Restarts dead or wedged kernels (default: one over kernels, sessions)."
    )
    max_cells = Int(100, help="Most cells accepted in one eval request.").tag(config=True)
    init_timeout = Float(
        60.0,
        help="Seconds the silent init step (cwd, env, sys.path) may take on a new kernel before the call "
        "goes on without it (it is tried again on the next call).",
    ).tag(config=True)
    audit = Instance(Audit, help="Records every call (default: the session manager's).")

    @default("audit")
    def _default_audit(self) -> Audit:
        return self.sessions.audit

    pool = Instance(KernelPool, help="Warm kernels new per-call and session kernels are taken from.")
    cells = Instance(
        CellExecutor,
        help="Runs the cells: one cell's execution and the one cell loop (the application builds one and "
        "gives it to the NotebookRunner too; default: a CellExecutor of this service's collaborators).",
    )
    notebook_kernels = Instance(
        NotebookKernels, allow_none=True, help="The notebooks' kernels, listed with the sessions."
    )

    @default("cells")
    def _default_cells(self) -> CellExecutor:
        return CellExecutor(
            kernels=self.kernels, artifacts=self.artifacts, sessions=self.sessions, parent=self
        )

    @validate("max_cells")
    def _valid_counts(self, proposal: Any) -> int:
        return int(at_least(proposal, 1))

    @validate("init_timeout")
    def _valid_positive(self, proposal: Any) -> float:
        return float(at_least(proposal, 0, strict=True))

    @default("recovery")
    def _default_recovery(self) -> KernelRecovery:
        return KernelRecovery(kernels=self.kernels, sessions=self.sessions, pool=self.pool, parent=self)

    @default("pool")
    def _default_pool(self) -> KernelPool:
        return KernelPool(kernels=self.kernels, size=0, parent=self)

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self._finishing: set[asyncio.Future[Any]] = set()  # kernel starts of calls that answered

    def list_sessions(self) -> list[dict[str, Any]]:
        return self.sessions.describe_all()

    def listing(self) -> dict[str, Any]:
        """The sessions, the recovery counters and the warm pool (``GET /api/agent/sessions``)."""
        return {
            "sessions": self.list_sessions(),
            "totals": dict(self.sessions.totals),
            "pool": self.pool.describe(),
        }

    async def listing_with_notebooks(self) -> dict[str, Any]:
        """:meth:`listing` plus ``notebook_kernels``: every notebook that has a kernel, with its path."""
        answer = self.listing()
        answer["notebook_kernels"] = (
            await self.notebook_kernels.listing() if self.notebook_kernels is not None else []
        )
        return answer

    async def shutdown(self) -> None:
        """Shut down every kernel this service started: sessions', per-call ones still running, pooled;
        those still starting first (killed, and no more start)."""
        await self.kernels.stop()
        await asyncio.gather(self.sessions.shutdown(), self.pool.shutdown())
        if self._finishing:
            await asyncio.wait(set(self._finishing), timeout=10.0)
        await self._let_starts_finish()

    async def _let_starts_finish(self, timeout: float = 10.0) -> None:
        """Wait (bounded) for kernels of the manager whose start is still running, and settle those
        whose start was cancelled: the server's own cleanup shuts every kernel down next, and
        jupyter_client raises InvalidStateError for a kernel whose ``ready`` future is not done."""
        manager = self.kernels.kernel_manager
        running = {}  # kernel id -> its ready future, for starts still running
        for kernel_id in list(manager.list_kernel_ids()):
            ready = pending_ready(manager, kernel_id)
            if ready is not None and not settle_abandoned_start(manager, kernel_id):
                running[kernel_id] = asyncio.shield(ready)
        if running:
            await asyncio.wait(running.values(), timeout=timeout)
            for kernel_id in running:
                settle_abandoned_start(manager, kernel_id)

    def _find(self, name: str, owner: str | None) -> KernelSession:
        session = self.sessions.find(name, owner)
        if session is None:
            raise NotFound(f"Session not found: {name}")
        return session

    async def delete_session(self, name: str, owner: str | None = None) -> None:
        """Shut a session (named or a running per-call one) and its kernel down: the caller's own named
        ``name``, else (not an agent) ``owner``'s or the only one (:meth:`EvalSessionManager.find`)."""
        session = self._find(name, owner)
        self.audit.session(session, "deleted")
        if not await self.sessions.remove(session):
            await self.sessions.close_per_call(session)  # its running call is cancelled

    async def interrupt_session(self, name: str, owner: str | None = None) -> dict[str, Any]:
        """Interrupt what a session runs (found as :meth:`delete_session` finds it): its running call
        answers ``cancelled``; an idle session's kernel gets a plain interrupt."""
        session = self._find(name, owner)
        running = session.cancel is not None and not session.cancel.is_set()
        if running and session.cancel is not None:
            session.cancel.set()
        elif session.kernel_id:
            await self.kernels.interrupt(session.kernel_id)
        self.audit.session(session, "interrupted", interrupted_call=running)
        return {"session": name, "kernel_id": session.kernel_id, "interrupted": running}

    async def _resolve_cwd(self, cwd: str) -> str:
        """The kernel's working directory for the API path ``cwd`` ('': the server root, which the server
        made sure of when it started: not asked again on every call)."""
        if cwd:
            await self._check_cwd(cwd)
        return str(self.kernels.kernel_manager.cwd_for_path(cwd))

    async def _check_cwd(self, cwd: str) -> None:
        cm = self.contents_manager
        problem = f"'cwd' must be an existing directory inside the server root (got {cwd!r})"
        try:
            if not await ensure_async(cm.dir_exists(cwd)):
                raise BadRequest(problem)
            if not cm.allow_hidden and await ensure_async(cm.is_hidden(cwd)):
                raise BadRequest(problem)
        except ServerHTTPError:
            raise BadRequest(problem) from None

    def _init_spec(self, session: KernelSession, request: EvalRequest, cwd: str) -> InitSpec:
        env = dict(request.env)
        if request.session_file is not None:
            env["PI_SESSION_FILE"] = request.session_file
        env["ARTIFACTS"] = str(self.artifacts.session_path(session.key))
        return InitSpec(cwd=cwd, env=tuple(sorted(env.items())), session_file=request.session_file)

    async def run(
        self,
        body: Any,
        *,
        emit: Emit | None = None,
        cancel: asyncio.Event | None = None,
        pace: StreamPace | None = None,
    ) -> EvalAnswer:
        """Run an eval request body; return the answer (also emitted last as a ``result`` event).
        ``pace``: the stream client's, when one reads the events as they come.

        The call is recorded when it ends (:meth:`Audit.execution`), failed or not.
        """
        with self.audit.executing("session") as record:
            request = parse_recorded(body, self.max_cells, record)
            if request.notebook is not None:  # the front doors give these to NotebookRunner.eval
                raise AgentToolsError("Eval with 'notebook' runs through NotebookRunner.eval", 501)
            record.result = answer = await self._run(request, emit, cancel, pace)
        return answer

    async def _run(
        self, request: EvalRequest, emit: Emit | None, cancel: asyncio.Event | None, pace: StreamPace | None
    ) -> EvalAnswer:
        cwd = await self._resolve_cwd(request.cwd)
        if request.kernel_name:  # before any session is created, evicted or reset
            await self.kernels.check_kernel_name(request.kernel_name)
        emit = emit or noop
        cancel = cancel or asyncio.Event()
        self.pool.start()  # the first eval starts filling the pool (none before: no idle kernel)
        if request.mode == "per-call":
            result = await self._run_per_call(request, cwd, emit, cancel, pace)
        else:
            result = await self._run_session(request, cwd, emit, cancel, pace)
        emit({"type": "result", "result": result})
        return result

    # -- session mode -------------------------------------------------------------------------------

    async def _run_session(
        self, request: EvalRequest, cwd: str, emit: Emit, cancel: asyncio.Event, pace: StreamPace | None
    ) -> EvalAnswer:
        while True:
            session = await self.sessions.acquire(request.session)
            if not await session.take_turn(cancel):
                return eval_answer(session, request, [], notices=[], restarted=False, cancelled=True)
            if not session.closed:
                break
            await session.end_turn()  # shut down while we waited: take the session's successor
        try:
            result = await self._run_turn(session, request, cwd, emit, cancel, pace)
        except _StillStarting as still:
            self._end_turn_after(session, still.start)
            return still.answer
        except BaseException:
            await self.sessions.discard_if_never_started(session)
            await session.end_turn()
            raise
        await session.end_turn()
        return result

    def _end_turn_after(self, session: KernelSession, start: asyncio.Future[Any]) -> None:
        """End the session's turn once a kernel start its cancelled call left behind has ended (a
        failed start drops a session that never had a kernel, as the call would have)."""

        async def finish() -> None:
            try:
                await start
            except BaseException:
                # broad: a cancelled call's kernel start, cancelled or failed any way: only cleaned up
                self.log.debug("session %s: a cancelled call's kernel start failed", session.name)
                if session.mode == "session":
                    await self.sessions.discard_if_never_started(session)
            finally:
                await session.end_turn()

        task = asyncio.ensure_future(finish())
        self._finishing.add(task)
        task.add_done_callback(self._finishing.discard)

    async def _start_unless_cancelled(
        self, session: KernelSession, request: EvalRequest, start: Awaitable[Any], cancel: asyncio.Event
    ) -> Any:
        """``start``'s result, unless the call is cancelled (interrupt, delete, client gone) first: then
        the call answers cancelled at once (:class:`_StillStarting`) and the start goes on."""
        task = asyncio.ensure_future(start)
        if not await _unless_cancelled(task, cancel):
            answer = eval_answer(session, request, [], [], restarted=False, cancelled=True)
            raise _StillStarting(answer, task)
        return task.result()

    async def _start_kernel(self, session: KernelSession, request: EvalRequest, cwd: str) -> None:
        """A fresh, initialized kernel for the session (in place of its current one, if any); how long
        that took goes to ``session.start_seconds`` (the call's own timeout does not count it)."""
        kernel_name = request.kernel_name or session.kernel_name or self.kernels.default_kernel_name
        loop = asyncio.get_running_loop()
        began = loop.time()

        async def launch() -> tuple[str, KernelConnection]:
            # A warm pooled kernel when one of this spec is ready; its init step runs just below.
            pooled = await self.pool.take(kernel_name)
            return pooled or await self.recovery.launch(session, kernel_name, request.cwd)

        await session.start_kernel(kernel_name, launch)
        await self._ensure_init(session, request, cwd)
        session.start_seconds = (session.start_seconds or 0.0) + loop.time() - began

    async def _ensure_init(self, session: KernelSession, request: EvalRequest, cwd: str) -> None:
        spec = self._init_spec(session, request, cwd)
        if session.init == spec or session.closed:
            return
        self.artifacts.session_dir(session.key)  # the kernel is told ARTIFACTS exists
        result = await self.cells.execute(
            session,
            build_init_code(spec),
            index=-1,
            deadline=asyncio.get_running_loop().time() + self.init_timeout,
            timeout=self.init_timeout,
            cancel=asyncio.Event(),
            silent=True,
        )
        if result.kernel_died and session.closed:
            return  # shut down by a DELETE during the init step, not dead
        if result.kernel_died:
            await session.mark_dead()
            raise AgentToolsError(
                f"The kernel of session {session.name!r} died while starting; retry the call",
                503,
                retry_after=RETRY_AFTER_MOMENT,
            )
        session.init = spec
        session.cwd_notice = cwd_missing_notice(result.error)

    @staticmethod
    def _check_kernel_name(session: KernelSession, request: EvalRequest) -> None:
        """409 for a call naming another kernel than the session runs, without ``reset``."""
        if (
            request.kernel_name
            and session.kernel_id
            and session.kernel_name
            and request.kernel_name != session.kernel_name
            and not request.reset
        ):
            raise Conflict(
                f'Session {session.name!r} runs kernel {session.kernel_name!r}; send "reset": true '
                f"to switch it to {request.kernel_name!r}, or use another session"
            )

    async def _ready_as_is(self, session: KernelSession, request: EvalRequest, cwd: str) -> bool:
        """Whether the session's kernel runs the call as it is: ready, alive, initialized for this call
        and nothing to tell (most calls). Then :meth:`_prepare` would do nothing, and the call skips
        the task that makes it cancellable (a tenth of a millisecond of every eval)."""
        conn = session.connection
        return (
            not request.reset
            and session.state is SessionState.READY
            and conn is not None
            and session.undelivered_notice is None
            and session.init == self._init_spec(session, request, cwd)
            and not conn.lost_state
            and await conn.is_alive()
        )

    async def _prepare(
        self, session: KernelSession, request: EvalRequest, cwd: str, notices: list[str]
    ) -> bool:
        """Make sure the session has a live, initialized kernel. True if it had to be restarted."""
        earlier, session.undelivered_notice = session.undelivered_notice, None
        if earlier is not None and not request.reset:
            notices.append(earlier)
        notice = None if request.reset else await self.recovery.revive(session)
        if notice is not None:
            notices.append(notice)
        if request.reset or session.state is not SessionState.READY:
            await self._start_kernel(session, request, cwd)
        else:
            await self._ensure_init(session, request, cwd)
        return notice is not None or (earlier is not None and not request.reset)

    async def _run_turn(
        self,
        session: KernelSession,
        request: EvalRequest,
        cwd: str,
        emit: Emit,
        cancel: asyncio.Event,
        pace: StreamPace | None,
    ) -> EvalAnswer:
        notices: list[str] = []
        lost, session.predecessor_gone = session.predecessor_gone, None
        if lost is not None:
            notices.append(lost_notice(session.name, lost))
        answer = functools.partial(eval_answer, session_lost=lost)
        session.cwd = request.cwd
        session.start_seconds = None
        self._check_kernel_name(session, request)
        try:
            restarted = False
            if not await self._ready_as_is(session, request, cwd):
                restarted = await self._start_unless_cancelled(
                    session, request, self._prepare(session, request, cwd, notices), cancel
                )
        except _StillStarting:
            session.predecessor_gone = lost  # told to the next call, which will run
            raise
        if session.closed or cancel.is_set():  # deleted or interrupted as its kernel became ready
            return answer(session, request, [], notices, restarted=restarted, cancelled=True)
        self._start_notices(session, request, notices)
        run = await self._run_cells(session, request, emit, cancel, pace, _ReplaceKernel(self, request, cwd))
        notices += run.notices
        return answer(
            session,
            request,
            run.ran,
            notices,
            restarted=restarted or run.restarted,
            error=run.error,
            start_seconds=session.start_seconds,
        )

    @staticmethod
    def _start_notices(session: KernelSession, request: EvalRequest, notices: list[str]) -> None:
        """Tell the caller a slow kernel start (not counted in its timeout) and a cwd the kernel lacks."""
        if session.start_seconds is not None and session.start_seconds >= SLOW_START_SECONDS:
            notices.append(start_notice(session.start_seconds, request.timeout))
        if session.cwd_notice is not None:
            notices.append(session.cwd_notice)

    async def _run_cells(
        self,
        session: KernelSession,
        request: EvalRequest,
        emit: Emit,
        cancel: asyncio.Event,
        pace: StreamPace | None,
        policy: _ReplaceKernel | None,
    ) -> CellsRun:
        # The timeout budget covers running the cells, not waiting for a kernel to start.
        return await self.cells.run_cells(
            session,
            eval_cells(request),
            emit=emit,
            cancel=cancel,
            deadline=asyncio.get_running_loop().time() + request.timeout,
            timeout=request.timeout,
            pace=pace,
            hooks=CellHooks(policy=policy or KeepKernel()),
            total=len(request.cells),
        )

    # -- per-call mode ------------------------------------------------------------------------------

    async def _run_per_call(
        self, request: EvalRequest, cwd: str, emit: Emit, cancel: asyncio.Event, pace: StreamPace | None
    ) -> EvalAnswer:
        session = self.sessions.open_per_call()
        if not await session.take_turn(cancel):
            await self.sessions.close_per_call(session)
            return eval_answer(session, request, [], notices=[], restarted=False, cancelled=True)
        session.cwd = request.cwd
        still_starting: asyncio.Future[Any] | None = None
        try:
            start = self._start_kernel(session, request, cwd)
            await self._start_unless_cancelled(session, request, start, cancel)
            if session.closed or cancel.is_set():  # deleted or interrupted as its kernel became ready
                return eval_answer(session, request, [], [], restarted=False, cancelled=True)
            notices: list[str] = []
            self._start_notices(session, request, notices)
            run = await self._run_cells(session, request, emit, cancel, pace, None)
            return eval_answer(
                session, request, run.ran, notices, restarted=False, start_seconds=session.start_seconds
            )
        except _StillStarting as still:
            still_starting = still.start
            return still.answer
        finally:
            # The answer does not wait for the kernel process to exit (a pooled kernel makes the call
            # itself take milliseconds); server stop waits for it. A start still running stops the
            # kernel it gets itself (the session is closed).
            await self.sessions.close_per_call(session, wait=False)
            if still_starting is not None:
                self._end_turn_after(session, still_starting)
            else:
                await session.end_turn()

"""The eval service: run a request's cells in a session (or per-call) kernel and build the answer.

Handlers call :meth:`EvalService.run` with an ``emit`` callback for streamed events and a ``cancel``
event (set when the client goes away). Recovery from kernel death lives here: a session found dead is
restarted before a run; a kernel that dies during a run is restarted and the call is run once more.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from collections.abc import Callable
from typing import Any
from uuid import uuid4

from jupyter_core.utils import ensure_async
from tornado.web import HTTPError

from ..artifacts import ArtifactStore
from ..errors import AgentToolsError, BadRequest, Conflict, Unavailable
from .executor import CellExecution, ExecutionLimits, run_cell
from .kernels import KernelService, close_quietly
from .messages import CellOutcome, OutputLimits, format_combined_output
from .recovery import fd_usage, is_fd_exhaustion
from .request import EvalRequest, parse_eval_request
from .sessions import InitSpec, KernelSession, SessionManager
from .sink import OutputSink

Emit = Callable[[dict[str, Any]], None]
RESTART_LIMIT_MESSAGE = "Python kernel restarted too many times in this session"
STATE_LOST_NOTICE = (
    "[Kernel died during this call and was restarted; state from earlier calls was lost. "
    "The call was run again from its first cell.]"
)
DEAD_BEFORE_RUN_NOTICE = "[Kernel had died and was restarted before this call; earlier state was lost.]"
RESTARTED_BY_MANAGER_NOTICE = (
    "[Kernel was restarted by the server since the last call; earlier state was lost.]"
)


def build_init_code(spec: InitSpec) -> str:
    """The silent init step: cwd, environment, and cwd on ``sys.path``."""
    env = dict(spec.env)
    return (
        "def __agent_tools_init():\n"
        "    import os, sys\n"
        f"    cwd = {spec.cwd!r}\n"
        "    try:\n"
        "        os.chdir(cwd)\n"
        "    except OSError:\n"
        "        pass\n"
        f"    os.environ.update({env!r})\n"
        "    if cwd not in sys.path:\n"
        "        sys.path.insert(0, cwd)\n"
        "__agent_tools_init()\n"
        "del __agent_tools_init\n"
    )


def _noop(_: dict[str, Any]) -> None:
    return None


class EvalService:
    """Runs eval requests on the server's kernel manager."""

    def __init__(
        self,
        sessions: SessionManager,
        kernels: KernelService,
        artifacts: ArtifactStore,
        contents_manager: Any,
        *,
        max_output_bytes: int = 50 * 1024,
        interrupt_grace: float = 5.0,
        max_cells: int = 100,
        liveness_interval: float = 1.0,
        output_limits: OutputLimits | None = None,
    ):
        self.sessions = sessions
        self.kernels = kernels
        self.artifacts = artifacts
        self.contents_manager = contents_manager
        self.max_output_bytes = max_output_bytes
        self.interrupt_grace = interrupt_grace
        self.max_cells = max_cells
        self.liveness_interval = liveness_interval
        self.output_limits = output_limits or OutputLimits()
        self.per_call: dict[str, KernelSession] = {}

    def list_sessions(self) -> list[dict[str, Any]]:
        return self.sessions.list() + [s.describe() for s in self.per_call.values()]

    async def shutdown(self) -> None:
        """Shut down every kernel this service started: sessions' and per-call ones still running."""
        await self.sessions.shutdown()
        running = list(self.per_call.values())
        for session in running:
            session.closed = True
            if session.cancel is not None:
                session.cancel.set()
        await asyncio.gather(*(self.sessions.stop_kernel(s) for s in running), return_exceptions=True)

    async def _resolve_cwd(self, cwd: str) -> str:
        cm = self.contents_manager
        problem = f"'cwd' must be an existing directory inside the server root (got {cwd!r})"
        try:
            if not await ensure_async(cm.dir_exists(cwd)):
                raise BadRequest(problem)
            if cwd and not cm.allow_hidden and await ensure_async(cm.is_hidden(cwd)):
                raise BadRequest(problem)
        except HTTPError:
            raise BadRequest(problem) from None
        return str(self.kernels.kernel_manager.cwd_for_path(cwd))

    def _init_spec(self, session: KernelSession, request: EvalRequest, cwd: str) -> InitSpec:
        env = dict(request.env)
        if request.session_file is not None:
            env["PI_SESSION_FILE"] = request.session_file
        env["ARTIFACTS"] = str(self.artifacts.session_path(session.name))
        return InitSpec(cwd=cwd, env=tuple(sorted(env.items())), session_file=request.session_file)

    async def run(
        self, body: Any, *, emit: Emit | None = None, cancel: asyncio.Event | None = None
    ) -> dict[str, Any]:
        """Run an eval request body; return the answer (also emitted last as a ``result`` event)."""
        request = parse_eval_request(body, self.max_cells)
        cwd = await self._resolve_cwd(request.cwd)
        emit = emit or _noop
        cancel = cancel or asyncio.Event()
        if request.mode == "per-call":
            result = await self._run_per_call(request, cwd, emit, cancel)
        else:
            result = await self._run_session(request, cwd, emit, cancel)
        emit({"type": "result", "result": result})
        return result

    # -- session mode -------------------------------------------------------------------------------

    async def _run_session(
        self, request: EvalRequest, cwd: str, emit: Emit, cancel: asyncio.Event
    ) -> dict[str, Any]:
        while True:
            session = await self.sessions.acquire(request.session)
            session.waiting += 1
            try:
                acquired = await self._wait_turn(session, cancel)
            finally:
                session.waiting -= 1
            if not acquired:
                return self._answer(session, request, [], notices=[], restarted=False, cancelled=True)
            if not session.closed:
                break
            session.lock.release()  # shut down while we waited: take the session's successor
        try:
            session.busy, session.cancel = True, cancel
            return await self._run_locked(session, request, cwd, emit, cancel)
        finally:
            session.busy, session.cancel = False, None
            session.last_used = time.time()
            if session.closed and session.kernel_id is not None:
                # DELETE /sessions/{name} (or eviction) happened during the run: nothing may outlive it.
                await self.sessions.stop_kernel(session)
            session.lock.release()

    async def _wait_turn(self, session: KernelSession, cancel: asyncio.Event) -> bool:
        """Wait for the session's FIFO turn; False if the caller cancelled first."""
        if not session.lock.locked():
            await session.lock.acquire()
            return True
        acquire = asyncio.ensure_future(session.lock.acquire())
        cancelled = asyncio.ensure_future(cancel.wait())
        try:
            await asyncio.wait({acquire, cancelled}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            cancelled.cancel()
        if acquire.done() and not acquire.cancelled():
            if cancel.is_set():
                session.lock.release()
                return False
            return True
        acquire.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await acquire
        if acquire.done() and not acquire.cancelled():
            session.lock.release()
        return False

    async def _start_kernel(self, session: KernelSession, request: EvalRequest, cwd_api: str) -> None:
        """Start and connect the session's kernel, recovering once from descriptor exhaustion."""
        kernel_name = request.kernel_name or session.kernel_name or self.kernels.default_kernel_name

        def on_retry(status: int, message: str) -> None:
            self.sessions.record(
                session,
                "create_retries",
                "kernel creation failed with HTTP %d (%s); retrying once",
                status,
                message,
            )

        try:
            kernel_id, conn = await self.kernels.launch(kernel_name, cwd_api, on_retry)
        except Exception as first:
            if not is_fd_exhaustion(first):
                raise
            usage = fd_usage()
            released = await self.sessions.release_idle(exclude=session)
            self.sessions.record(
                session,
                "emfile_recoveries",
                "out of file descriptors starting a kernel (%s: %s); shut down %d idle agent session(s) "
                "%s and retrying once",
                usage.describe() if usage else "descriptor count unknown",
                first,
                len(released),
                released,
            )
            gc.collect()
            try:
                kernel_id, conn = await self.kernels.launch(kernel_name, cwd_api, on_retry)
            except Exception as second:
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
                    f"shutting down {len(released)} idle agent session(s): "
                    f"{usage.describe() if usage else second}. Raise the server's limit (ulimit -n, "
                    "systemd LimitNOFILE) or stop unused kernels and terminals, then retry.",
                    retry_after=30,
                ) from second
        session.kernel_id, session.kernel_name, session.connection = kernel_id, kernel_name, conn

    async def _replace_kernel(self, session: KernelSession, request: EvalRequest, cwd: str) -> None:
        """A fresh, initialized kernel for the session in place of its current one."""
        await self.sessions.stop_kernel(session)
        await self._start_kernel(session, request, request.cwd)
        await self._ensure_init(session, request, cwd)

    async def _ensure_init(self, session: KernelSession, request: EvalRequest, cwd: str) -> None:
        spec = self._init_spec(session, request, cwd)
        if session.init == spec:
            return
        self.artifacts.session_dir(session.name)  # the kernel is told ARTIFACTS exists
        assert session.connection is not None and session.kernel_id is not None
        kernel_id = session.kernel_id
        sink = OutputSink(max_bytes=self.max_output_bytes)
        try:
            result = await run_cell(
                session.connection,
                build_init_code(spec),
                index=-1,
                sink=sink,
                limits=ExecutionLimits(
                    deadline=asyncio.get_running_loop().time() + 60,
                    timeout_seconds=60,
                    interrupt_grace=self.interrupt_grace,
                    liveness_interval=self.liveness_interval,
                ),
                cancel=asyncio.Event(),
                interrupt=lambda: self.kernels.interrupt(kernel_id),
                emit=_noop,
                silent=True,
            )
        finally:
            sink.close()
        if result.kernel_died:
            await self.sessions.stop_kernel(session)
            raise AgentToolsError(
                f"The kernel of session {session.name!r} died while starting; retry the call",
                503,
                retry_after=1,
            )
        session.init = spec

    async def _prepare(
        self, session: KernelSession, request: EvalRequest, cwd: str, notices: list[str]
    ) -> bool:
        """Make sure the session has a live, initialized kernel. True if it had to be restarted."""
        restarted = False
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
        connection = session.connection
        if request.reset:
            if session.kernel_id:
                await self.sessions.stop_kernel(session)
            session.lost_kernel = False
        elif session.kernel_id and (connection is None or not await connection.is_alive()):
            self.sessions.record(session, "restarts", "kernel found dead before a run; restarting it")
            session.restarts += 1
            restarted = True
            notices.append(DEAD_BEFORE_RUN_NOTICE)
            await self.sessions.stop_kernel(session)
        elif session.lost_kernel:
            session.lost_kernel = False
            session.restarts += 1
            restarted = True
            notices.append(DEAD_BEFORE_RUN_NOTICE)
        elif connection is not None and connection.lost_state:
            self.sessions.record(
                session, "manager_restarts", "kernel was restarted by its kernel manager; re-running init"
            )
            # The manager's restarter gives the new kernel process new ports: reconnect.
            session.connection = None
            await close_quietly(connection)
            session.connection = await self.kernels.connect(session.kernel_id)
            session.init = None
            session.restarts += 1
            restarted = True
            notices.append(RESTARTED_BY_MANAGER_NOTICE)
        if session.kernel_id is None:
            await self._start_kernel(session, request, request.cwd)
        await self._ensure_init(session, request, cwd)
        return restarted

    async def _run_locked(
        self,
        session: KernelSession,
        request: EvalRequest,
        cwd: str,
        emit: Emit,
        cancel: asyncio.Event,
    ) -> dict[str, Any]:
        notices: list[str] = []
        restarted = await self._prepare(session, request, cwd, notices)
        # The timeout budget covers running the cells, not waiting for a kernel to start.
        deadline = asyncio.get_running_loop().time() + request.timeout
        restarts_this_call = 0
        while True:
            cells = await self._run_cells(session, request, emit, cancel, deadline)
            last = cells[-1][1] if cells else None
            if (
                last is not None
                and last.cancelled
                and not last.settled
                and not last.kernel_died
                and not session.closed
            ):
                self.sessions.record(
                    session, "wedged_restarts", "kernel did not settle after an interrupt; restarting it"
                )
                session.restarts += 1
                await self._replace_kernel(session, request, cwd)
            if last is None or not last.kernel_died or cancel.is_set() or session.closed:
                break
            if restarts_this_call >= 1:
                self.sessions.record(session, "restart_limit", "kernel died again after a restart")
                await self.sessions.stop_kernel(session)
                return self._answer(
                    session, request, cells, notices, restarted=True, error=RESTART_LIMIT_MESSAGE
                )
            restarts_this_call += 1
            session.restarts += 1
            restarted = True
            self.sessions.record(session, "restarts", "kernel died during a run; restarting and re-running")
            notices.append(STATE_LOST_NOTICE)
            emit({"type": "restart", "session": session.name, "message": STATE_LOST_NOTICE})
            await self._replace_kernel(session, request, cwd)
        return self._answer(session, request, cells, notices, restarted=restarted)

    async def _run_cells(
        self,
        session: KernelSession,
        request: EvalRequest,
        emit: Emit,
        cancel: asyncio.Event,
        deadline: float,
    ) -> list[tuple[int, CellExecution]]:
        conn, kernel_id = session.connection, session.kernel_id
        assert conn is not None and kernel_id is not None
        results: list[tuple[int, CellExecution]] = []
        for index, cell in enumerate(request.cells):
            if cancel.is_set():
                break
            emit({"type": "cell_start", "index": index, "title": cell.title})
            sink = OutputSink(
                max_bytes=self.max_output_bytes,
                open_artifact=lambda: self.artifacts.create(session.name),
            )
            try:
                execution = await run_cell(
                    conn,
                    cell.code,
                    index=index,
                    sink=sink,
                    limits=ExecutionLimits(
                        deadline=deadline,
                        timeout_seconds=request.timeout,
                        interrupt_grace=self.interrupt_grace,
                        liveness_interval=self.liveness_interval,
                    ),
                    cancel=cancel,
                    interrupt=lambda: self.kernels.interrupt(kernel_id),
                    emit=emit,
                    output_limits=self.output_limits,
                )
            finally:
                sink.close()
            session.executions += 1
            if execution.idle_missing:
                self.sessions.record(
                    session,
                    "lost_idle",
                    "the kernel's idle status for a finished execution never arrived (iopub messages "
                    "were dropped by a slow subscriber); the cell's output may be incomplete",
                )
            results.append((index, execution))
            emit(
                {
                    "type": "cell_end",
                    "index": index,
                    "status": execution.status,
                    "exit_code": execution.exit_code,
                    "duration_ms": execution.duration_ms,
                }
            )
            if execution.status != "complete":
                break
        return results

    # -- per-call mode ------------------------------------------------------------------------------

    async def _run_per_call(
        self, request: EvalRequest, cwd: str, emit: Emit, cancel: asyncio.Event
    ) -> dict[str, Any]:
        session = KernelSession(name=f"per-call-{uuid4().hex[:12]}", mode="per-call")
        self.per_call[session.name] = session
        session.busy, session.cancel = True, cancel
        try:
            await self._start_kernel(session, request, request.cwd)
            await self._ensure_init(session, request, cwd)
            deadline = asyncio.get_running_loop().time() + request.timeout
            cells = await self._run_cells(session, request, emit, cancel, deadline)
            return self._answer(session, request, cells, [], restarted=False)
        finally:
            self.per_call.pop(session.name, None)
            await self.sessions.stop_kernel(session)

    # -- the answer ---------------------------------------------------------------------------------

    def _answer(
        self,
        session: KernelSession,
        request: EvalRequest,
        cells: list[tuple[int, CellExecution]],
        notices: list[str],
        *,
        restarted: bool,
        cancelled: bool = False,
        error: str | None = None,
    ) -> dict[str, Any]:
        cell_results = []
        outcomes = []
        for index, execution in cells:
            summary = execution.summary
            assert summary is not None
            title = request.cells[index].title
            cell_results.append(
                {
                    "index": index,
                    "title": title,
                    "status": execution.status,
                    "output": summary.output,
                    "exit_code": execution.exit_code,
                    "error": execution.error,
                    "displays": execution.displays,
                    "duration_ms": execution.duration_ms,
                    "stdin_requested": execution.stdin_requested,
                    "truncated": summary.truncated,
                    "total_bytes": summary.total_bytes,
                    "total_lines": summary.total_lines,
                    "output_bytes": summary.output_bytes,
                    "output_lines": summary.output_lines,
                    "artifact_id": summary.artifact_id,
                }
            )
            outcomes.append(
                CellOutcome(
                    index=index,
                    title=title,
                    status=execution.status,
                    output=summary.output,
                    exit_code=execution.exit_code,
                    has_displays=bool(execution.displays),
                )
            )
        output = format_combined_output(outcomes, len(request.cells)) if outcomes else ""
        if error:
            output = f"{output}\n{error}".strip("\n")
        if notices:
            output = "\n".join([*notices, output]) if output else "\n".join(notices)
        if cancelled and not cells:
            output = "(cancelled before it started)"
        return {
            "session": session.name if session.mode == "session" else None,
            "mode": session.mode,
            "kernel_id": session.kernel_id,
            "cancelled": cancelled or any(e.cancelled for _, e in cells),
            "timed_out": any(e.timed_out for _, e in cells),
            "restarted": restarted,
            "error": error,
            "output": output,
            "cells": cell_results,
        }

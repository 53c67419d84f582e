"""The one cell loop below eval, eval in a notebook's kernel and notebook runs, and one cell's execution.

:meth:`CellExecutor.execute` runs one cell on a session's kernel (the one execution path: eval's cells,
its silent init step, a notebook run's cells). :meth:`CellExecutor.run_cells` runs a call's cells in
order, as nbclient's one ``async_execute`` does: the ``cell_start``/``cell_end`` events, the session's
progress, which cells run after a failure, and what is done after a cell whose kernel died or that would
not stop. What differs between its callers comes in as hooks: ``run_cell`` (a notebook run stores the
cell's outputs), ``not_run`` (a run names the cells it did not run) and a :class:`KernelPolicy` (an eval
session re-runs the call in a new kernel; a notebook's kernel is let go or restarted in place; a per-call
kernel is simply closed).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from traitlets import Instance

from ..artifacts import ArtifactStore
from ..audit.events import ExecutionRecord
from ..service import Service
from ..stream_events import CellEnd, CellStart, StreamEvent
from .executor import CellExecution, Emit, ExecutionLimits, Observer, noop, run_cell
from .kernel_service import KernelService
from .kernel_session import KernelSession
from .messages import OutputLimits, answer_text
from .pace import StreamPace
from .request import EvalRequest, parse_eval_request
from .session_manager import EvalSessionManager
from .sink import OutputSink

# Iopub messages were dropped past what the connection holds (or by a gateway), seen as dropped or as an
# end-of-output status that never came: what the answer and the artifact hold may lack part of the output.
OUTPUT_MAY_BE_INCOMPLETE = (
    "[Output messages of the kernel were dropped on their way to the server (more than it holds for a "
    "reader was waiting): part of the output may be missing from this answer and its artifact.]"
)


@dataclass(frozen=True)
class CellLimits:
    """What bounds one cell's execution (given from ``EvalService``'s settings)."""

    max_output_bytes: int
    interrupt_grace: float
    liveness_interval: float
    output_limits: OutputLimits


@dataclass(frozen=True)
class Cell:
    """A cell of a call: ``index`` as events and the session's progress name it (its place in an eval
    request, in the notebook for a run); ``cell_id`` is in the events of a notebook's cell."""

    index: int
    code: str
    title: str | None
    cell_id: str | None = None
    notebook: bool = False

    def start_event(self) -> CellStart:
        if self.notebook:
            return {"type": "cell_start", "index": self.index, "cell_id": self.cell_id, "title": self.title}
        return {"type": "cell_start", "index": self.index, "title": self.title}

    def end_event(self, execution: CellExecution, execution_count: int | None) -> CellEnd:
        """Its ``cell_end``; a notebook's cell also names its id and the execution count it got."""
        if self.notebook:
            return {
                "type": "cell_end",
                "index": self.index,
                "cell_id": self.cell_id,
                "status": execution.status,
                "exit_code": execution.exit_code,
                "duration_ms": execution.duration_ms,
                "execution_count": execution_count,
            }
        return {
            "type": "cell_end",
            "index": self.index,
            "status": execution.status,
            "exit_code": execution.exit_code,
            "duration_ms": execution.duration_ms,
        }


@dataclass(frozen=True)
class Ran:
    """A cell that ran: its place among the call's cells (``position``) and how it ran."""

    cell: Cell
    position: int
    execution: CellExecution


@dataclass(frozen=True)
class Told:
    """What a :class:`KernelPolicy` decided after a cell whose kernel died or would not stop."""

    notice: str | None = None  # for the answer, and a ``restart`` event
    error: str | None = None  # the call ends with this error
    rerun: bool = False  # run the call's cells again, from the first
    then: Callable[[], Awaitable[None]] | None = None  # after the notice is told (start a new kernel...)


class KernelPolicy(Protocol):
    """What is done after a cell whose kernel died or would not stop, and what is told."""

    async def after(
        self, session: KernelSession, ran: Ran, reruns: int, cancel: asyncio.Event
    ) -> Told | None:
        """None: the kernel is fine (or nothing is done); the loop goes on by its own rules."""
        ...


# Runs one cell (given its place among the call's cells): how it ran, the execution count it got.
RunCell = Callable[[Cell, int, Emit], Awaitable[tuple[CellExecution, int | None]]]


@dataclass
class CellsRun:
    """What :meth:`CellExecutor.run_cells` did: the cells that ran (of the last pass, after a re-run),
    the notices told, whether the kernel was restarted, and the error that ended the call."""

    ran: list[Ran] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)
    restarted: bool = False
    error: str | None = None


def noting_output(session: KernelSession, emit: Emit) -> Emit:
    """``emit`` that also notes on the session when it last produced output (the sessions listing)."""

    def noting(event: StreamEvent) -> None:
        if event.get("type") in ("chunk", "display"):
            session.last_output_at = time.time()
        emit(event)

    return noting


class CellExecutor(Service):
    """Runs cells on a session's kernel: one cell (:meth:`execute`) and a call's cells (:meth:`run_cells`).

    Given to ``EvalService`` and ``NotebookRunner`` alike (by default ``EvalService`` builds it from its
    output and interrupt settings, and the application gives that one to the runner)."""

    kernels = Instance(
        KernelService, help="Interrupts the kernel when a cell's time is up or it is cancelled."
    )
    artifacts = Instance(ArtifactStore, help="Where spilled outputs live.")
    sessions = Instance(EvalSessionManager, help="Records what happened to a session (lost idle status).")
    limits = Instance(CellLimits, help="Bounds of one cell's execution.")

    async def execute(
        self,
        session: KernelSession,
        code: str,
        *,
        index: int,
        deadline: float,
        timeout: float,
        cancel: asyncio.Event,
        emit: Emit = noop,
        silent: bool = False,
        images: bool = True,
        observer: Observer | None = None,
        pace: StreamPace | None = None,
    ) -> CellExecution:
        """Run one cell on the session's kernel: the one execution path of eval's cells, its silent init
        step (no artifact, not counted) and a notebook run's cells (``observer``: the stored outputs;
        ``images=False``: its images are answered from what the cell stored). A deadline or cancel
        interrupts the kernel, which gets ``interrupt_grace``."""
        conn, kernel_id = session.connection, session.kernel_id
        assert conn is not None and kernel_id is not None
        limits = self.limits
        sink = OutputSink(
            max_bytes=limits.max_output_bytes,
            open_artifact=None if silent else lambda: self.artifacts.create(session.key),
        )
        output_limits = limits.output_limits
        if not images:
            output_limits = dataclasses.replace(output_limits, images=False)
        try:
            execution = await run_cell(
                conn,
                code,
                index=index,
                sink=sink,
                limits=ExecutionLimits(
                    deadline=deadline,
                    timeout_seconds=timeout,
                    interrupt_grace=limits.interrupt_grace,
                    liveness_interval=limits.liveness_interval,
                ),
                cancel=cancel,
                interrupt=lambda: self.kernels.interrupt(kernel_id),
                emit=emit,
                silent=silent,
                output_limits=output_limits,
                observer=observer,
                pace=pace,
            )
        finally:
            sink.close()
            if not silent:
                session.executions += 1
        if execution.execution_count is not None and not silent:
            session.execution_count = execution.execution_count
        return execution

    async def run_cells(
        self,
        session: KernelSession,
        cells: Sequence[Cell],
        *,
        emit: Emit,
        cancel: asyncio.Event,
        deadline: float,
        timeout: float,
        pace: StreamPace | None,
        policy: KernelPolicy | None = None,
        stop_on_error: bool = True,
        total: int | None = None,
        run_cell: RunCell | None = None,
        not_run: Callable[[Cell], None] | None = None,
    ) -> CellsRun:
        """The one cell loop: each cell in order, until one fails (``stop_on_error``; a cancelled one
        always stops the call) or the call is cancelled. A caller that names the cells it did not run
        (``not_run``) gets them, and no cell is started past the deadline; without it a cell started
        late times out at once, and the answer says so.
        After each cell ``policy`` says what is done to a kernel that died or would not stop; what it
        tells is a notice of the answer and a ``restart`` event, and the call then stops (or, asked to,
        runs its cells again from the first). ``run_cell`` runs one cell (default: :meth:`execute`) and
        gives the execution count its ``cell_end`` names; ``total``: the call's cells, for its progress."""
        emit = noting_output(session, emit)
        loop = asyncio.get_running_loop()
        done = CellsRun()
        reruns = 0
        while True:
            done.ran = []
            stopped = rerun = False
            for position, cell in enumerate(cells):
                if not_run is None and (stopped or cancel.is_set()):
                    break
                if not_run is not None and (stopped or cancel.is_set() or loop.time() >= deadline):
                    not_run(cell)
                    continue
                emit(cell.start_event())
                session.cell_started(cell.index, cell.cell_id, total)
                if run_cell is None:
                    execution = await self.execute(
                        session,
                        cell.code,
                        index=cell.index,
                        deadline=deadline,
                        timeout=timeout,
                        cancel=cancel,
                        emit=emit,
                        pace=pace,
                    )
                    execution_count = None
                else:
                    execution, execution_count = await run_cell(cell, position, emit)
                if execution.idle_missing:
                    self.sessions.record(
                        session,
                        "lost_idle",
                        "the kernel's idle status for a finished execution never arrived (iopub messages "
                        "were dropped: past KernelService.iopub_buffer_bytes and iopub_spill_bytes, by a "
                        "gateway, or by the kernel before the server took them); the cell's output may be "
                        "incomplete",
                    )
                ran = Ran(cell, position, execution)
                done.ran.append(ran)
                emit(cell.end_event(execution, execution_count))
                told = await policy.after(session, ran, reruns, cancel) if policy is not None else None
                if told is not None:
                    done.restarted = stopped = True
                    if told.notice is not None:
                        done.notices.append(told.notice)
                        emit({"type": "restart", "session": session.name, "message": told.notice})
                    if told.then is not None:
                        await told.then()
                    done.error = told.error
                    rerun = told.rerun
                elif execution.status != "complete" and (stop_on_error or execution.cancelled):
                    stopped = True
            if not rerun:
                return done
            reruns += 1


def parse_recorded(body: Any, max_cells: int, record: ExecutionRecord) -> EvalRequest:
    """An eval body parsed, its record filled in as far as it is known (mode, code, session)."""
    if isinstance(body, dict) and body.get("mode") in ("session", "per-call"):
        record.mode = body["mode"]
    request = parse_eval_request(body, max_cells)
    record.code = [cell.code for cell in request.cells]
    record.session = request.session if request.mode == "session" else None
    return request


def eval_cells(request: EvalRequest) -> list[Cell]:
    """An eval request's cells, as the loop runs them."""
    return [Cell(index, cell.code, cell.title) for index, cell in enumerate(request.cells)]


def eval_answer(
    session: KernelSession,
    request: EvalRequest,
    ran: list[Ran],
    notices: list[str],
    *,
    restarted: bool,
    cancelled: bool = False,
    error: str | None = None,
    session_lost: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The answer of an eval request (in a session, per-call or in a notebook's kernel)."""
    cell_results = []
    outcomes = []
    for r in ran:
        title = request.cells[r.cell.index].title
        cell_results.append({"index": r.cell.index, "title": title, **r.execution.result_fields()})
        outcomes.append(r.execution.outcome(r.cell.index, title))
    if any(r.execution.idle_missing or r.execution.output_lost for r in ran):
        notices = [*notices, OUTPUT_MAY_BE_INCOMPLETE]
    output = answer_text(outcomes, len(request.cells), notices, error)
    if cancelled and not ran:
        output = "(cancelled before it started)"
    return {
        "session": session.name if session.mode == "session" else None,
        "mode": session.mode,
        "kernel_id": session.kernel_id,
        "cancelled": cancelled or any(r.execution.cancelled for r in ran),
        "timed_out": any(r.execution.timed_out for r in ran),
        "restarted": restarted,
        "session_lost": session_lost,
        "error": error,
        "output": output,
        "cells": cell_results,
    }

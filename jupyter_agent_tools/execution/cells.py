"""The one cell loop below eval, eval in a notebook's kernel and notebook runs, and one cell's execution.

:meth:`CellExecutor.execute` runs one cell on a session's kernel (the one execution path: eval's cells,
its silent init step, a notebook run's cells). :meth:`CellExecutor.run_cells` runs a call's cells in
order, as nbclient's one ``async_execute`` does: the ``cell_start``/``cell_end`` events, the session's
progress, which cells run after a failure, and what is done after a cell whose kernel died or that would
not stop. What differs between its callers comes in as :class:`CellHooks`, which the loop calls always (a
default does nothing, as nbclient's ``run_hook`` with no hook): ``run_cell`` (a notebook run stores the
cell's outputs), ``not_run`` (a run names the cells it did not run) and a :class:`KernelPolicy` (an eval
session re-runs the call in a new kernel; a notebook's kernel is let go or restarted in place; a per-call
kernel is simply closed); and as :class:`StopRules`, data, not the presence of a hook. An eval's answer is
built from what the loop did in :mod:`.eval_answer`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from traitlets import Float, Instance, Int, default, validate

from ..artifacts import ArtifactStore
from ..service import Service, at_least, honour_moved_settings, in_range
from ..stream_events import CellEnd, CellStart, StreamEvent
from .executor import CellExecution, Emit, ExecutionLimits, Observer, noop, run_cell
from .kernel_service import KernelService
from .kernel_session import KernelSession
from .messages import OutputLimits
from .pace import StreamPace
from .session_manager import EvalSessionManager
from .sink import OutputSink


@dataclass(frozen=True)
class CellLimits:
    """What bounds one cell's execution (built from ``CellExecutor``'s settings)."""

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


class KeepKernel:
    """The policy that does nothing after a cell (a per-call kernel is closed after the call anyway)."""

    async def after(
        self, session: KernelSession, ran: Ran, reruns: int, cancel: asyncio.Event
    ) -> Told | None:
        return None


def ignore_not_run(cell: Cell) -> None:
    """The ``not_run`` hook of a caller that does not name the cells it did not run."""


@dataclass(frozen=True)
class CellHooks:
    """What the loop calls, always, for what differs between its callers (nbclient's hooks).

    ``run_cell``: runs one cell and gives the execution count its ``cell_end`` names (None: the loop's
    :meth:`CellExecutor.execute`, with no count); ``not_run``: each cell the loop does not start;
    ``policy``: after each cell that ran, what is done to a kernel that died or would not stop."""

    run_cell: RunCell | None = None
    not_run: Callable[[Cell], None] = ignore_not_run
    policy: KernelPolicy = field(default_factory=KeepKernel)


@dataclass(frozen=True)
class StopRules:
    """When the loop stops starting cells (a cancelled call or cell always stops it).

    ``on_error``: a cell that did not complete stops the call (a notebook run's ``stop_on_error``);
    ``at_deadline``: no cell starts once the call's time is up (a notebook run, which names those cells
    not run); otherwise such a cell starts and times out at once, and the answer says so (eval)."""

    on_error: bool = True
    at_deadline: bool = False


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


# Settings that were EvalService's until 0.5: c.EvalService.<name> still applies, with a warning.
MOVED_FROM_EVAL_SERVICE = (
    "max_output_bytes",
    "interrupt_grace",
    "liveness_interval",
    "max_display_bytes",
    "max_html_convert_bytes",
)


class CellExecutor(Service):
    """Runs cells on a session's kernel: one cell (:meth:`execute`) and a call's cells (:meth:`run_cells`).

    Built once by the application and given to ``EvalService`` and ``NotebookRunner`` alike: its
    settings bound every cell either runs."""

    kernels = Instance(
        KernelService, help="Interrupts the kernel when a cell's time is up or it is cancelled."
    )
    artifacts = Instance(ArtifactStore, help="Where spilled outputs live.")
    sessions = Instance(EvalSessionManager, help="Records what happened to a session (lost idle status).")
    max_output_bytes = Int(
        50 * 1024,
        help="Bytes of output kept visible per cell; past it the tail is kept and the full output is "
        "spilled to an artifact.",
    ).tag(config=True)
    interrupt_grace = Float(
        5.0,
        help="Seconds to wait for a kernel to settle after an interrupt (timeout or cancel) before the "
        "kernel is restarted.",
    ).tag(config=True)
    liveness_interval = Float(
        1.0,
        help="Seconds without kernel messages after which a running execution checks that its kernel "
        "is still alive.",
    ).tag(config=True)
    max_display_bytes = Int(
        2 * 1024 * 1024,
        help="Bytes of display data (images as base64, JSON as text) a cell's answer carries inline; a "
        "display past it becomes a placeholder {type, mime, bytes, omitted: true, artifact_id} and its "
        "data is saved as an artifact. 0: every image and JSON display is a placeholder.",
    ).tag(config=True)
    max_html_convert_bytes = Int(
        128 * 1024,
        help="Bytes of an HTML output converted to markdown text (the text shown for outputs that only "
        "have HTML); a longer HTML is cut there, with a notice, and saved whole as an artifact. "
        "Converting runs at about 200 KB/s, off the event loop.",
    ).tag(config=True)
    limits = Instance(CellLimits, help="Bounds of one cell's execution (default: the settings above).")

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        honour_moved_settings(self, "EvalService", MOVED_FROM_EVAL_SERVICE, "0.5")

    @validate("max_output_bytes")
    def _valid_output(self, proposal: Any) -> int:
        return int(at_least(proposal, 1))

    @validate("interrupt_grace")
    def _valid_grace(self, proposal: Any) -> float:
        return float(at_least(proposal, 0))

    @validate("liveness_interval")
    def _valid_liveness(self, proposal: Any) -> float:
        return float(at_least(proposal, 0, strict=True))

    @validate("max_display_bytes")
    def _valid_display(self, proposal: Any) -> int:
        return in_range(proposal, 0, 1024**3)

    @validate("max_html_convert_bytes")
    def _valid_html(self, proposal: Any) -> int:
        return in_range(proposal, 1024, 16 * 1024 * 1024)

    @default("limits")
    def _default_limits(self) -> CellLimits:
        return CellLimits(
            max_output_bytes=self.max_output_bytes,
            interrupt_grace=self.interrupt_grace,
            liveness_interval=self.liveness_interval,
            output_limits=OutputLimits(
                display_bytes=self.max_display_bytes, html_convert_bytes=self.max_html_convert_bytes
            ),
        )

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
        hooks: CellHooks | None = None,
        rules: StopRules | None = None,
        total: int | None = None,
    ) -> CellsRun:
        """The one cell loop: each cell in order until ``rules`` stop it or the call is cancelled; every
        cell not started goes to ``hooks.not_run``. After each cell ``hooks.policy`` says what is done to
        a kernel that died or would not stop; what it tells is a notice of the answer and a ``restart``
        event, and the call then stops (or, asked to, runs its cells again from the first). ``total``:
        the call's cells, for the session's progress."""
        emit = noting_output(session, emit)
        loop = asyncio.get_running_loop()
        hooks, rules = hooks or CellHooks(), rules or StopRules()
        run_cell = hooks.run_cell or self._executing(session, deadline, timeout, cancel, pace)
        done = CellsRun()
        reruns = 0
        while True:
            done.ran = []
            stopped = rerun = False
            for position, cell in enumerate(cells):
                if stopped or cancel.is_set() or (rules.at_deadline and loop.time() >= deadline):
                    hooks.not_run(cell)
                    continue
                emit(cell.start_event())
                session.cell_started(cell.index, cell.cell_id, total)
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
                told = await hooks.policy.after(session, ran, reruns, cancel)
                if told is not None:
                    done.restarted = stopped = True
                    if told.notice is not None:
                        done.notices.append(told.notice)
                        emit({"type": "restart", "session": session.name, "message": told.notice})
                    if told.then is not None:
                        await told.then()
                    done.error = told.error
                    rerun = told.rerun
                elif execution.status != "complete" and (rules.on_error or execution.cancelled):
                    stopped = True
            if not rerun:
                return done
            reruns += 1

    def _executing(
        self,
        session: KernelSession,
        deadline: float,
        timeout: float,
        cancel: asyncio.Event,
        pace: StreamPace | None,
    ) -> RunCell:
        """The loop's own ``run_cell``: :meth:`execute` on the session's kernel, no execution count."""

        async def run_cell(cell: Cell, position: int, emit: Emit) -> tuple[CellExecution, int | None]:
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
            return execution, None

        return run_cell

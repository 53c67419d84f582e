"""Run a notebook's own cells in the notebook's own kernel and write their outputs back into it.

The kernel is the one a person sees: the jupyter_server session of the notebook's path (what JupyterLab
creates when it opens the notebook), created the way JupyterLab would when there is none, so a person
who opens the notebook afterwards shares the agent's state. The run goes through the same session
lifecycle as eval (:class:`~.session.KernelSession` in mode ``notebook``, which never owns the kernel)
and the same recovery policy, but never re-runs a cell silently: a kernel that dies or is restarted
ends the run and the answer says which cells did not complete.

Outputs are built as JupyterLab stores them (:mod:`..notebook.outputs`) and written through the
notebook store (:meth:`NotebookStore.change`: per-path lock, atomic save, deterministic bytes): a cell's
old outputs are cleared when it starts, its outputs saved when it ends; a notebook open in a
collaborative room gets them as they arrive.
"""

from __future__ import annotations

import asyncio
import posixpath
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from jupyter_core.utils import ensure_async
from traitlets import Any as AnyTrait
from traitlets import Instance, Int, validate

from ..audit.events import ExecutionRecord
from ..errors import AgentToolsError, BadRequest, Conflict
from ..notebook.format import join_source
from ..notebook.outputs import CellOutputs
from ..notebook.store import NotebookStore
from ..traits import Service, at_least, given
from .executor import CellExecution, ExecutionLimits, run_cell
from .messages import CellOutcome, format_combined_output
from .request import RunRequest, parse_run_request
from .service import EvalService
from .session import KernelSession, SessionState
from .sink import OutputSink

Emit = Callable[[dict[str, Any]], None]
# While a cell of a notebook open in a collaborative room runs, its outputs reach the live document at
# most this often (seconds): people see them stream without a Y update per message.
LIVE_OUTPUT_INTERVAL = 0.25
KERNEL_LOST_NOTICE = (
    "[The notebook's kernel died or was restarted during the run; its state is lost. Cells after it "
    "were not run, and nothing was run again.]"
)


@dataclass
class _Target:
    """A cell the request names, as it was when the run started."""

    index: int
    cell_id: str | None
    cell_type: str
    source: str


def _noop(_: dict[str, Any]) -> None:
    return None


class NotebookRunner(Service):
    """Runs notebook cells in the notebook's kernel; one run at a time per notebook, in arrival order.

    The application builds the class named by ``AgentToolsApp.notebook_runner_class``.
    """

    eval_service = Instance(EvalService, help="Runs the cells (sessions, kernels, artifacts).")
    store = Instance(NotebookStore, help="Reads the notebook and saves the outputs.")
    session_manager = AnyTrait(help="jupyter_server's session manager: the notebook's own kernel.")
    max_output_bytes_stored = Int(256 * 1024, help="Bytes of text one output may store in the notebook file.")

    @validate("max_output_bytes_stored")
    def _valid_stored(self, proposal: Any) -> int:
        return int(at_least(proposal, 1))

    def __init__(
        self,
        eval_service: EvalService | None = None,
        store: NotebookStore | None = None,
        session_manager: Any = None,
        **kwargs: Any,
    ):
        super().__init__(
            **given(kwargs, eval_service=eval_service, store=store, session_manager=session_manager)
        )

    @property
    def eval(self) -> EvalService:
        """The eval service (its short name in this module)."""
        return self.eval_service

    async def run(
        self, path: str, body: Any, *, emit: Emit | None = None, cancel: asyncio.Event | None = None
    ) -> dict[str, Any]:
        """Run the cells a request names; return the answer (also emitted last as a ``result`` event).

        The run is recorded when it ends (:meth:`Audit.execution`, mode ``notebook``), failed or not.
        """
        with self.eval.audit.executing("notebook") as record:
            record.result = await self._run(path, body, emit, cancel, record)
        return record.result

    async def _run(
        self, path: str, body: Any, emit: Emit | None, cancel: asyncio.Event | None, record: ExecutionRecord
    ) -> dict[str, Any]:
        request = parse_run_request(body)
        emit = emit or _noop
        cancel = cancel or asyncio.Event()
        path, notebook, hash_, _live = await self.store.load(path, writable=True)
        if request.expected_hash is not None and request.expected_hash != hash_:
            raise Conflict(
                f"Notebook changed since it was read: {path} (expected_hash {request.expected_hash}, "
                f"current hash {hash_}); read it again and retry"
            )
        record.path = path
        targets = _select(notebook, request, path)
        record.code = [t.source for t in targets if t.cell_type == "code"]
        kernel_id, kernel_name = await self._notebook_kernel(path, notebook)
        session = self.eval.sessions.for_notebook(path)
        record.session = session.name
        if not await session.take_turn(cancel):
            return self._answer(path, None, session, [], [], cancelled=True)
        try:
            notices: list[str] = []
            await self._attach(session, kernel_id, kernel_name, notices)
            async with self.store.grouped(path, "run") as group:  # one ledger entry for the whole run
                result = await self._run_targets(path, session, targets, request, emit, cancel, notices)
            result.update(group.fields() if group is not None else {})
        finally:
            await session.end_turn()
        emit({"type": "result", "result": result})
        return result

    # -- the kernel ------------------------------------------------------------------------------

    async def _notebook_kernel(self, path: str, notebook: dict[str, Any]) -> tuple[str, str]:
        """The kernel of the notebook's jupyter_server session, created as JupyterLab would if none."""
        for model in await ensure_async(self.session_manager.list_sessions()):
            kernel = model.get("kernel") or {}
            if model.get("path") == path and kernel.get("id"):
                return str(kernel["id"]), str(kernel.get("name") or "")
        spec = (notebook.get("metadata") or {}).get("kernelspec") or {}
        kernel_name = spec.get("name") if isinstance(spec.get("name"), str) else None
        kernel_name = kernel_name or self.eval.kernels.default_kernel_name
        await self.eval.kernels.check_kernel_name(kernel_name)  # 400 listing the installed ones
        try:
            model = await ensure_async(
                self.session_manager.create_session(
                    path=path, name=posixpath.basename(path), type="notebook", kernel_name=kernel_name
                )
            )
        except Exception as e:
            raise self.eval.kernels.translate(e) from e
        return str(model["kernel"]["id"]), kernel_name

    async def _attach(
        self, session: KernelSession, kernel_id: str, kernel_name: str, notices: list[str]
    ) -> None:
        """Connect the session to the notebook's kernel (again, when it was restarted or replaced)."""
        if session.kernel_id == kernel_id and session.state is SessionState.READY:
            notice = await self.eval.recovery.revive(session)
            if notice is not None:
                notices.append(notice.replace("restarted before this call", "lost before this run"))
            if session.state is SessionState.READY:
                return
        await session.start_kernel(kernel_name, lambda: self._connect(kernel_id), owned=False)

    async def _connect(self, kernel_id: str) -> tuple[str, Any]:
        return kernel_id, await self.eval.kernels.connect(kernel_id)

    # -- the cells -------------------------------------------------------------------------------

    async def _run_targets(
        self,
        path: str,
        session: KernelSession,
        targets: list[_Target],
        request: RunRequest,
        emit: Emit,
        cancel: asyncio.Event,
        notices: list[str],
    ) -> dict[str, Any]:
        deadline = asyncio.get_running_loop().time() + request.timeout
        code_cells = [t for t in targets if t.cell_type == "code"]
        cells: list[dict[str, Any]] = []
        outcomes: list[CellOutcome] = []
        stopped = False
        restarted = False
        hash_: str | None = None
        position = 0
        for target in targets:
            if target.cell_type != "code":
                cells.append(_not_run(target, "skipped"))
                continue
            position += 1
            if stopped or cancel.is_set() or asyncio.get_running_loop().time() >= deadline:
                cells.append(_not_run(target, "not_run"))
                continue
            title = target.cell_id
            emit({"type": "cell_start", "index": target.index, "cell_id": target.cell_id, "title": title})
            execution, outputs, written, hash_ = await self._run_one(
                path, session, target, request, emit, cancel, deadline
            )
            cells.append(_cell_result(target, execution, outputs, written))
            name = f"cell {target.index} (id {target.cell_id})" if target.cell_id else f"cell {target.index}"
            outcomes.append(
                CellOutcome(
                    index=position - 1,
                    title=name,
                    name=name,
                    status=execution.status,
                    output=execution.summary.output if execution.summary else "",
                    exit_code=execution.exit_code,
                    has_displays=bool(execution.displays),
                )
            )
            emit(
                {
                    "type": "cell_end",
                    "index": target.index,
                    "cell_id": target.cell_id,
                    "status": execution.status,
                    "exit_code": execution.exit_code,
                    "duration_ms": execution.duration_ms,
                    "execution_count": outputs.execution_count,
                }
            )
            if execution.kernel_died or (execution.cancelled and not execution.settled):
                restarted = True
                stopped = True
                notices.append(KERNEL_LOST_NOTICE)
                emit({"type": "restart", "session": session.name, "message": KERNEL_LOST_NOTICE})
                await session.mark_dead()  # disconnects; the next run attaches again
            elif execution.status != "complete" and (request.stop_on_error or execution.cancelled):
                stopped = True
        output = format_combined_output(outcomes, len(code_cells)) if outcomes else ""
        if notices:
            output = "\n".join([*notices, output]) if output else "\n".join(notices)
        result = self._answer(path, hash_, session, cells, [], restarted=restarted)
        result["output"] = output
        result["cancelled"] = cancel.is_set() or any(c["status"] == "cancelled" for c in cells)
        result["timed_out"] = any(c.get("timed_out") for c in cells)
        for cell in cells:
            cell.pop("timed_out", None)
        if result["hash"] is None:
            _, _, result["hash"], _ = await self.store.load(path)
        return result

    async def _run_one(
        self,
        path: str,
        session: KernelSession,
        target: _Target,
        request: RunRequest,
        emit: Emit,
        cancel: asyncio.Event,
        deadline: float,
    ) -> tuple[CellExecution, CellOutputs, bool, str | None]:
        artifacts = self.eval.artifacts
        outputs = CellOutputs(
            max_text_bytes=self.max_output_bytes_stored,
            open_artifact=lambda: artifacts.create(session.name),
        )
        written, hash_ = await self._write(path, target, outputs, clear=True)
        _, _, _, live = await self.store.load(path)
        changed, finished = asyncio.Event(), asyncio.Event()

        async def push_live() -> None:
            # Leading and trailing edge: the first output goes out at once, later ones at most every
            # LIVE_OUTPUT_INTERVAL, and an output that arrives while waiting is always pushed (a cell that
            # prints a line and then computes quietly shows that line while it computes).
            while True:
                await changed.wait()
                if finished.is_set():
                    return  # the final write follows
                changed.clear()
                await self._write(path, target, outputs, audited=False)
                try:
                    await asyncio.wait_for(finished.wait(), LIVE_OUTPUT_INTERVAL)
                    return
                except asyncio.TimeoutError:
                    pass

        pushing = asyncio.ensure_future(push_live()) if live else None

        def observe(msg_type: str, content: dict[str, Any]) -> None:
            added = outputs.add(msg_type, content)
            if added:
                session.last_output_at = time.time()
            if added and live:
                changed.set()

        conn, kernel_id = session.connection, session.kernel_id
        assert conn is not None and kernel_id is not None
        sink = OutputSink(
            max_bytes=self.eval.max_output_bytes, open_artifact=lambda: artifacts.create(session.name)
        )
        try:
            execution = await run_cell(
                conn,
                target.source,
                index=target.index,
                sink=sink,
                limits=ExecutionLimits(
                    deadline=deadline,
                    timeout_seconds=request.timeout,
                    interrupt_grace=self.eval.interrupt_grace,
                    liveness_interval=self.eval.liveness_interval,
                ),
                cancel=cancel,
                interrupt=lambda: self.eval.kernels.interrupt(kernel_id),
                emit=emit,
                observe=observe,
            )
        finally:
            sink.close()
            if pushing is not None:
                finished.set()
                changed.set()
                await asyncio.gather(pushing, return_exceptions=True)
        session.executions += 1
        written, hash_ = await self._write(path, target, outputs)
        return execution, outputs, written, hash_

    async def _write(
        self,
        path: str,
        target: _Target,
        outputs: CellOutputs,
        *,
        clear: bool = False,
        audited: bool = True,
    ) -> tuple[bool, str | None]:
        """Put the cell's outputs (or none, when it starts) into the notebook; (written, new hash).

        Recorded as a ``run_clear`` or ``run_outputs`` change (outputs pushed to a live document while
        the cell runs are not: ``audited=False``; the cell's final write is).

        The cell is found by id (or, before nbformat 4.5, at its index with its source unchanged); a
        cell a person deleted meanwhile gets nothing.
        """
        stored = [] if clear else outputs.to_nbformat()
        count = None if clear else outputs.execution_count

        def transform(nb: dict[str, Any], _hash: str) -> tuple[dict[str, Any], bool]:
            position = _find(nb, target)
            if position is None:
                return nb, False
            cells = list(nb["cells"])
            cell = dict(cells[position])
            cell["outputs"] = stored
            cell["execution_count"] = count
            cells[position] = cell
            return {**nb, "cells": cells}, True

        try:
            written, hash_ = await self.store.change(
                path, transform, actions=["run_clear" if clear else "run_outputs"], audited=audited
            )
        except AgentToolsError as e:  # the notebook went away or cannot be saved: the run goes on
            self.eval.sessions.log.warning("notebook run %s: outputs not written: %s", path, e.message)
            return False, None
        return written, hash_

    def _answer(
        self,
        path: str,
        hash_: str | None,
        session: KernelSession,
        cells: list[dict[str, Any]],
        notices: list[str],
        *,
        restarted: bool = False,
        cancelled: bool = False,
    ) -> dict[str, Any]:
        return {
            "path": path,
            "kernel_id": session.kernel_id,
            "hash": hash_,
            "cancelled": cancelled,
            "timed_out": False,
            "restarted": restarted,
            "error": None,
            "output": "(cancelled before it started)" if cancelled else "\n".join(notices),
            "cells": cells,
        }


def _select(notebook: dict[str, Any], request: RunRequest, path: str) -> list[_Target]:
    """The cells a request names, in notebook order; 400 naming an unknown id or index."""
    cells = notebook["cells"]
    chosen: set[int]
    if request.all:
        chosen = set(range(len(cells)))
    elif request.cell_indices is not None:
        bad = [i for i in request.cell_indices if not 0 <= i < len(cells)]
        if bad:
            raise BadRequest(
                f"No cell at index {bad[0]} in {path}: it has {len(cells)} cells (0..{len(cells) - 1})"
            )
        chosen = set(request.cell_indices)
    else:
        assert request.cell_ids is not None
        positions: dict[str, list[int]] = {}
        for i, cell in enumerate(cells):
            if isinstance(cell.get("id"), str):
                positions.setdefault(cell["id"], []).append(i)
        chosen = set()
        for cell_id in request.cell_ids:
            found = positions.get(cell_id)
            if not found:
                raise BadRequest(f"No cell with id {cell_id!r} in {path}")
            if len(found) > 1:
                raise BadRequest(
                    f"Cell id {cell_id!r} is ambiguous in {path}: cells {found} share it; use cell_indices"
                )
            chosen.add(found[0])
    return [
        _Target(
            index=i,
            cell_id=cells[i].get("id") if isinstance(cells[i].get("id"), str) else None,
            cell_type=str(cells[i].get("cell_type")),
            source=join_source(cells[i].get("source", "")),
        )
        for i in sorted(chosen)
    ]


def _find(nb: dict[str, Any], target: _Target) -> int | None:
    cells = nb["cells"]
    if target.cell_id is not None:
        return next((i for i, c in enumerate(cells) if c.get("id") == target.cell_id), None)
    if target.index < len(cells) and join_source(cells[target.index].get("source", "")) == target.source:
        return target.index
    return None


def _not_run(target: _Target, status: str) -> dict[str, Any]:
    return {
        "index": target.index,
        "cell_id": target.cell_id,
        "title": target.cell_id,
        "status": status,
        "output": "",
        "exit_code": 0,
        "error": None,
        "displays": [],
        "duration_ms": 0,
        "stdin_requested": False,
        "truncated": False,
        "total_bytes": 0,
        "total_lines": 0,
        "output_bytes": 0,
        "output_lines": 0,
        "artifact_id": None,
        "execution_count": None,
        "outputs_written": False,
    }


def _cell_result(
    target: _Target, execution: CellExecution, outputs: CellOutputs, written: bool
) -> dict[str, Any]:
    return {
        "index": target.index,
        "cell_id": target.cell_id,
        "title": target.cell_id,
        **execution.result_fields(),
        "execution_count": outputs.execution_count,
        "outputs_written": written,
        "timed_out": execution.timed_out,
    }

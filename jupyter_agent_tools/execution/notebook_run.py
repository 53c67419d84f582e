"""Run a notebook's own cells in the notebook's own kernel and write their outputs back into it.

The kernel is the one a person sees: the jupyter_server session of the notebook's path (what JupyterLab
creates when it opens the notebook), created the way JupyterLab would when there is none, so a person
who opens the notebook afterwards shares the agent's state. The run goes through the same session
lifecycle as eval (:class:`~.kernel_session.KernelSession` in mode ``notebook``, which never owns the kernel)
and the same recovery policy, but never re-runs a cell silently: a kernel that dies or is restarted
ends the run and the answer says which cells did not complete. A cell that does not stop after the
interrupt gets the notebook's kernel restarted in place (same id, as JupyterLab's "Restart Kernel"), and
the answer names it. Kernels this module started are shut down when unused (:mod:`.run_kernels`).

Outputs are built as JupyterLab stores them (:mod:`..notebook.outputs`, bounded per output and per
cell; what does not fit goes to an artifact as it arrives) and written through the notebook store
(:meth:`NotebookStore.change`: per-path lock, atomic save, deterministic bytes): a cell's old outputs are
cleared when it starts, its outputs saved when it ends; a notebook open in a collaborative room gets
them as they arrive. The answer gives images as ``{mime, bytes, url}`` (the output route that serves
them), with their base64 only when asked (``include_images``).

A run may carry ``ops`` (the edit route's batch): they are applied first, in one save under the run's
``expected_hash`` and in the run's ledger group, and the cells run are chosen in the edited notebook.
:meth:`NotebookRunner.attached` is the one way onto a notebook's kernel (a turn, the kernel found or
created, connected): runs use it, and so does eval with ``notebook`` (:meth:`NotebookRunner.eval`, which
the front doors call for such a body). Both run their cells through the one cell loop
(:meth:`~.cells.CellExecutor.run_cells`) with the same policy for the notebook's kernel. A notebook with
no kernel whose kernelspec is the warm pool's gets a pooled kernel, adopted by jupyter_server as its
session kernel (not on a gateway, where a kernel's working directory is set at launch only).
:meth:`NotebookRunner.kernel` and :meth:`NotebookRunner.kernel_action` describe, interrupt, restart and
shut down a notebook's kernel (``/api/agent/notebooks/{path}/kernel``).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import posixpath
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, cast

from jupyter_core.utils import ensure_async
from traitlets import Any as AnyTrait
from traitlets import Instance, Int, default, validate

from ..answers import EvalAnswer, RunAnswer
from ..artifacts import ArtifactStore
from ..audit import Audit
from ..audit.events import ExecutionRecord
from ..compat import ServerHTTPError
from ..errors import RETRY_AFTER_KERNEL_START, AgentToolsError, BadRequest, Conflict, Unavailable
from ..notebook.format import cells_hash, join_source, source_hash
from ..notebook.operations import EditRequest, apply_ops, parse_edit_request
from ..notebook.outputs import CellOutputs
from ..notebook.reading import output_url
from ..notebook.store import NotebookStore, edit_diff
from ..notebook.summary import data_size, joined_text
from ..service import Service, at_least
from ..validation import check
from .cells import Cell, CellExecutor, CellHooks, Ran, StopRules, Told
from .connection import KernelConnection
from .eval_answer import eval_answer, eval_cells, parse_recorded
from .executor import CellExecution, Emit, noop, not_run_fields
from .faults import died_at_start
from .kernel_service import KernelService, close_quietly
from .kernel_session import KernelSession, SessionState
from .messages import Iopub, answer_text
from .pace import StreamPace
from .pool import KernelPool
from .recovery import KernelRecovery
from .request import EvalRequest, RunRequest, parse_run_request
from .run_kernels import NotebookKernels
from .session_manager import EvalSessionManager

# While a cell of a notebook open in a collaborative room runs, its outputs reach the live document at
# most this often (seconds): people see them stream without a Y update per message.
LIVE_OUTPUT_INTERVAL = 0.25
RUN_AFTER = ("insert", "edit")  # a run with ops and no cells named runs the code cells these ops touched
KERNEL_LOST_NOTICE = (
    "[The notebook's kernel died or was restarted during this call; its state is lost. Cells after it "
    "were not run, and nothing was run again.]"
)


@dataclass
class Turn:
    """A call's turn on a notebook's session (see :meth:`NotebookRunner.attached`)."""

    session: KernelSession
    notices: list[str]  # what happened to the kernel before this call (lost, restarted)
    deadline: float  # event-loop time by which the call's cells must end
    cancelled: bool = False


@dataclass
class _Target:
    """A cell the request names, as it was when the run started."""

    index: int
    cell_id: str | None
    cell_type: str
    source: str


@dataclass
class _CellRun:
    """How one cell ran and what it stored."""

    execution: CellExecution
    stored: list[dict[str, Any]]  # its outputs as written into the notebook
    execution_count: int | None
    omitted: dict[str, Any] | None  # what the cell does not store (NotebookRunner.max_cell_bytes_stored)
    written: bool
    hash: str | None  # the notebook's hash after the write


class _Stored:
    """A cell's stored outputs as its execution's :class:`~.executor.Observer`: messages are added (in a
    worker thread when large), and the outputs read, under one lock."""

    def __init__(self, outputs: CellOutputs, added: Callable[[bool], None]) -> None:
        self.outputs = outputs
        self.added = added
        self._lock = threading.Lock()

    def add(self, read: Iopub) -> bool:
        with self._lock:
            return self.outputs.add(read)

    def snapshot(self) -> list[dict[str, Any]]:
        with self._lock:
            return self.outputs.to_nbformat()


class NotebookRunner(Service):
    """Runs notebook cells in the notebook's kernel; one run at a time per notebook, in arrival order.

    The application builds the class named by ``AgentToolsApp.notebook_runner_class``.
    """

    sessions = Instance(EvalSessionManager, help="The sessions (one per notebook, mode notebook).")
    kernels = Instance(KernelService, help="Checks kernelspecs, connects, interrupts and restarts kernels.")
    recovery = Instance(KernelRecovery, help="What is done when the kernel died or is wedged.")
    artifacts = Instance(ArtifactStore, help="Where outputs that do not fit go.")
    audit = Instance(Audit, help="Records every run.")
    cells = Instance(CellExecutor, help="Runs the cells: the one cell loop and execution path (eval's too).")
    max_cells = Int(
        1, help="Most cells in one eval with 'notebook' (given: the eval service's max_cells setting)."
    )
    pool = Instance(
        KernelPool,
        allow_none=True,
        help="Warm kernels: a notebook without a kernel of the pool's spec takes one.",
    )
    store = Instance(NotebookStore, help="Reads the notebook and saves the outputs.")
    session_manager = AnyTrait(help="jupyter_server's session manager: the notebook's own kernel.")
    notebook_kernels = Instance(NotebookKernels, help="Shuts down the kernels runs started when unused.")
    max_output_bytes_stored = Int(
        256 * 1024,
        help="Bytes of text one output of a notebook run may store in the notebook file; past it the head "
        "is kept with a note naming the artifact that holds the whole text.",
    ).tag(config=True)
    max_cell_bytes_stored = Int(
        4 * 1024 * 1024,
        help="Bytes of outputs one cell of a notebook run may store in the notebook file, every kind "
        "together (images included); past it later outputs are left out of the file and written to an "
        "artifact as they arrive, and one placeholder output says how many, how large and where. "
        "What clear_output removes no longer counts.",
    ).tag(config=True)

    @validate("max_output_bytes_stored", "max_cell_bytes_stored", "max_cells")
    def _valid_stored(self, proposal: Any) -> int:
        return int(at_least(proposal, 1))

    @default("notebook_kernels")
    def _default_notebook_kernels(self) -> NotebookKernels:
        return NotebookKernels(session_manager=self.session_manager, sessions=self.sessions, parent=self)

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self._warm: dict[str, KernelConnection] = {}  # pooled kernels adopted, until attached

    async def run(
        self,
        path: str,
        body: Any,
        *,
        emit: Emit | None = None,
        cancel: asyncio.Event | None = None,
        pace: StreamPace | None = None,
    ) -> RunAnswer:
        """Run the cells a request names; return the answer (also emitted last as a ``result`` event).
        ``pace``: the stream client's, when one reads the events as they come.

        The run is recorded when it ends (:meth:`Audit.execution`, mode ``notebook``), failed or not.
        """
        with self.audit.executing("notebook") as record:
            record.result = answer = await self._run(path, body, emit, cancel, pace, record)
        return answer

    async def _run(
        self,
        path: str,
        body: Any,
        emit: Emit | None,
        cancel: asyncio.Event | None,
        pace: StreamPace | None,
        record: ExecutionRecord,
    ) -> RunAnswer:
        request = parse_run_request(body)
        edit = parse_edit_request({"ops": list(request.ops)}, self.store.max_ops) if request.ops else None
        emit = emit or noop
        cancel = cancel or asyncio.Event()
        path, notebook, hash_, _live = await self.store.load(path, writable=True)
        if request.expected_hash is not None and request.expected_hash != hash_:
            raise Conflict(
                f"Notebook changed since it was read: {path} (expected_hash {request.expected_hash}, "
                f"current hash {hash_}); read it again and retry"
            )
        record.path = path
        targets = _select(notebook, request, path) if edit is None else []
        if await self._session_kernel(path) is None:  # 400 before anything is created or changed
            await self.kernels.check_kernel_name(self._kernel_name(notebook))
        async with self.store.grouped(path, "run") as group:  # one ledger entry: the edit and the outputs
            edited: dict[str, Any] | None = None
            if edit is not None:
                edited, targets = await self._edit(path, edit, request)
            record.code = [t.source for t in targets if t.cell_type == "code"]
            async with self.attached(path, notebook, request.timeout, cancel, record) as turn:
                if turn.cancelled:
                    part = _RunPart.cancelled_before(turn.session)
                else:
                    part = await self._run_targets(
                        path, turn.session, targets, request, emit, cancel, pace, turn.notices, turn.deadline
                    )
        recorded = group.fields() if group is not None and (not turn.cancelled or edited is not None) else {}
        result = _run_answer(path, part, edited, recorded)  # the ledger's fields: known once the group ended
        emit({"type": "result", "result": result})
        return result

    async def eval(
        self,
        body: Any,
        *,
        emit: Emit | None = None,
        cancel: asyncio.Event | None = None,
        pace: StreamPace | None = None,
    ) -> EvalAnswer:
        """Run an eval body with ``notebook`` in that notebook's kernel (found or started as a run does),
        in the turn runs of that notebook take; the file is not written. The answer is eval's, with
        ``notebook``; recorded as an eval call in mode ``notebook``."""
        with self.audit.executing("session") as record:
            request = parse_recorded(body, self.max_cells, record)
            record.mode, record.session, record.path = "notebook", None, request.notebook
            record.result = answer = await self._eval(request, emit or noop, cancel or asyncio.Event(), pace)
        return answer

    async def _eval(
        self, request: EvalRequest, emit: Emit, cancel: asyncio.Event, pace: StreamPace | None
    ) -> EvalAnswer:
        path, notebook = await self.readable(request.notebook or "")
        async with self.attached(path, notebook, request.timeout, cancel) as turn:
            session = turn.session
            if turn.cancelled:
                result = eval_answer(session, request, [], [], restarted=False, cancelled=True, notebook=path)
            else:
                run = await self.cells.run_cells(
                    session,
                    eval_cells(request),
                    emit=emit,
                    cancel=cancel,
                    deadline=turn.deadline,
                    timeout=request.timeout,
                    pace=pace,
                    hooks=CellHooks(policy=_NotebookKernel(self, lambda cell: f"Cell {cell.index + 1}")),
                    total=len(request.cells),
                )
                notices = [*turn.notices, *run.notices]
                result = eval_answer(
                    session, request, run.ran, notices, restarted=run.restarted, notebook=path
                )
        emit({"type": "result", "result": result})
        return result

    async def preview(self, path: str, body: Any) -> dict[str, Any]:
        """What a run would do, as the approval gate shows it: the notebook's path and hash, the ops, and
        each cell it would run with its source (and the source's hash, checked again once approved)."""
        request = parse_run_request(body)
        edit = parse_edit_request({"ops": list(request.ops)}, self.store.max_ops) if request.ops else None
        path, notebook, hash_, _live = await self.store.load(path, writable=True)
        _outcome, edited, targets = _plan(notebook, hash_, edit, request, path)
        existing = {c.get("id") for c in notebook["cells"]}
        cells = [
            {
                "id": t.cell_id,
                "index": t.index,
                "cell_type": t.cell_type,
                "source": t.source,
                "source_hash": source_hash(t.source),
                "new": edit is not None and t.cell_id not in existing,
            }
            for t in targets
        ]
        preview: dict[str, Any] = {"path": path, "hash": hash_, "ops": list(request.ops), "cells": cells}
        if edit is not None:  # the ops are an edit: shown as one (its diff), bound as one (the cells seen)
            preview.update(cells_hash=cells_hash(notebook), edit=edit_diff(notebook, edited))
        return preview

    async def _edit(
        self, path: str, edit: EditRequest, request: RunRequest
    ) -> tuple[dict[str, Any], list[_Target]]:
        """Apply the run's ``ops`` (one save, under ``expected_hash``) and choose the cells to run in the
        edited notebook: those the request names, else the code cells the ops inserted or edited."""

        def transform(nb: dict[str, Any], hash_: str) -> tuple[dict[str, Any], Any]:
            outcome, edited, targets = _plan(nb, hash_, edit, request, path)
            return edited, (outcome, targets)

        (outcome, targets), new_hash = await self.store.change(
            path,
            transform,
            expected_hash=request.expected_hash,
            actions=[op.action for op in edit.ops],
        )
        answer = {
            "message": outcome.message,
            "hash": new_hash,
            "results": [{"message": o.message, "details": o.details} for o in outcome.outcomes],
        }
        return answer, targets

    @contextlib.asynccontextmanager
    async def attached(
        self,
        path: str,
        notebook: dict[str, Any],
        timeout: float,
        cancel: asyncio.Event,
        record: ExecutionRecord | None = None,
    ) -> AsyncIterator[Turn]:
        """The turn of the notebook's session, connected to the notebook's kernel (created as JupyterLab
        would when there is none): notebook runs and eval with ``notebook`` run their cells inside it.
        ``turn.cancelled``: cancelled while waiting for the turn (nothing was started)."""
        while True:
            session = self.sessions.for_notebook(path)
            if record is not None:
                record.session = session.name
            if not await session.take_turn(cancel):
                yield Turn(session, [], 0.0, cancelled=True)
                return
            if not session.closed:
                break
            await session.end_turn()  # its kernel was shut down as unused while this run waited
        try:
            notices: list[str] = []
            loop = asyncio.get_running_loop()
            began = loop.time()
            created = pooled = False

            async def attach() -> None:
                nonlocal created, pooled
                kernel_id, kernel_name, created = await self._notebook_kernel(path, notebook)
                # Waiting for a kernel that was there counts against the call's timeout; one this run just
                # started may take KernelService.ready_timeout, like any kernel start (eval's too).
                # A call without a timeout (detached) waits for a kernel that was there as for a new one.
                ready_within = (
                    self.kernels.ready_timeout
                    if created or math.isinf(timeout)
                    else began + timeout - loop.time()
                )
                pooled = kernel_id in self._warm
                await self._attach(session, path, kernel_id, kernel_name, notices, ready_within, created)

            # A kernel this run started that exited before its first answer most often lost one of its TCP
            # ports to another process; the server's restarter would start it again on the same ports
            # (jupyter_client caches them), a new kernel gets new ones: once, as eval's launches.
            await self.recovery.retry_once(
                session, attach, lambda e: created and isinstance(e, Unavailable) and died_at_start(e)
            )
            if pooled:
                await self._settle_pooled(session, path)
            yield Turn(session, notices, (loop.time() if created else began) + timeout)
        finally:
            await session.end_turn()

    # -- the kernel ------------------------------------------------------------------------------

    async def _session_kernel(self, path: str) -> tuple[str, str] | None:
        """The (id, name) of the kernel of the notebook's jupyter_server session, if it has one."""
        for model in await ensure_async(self.session_manager.list_sessions()):
            kernel = model.get("kernel") or {}
            if model.get("path") == path and kernel.get("id"):
                return str(kernel["id"]), str(kernel.get("name") or "")
        return None

    def _kernel_name(self, notebook: dict[str, Any]) -> str:
        spec = (notebook.get("metadata") or {}).get("kernelspec") or {}
        kernel_name = spec.get("name") if isinstance(spec.get("name"), str) else None
        return kernel_name or self.kernels.default_kernel_name

    async def _notebook_kernel(self, path: str, notebook: dict[str, Any]) -> tuple[str, str, bool]:
        """The kernel of the notebook's jupyter_server session, created as JupyterLab would if none:
        (id, name, whether this run created it)."""
        found = await self._session_kernel(path)
        if found is not None:
            return (*found, False)
        kernel_name = self._kernel_name(notebook)
        await self.kernels.check_kernel_name(kernel_name)  # 400 listing the installed ones
        await self.notebook_kernels.make_room(path)
        # Not on a gateway: a kernel gets its working directory there only at launch (KERNEL_WORKING_DIR),
        # and a pooled one was launched for the server's root, not the notebook's directory.
        adopt = self.pool is not None and not self.kernels.gateway
        pooled = await self.pool.take(kernel_name) if adopt and self.pool is not None else None
        try:
            self.kernels.refuse_if_stopping()  # jupyter_server's own shutdown may have run already
            model = await ensure_async(
                self.session_manager.create_session(
                    path=path,
                    name=posixpath.basename(path),
                    type="notebook",
                    kernel_name=kernel_name,
                    kernel_id=pooled[0] if pooled else None,  # jupyter_server adopts a running kernel
                )
            )
        except Exception as e:
            # broad: any failure to make the session cleans up the pooled kernel, then is translated and
            # raised
            if pooled is not None:
                await close_quietly(pooled[1])
                await self.kernels.shutdown(pooled[0])
            raise self.kernels.translate(e) from e
        kernel_id = str(model["kernel"]["id"])
        self.notebook_kernels.note(path, str(model["id"]), kernel_id)
        if pooled is not None and pooled[0] == kernel_id:
            self._adopt(kernel_id, pooled[1])
        return kernel_id, kernel_name, True

    def _adopt(self, kernel_id: str, connection: KernelConnection) -> None:
        """A warm kernel of the pool became the notebook's: it is the server's session's kernel now
        (auto-restarted by its manager on death, as one JupyterLab started), connected already, and
        moved into the notebook's directory once attached (:meth:`_settle_pooled`)."""
        self.kernels.started.discard(kernel_id)
        with contextlib.suppress(KeyError, ServerHTTPError):  # a gateway kernel has no restarter here
            start = getattr(self.kernels.kernel_manager.get_kernel(kernel_id), "start_restarter", None)
            if callable(start):
                start()
        self._warm[kernel_id] = connection

    async def _settle_pooled(self, session: KernelSession, path: str) -> None:
        """What jupyter_server gives a kernel it starts for a notebook, given to a pooled one: the
        notebook's directory as working directory, ``JPY_SESSION_NAME`` and ``__session__``."""
        api_dir = await ensure_async(self.session_manager.contents_manager.get_kernel_path(path=path))
        cwd = str(self.kernels.kernel_manager.cwd_for_path(api_dir))
        name = self.session_manager.get_kernel_env(path, posixpath.basename(path))["JPY_SESSION_NAME"]
        code = (
            f"import os as _jat_os\ntry:\n    _jat_os.chdir({cwd!r})\nexcept OSError:\n    pass\n"
            f"_jat_os.environ['JPY_SESSION_NAME'] = {name!r}\n__session__ = {name!r}\ndel _jat_os\n"
        )
        loop = asyncio.get_running_loop()
        timeout = self.kernels.ready_timeout
        await self.cells.execute(
            session,
            code,
            index=-1,
            deadline=loop.time() + timeout,
            timeout=timeout,
            cancel=asyncio.Event(),
            silent=True,
        )

    async def _attach(
        self,
        session: KernelSession,
        path: str,
        kernel_id: str,
        kernel_name: str,
        notices: list[str],
        ready_within: float,
        created: bool,
    ) -> None:
        """Connect the session to the notebook's kernel (again, when it was restarted or replaced),
        waiting at most ``ready_within`` seconds for it to answer; 503 when it does not."""
        if session.kernel_id == kernel_id and session.state is SessionState.READY:
            notice = await self.recovery.revive(session)
            if notice is not None:
                notices.append(notice.replace("restarted before this call", "lost before this run"))
            if session.state is SessionState.READY:
                return
        wait = max(ready_within, 0.0)
        try:
            await session.start_kernel(kernel_name, lambda: self._connect(kernel_id, wait), owned=False)
        except AgentToolsError:
            raise
        except Exception as e:
            # broad: any failure to attach forgets the kernel the run started, then is re-raised
            if created:  # a kernel this run started and nobody else knows: do not leave it behind
                await self.notebook_kernels.discard(path)
            raise Unavailable(
                f"The kernel of {path} (kernel {kernel_id}) "
                + ("exited before it answered" if died_at_start(e) else f"did not answer within {wait:.3g} s")
                + f" ({type(e).__name__}: {e}); nothing was run. "
                + (
                    "It was started for this run and is shut down again; check its kernelspec "
                    f"{kernel_name!r}, or raise KernelService.ready_timeout."
                    if created
                    else "It may be running code someone else started, or still starting: retry later, "
                    "or restart the kernel."
                ),
                retry_after=RETRY_AFTER_KERNEL_START,
            ) from e

    async def readable(self, path: str) -> tuple[str, dict[str, Any]]:
        """(checked path, notebook) of a notebook to run code in without writing it (eval's ``notebook``)."""
        path, notebook, _, _ = await self.store.load(path)
        return path, notebook

    async def kernel(self, path: str) -> dict[str, Any]:
        """The notebook's kernel (``GET .../kernel``): whether it runs, its state, its kernelspec, the
        execution count last seen here, and whether a person (a browser's websocket) is connected."""
        path, _ = await self.readable(path)
        found = await self._session_kernel(path)
        session = self.sessions.notebooks.get(path)
        answer: dict[str, Any] = {
            "path": path,
            "kernel_id": None,
            "kernel_name": None,
            "state": "not_running",
            "execution_count": None,
            "connections": 0,
            "person_connected": False,
            "started_by_run": path in self.notebook_kernels.started,
            "busy": bool(session is not None and session.busy),
        }
        if found is None:
            return answer
        kernel_id, kernel_name = found
        try:
            model = await ensure_async(self.kernels.kernel_manager.kernel_model(kernel_id))
        except (KeyError, ServerHTTPError):  # gone between the two looks
            return answer
        connections = int(model.get("connections") or 0)
        attached = session is not None and session.kernel_id == kernel_id
        answer.update(
            kernel_id=kernel_id,
            kernel_name=kernel_name or model.get("name"),
            state=str(model.get("execution_state") or "unknown"),
            execution_count=session.execution_count if attached and session is not None else None,
            connections=connections,
            person_connected=connections > 0,
        )
        return answer

    async def kernel_action(self, path: str, body: Any) -> dict[str, Any]:
        """``POST .../kernel``: ``interrupt`` (a running call answers cancelled), ``restart`` (in place,
        as JupyterLab's Restart Kernel: state is lost) or ``shutdown`` (the notebook's jupyter_server
        session and kernel are deleted, as JupyterLab's Shut Down Kernel)."""
        check("NotebookKernelRequest", body)
        action = body["action"]
        path, _ = await self.readable(path)
        found = await self._session_kernel(path)
        if found is None and action == "restart":
            raise Conflict(f"The notebook {path} has no running kernel to restart; run a cell to start one")
        if found is None:  # nothing to interrupt or shut down: done already
            answer = await self.kernel(path)
            answer.update(
                action=action,
                interrupted_call=False,
                state_lost=False,
                message=f"The notebook {path} has no running kernel: nothing to {action}.",
            )
            return answer
        kernel_id = found[0]
        session = self.sessions.notebooks.get(path)
        running = session is not None and session.cancel is not None and not session.cancel.is_set()
        if running and session is not None and session.cancel is not None:
            session.cancel.set()  # the running call answers cancelled (its cell is interrupted)
        message = ""
        try:
            if action == "interrupt":
                if not running:
                    await self.kernels.interrupt(kernel_id)
                message = f"Interrupted the kernel of {path}."
            elif action == "restart":
                if session is not None:
                    await session.drop_kernel()  # the next call attaches to the restarted kernel
                await self.kernels.restart(kernel_id, now=False)
                message = (
                    f"Restarted the kernel of {path} (kernel {kernel_id}): its state was lost (variables, "
                    "imports); run the cells again to rebuild it."
                )
            else:
                if session is not None:
                    await session.drop_kernel()
                self.notebook_kernels.started.pop(path, None)
                for model in await ensure_async(self.session_manager.list_sessions()):
                    if model.get("path") == path and (model.get("kernel") or {}).get("id") == kernel_id:
                        await ensure_async(self.session_manager.delete_session(model["id"]))
                message = f"Shut down the kernel of {path}: its state was lost."
        except AgentToolsError:
            raise
        except Exception as e:
            # broad: any kernel manager failure becomes an answer with a status (KernelService.translate)
            raise self.kernels.translate(e) from e
        answer = await self.kernel(path)
        answer.update(
            action=action,
            interrupted_call=running,
            state_lost=action in ("restart", "shutdown"),
            message=message,
        )
        return answer

    async def _connect(self, kernel_id: str, ready_within: float) -> tuple[str, Any]:
        warm = self._warm.pop(kernel_id, None)  # a pooled kernel comes connected
        return kernel_id, warm or await self.kernels.connect(kernel_id, ready_within)

    async def _restart_in_place(self, session: KernelSession, cell: str) -> str:
        """The cell would not stop after the interrupt: restart the notebook's kernel in place through the
        server's kernel manager (what JupyterLab's "Restart Kernel" does, so a person with the notebook
        open sees it) and return the notice that says so."""
        kernel_id = session.kernel_id
        assert kernel_id is not None
        self.recovery.after_wedge(session)
        await session.drop_kernel()  # disconnect; the next run attaches to the restarted kernel
        try:
            await self.kernels.restart(kernel_id)
        except Exception as e:  # broad: a failed restart (any manager error) is logged; the recovery goes on
            self.sessions.log.warning("notebook kernel %s: restart failed", kernel_id, exc_info=True)
            return (
                f"[{cell} did not stop after the interrupt, so the notebook's kernel {kernel_id} was "
                f"restarted, but it did not come back ({type(e).__name__}: {e}): its state is lost. Cells "
                "after it were not run, and nothing was run again.]"
            )
        return (
            f"[{cell} did not stop after the interrupt, so the notebook's kernel was restarted (kernel "
            f"{kernel_id}, as JupyterLab's Restart Kernel does): its state is lost. Cells after it were "
            "not run, and nothing was run again.]"
        )

    # -- the cells -------------------------------------------------------------------------------

    async def _run_targets(
        self,
        path: str,
        session: KernelSession,
        targets: list[_Target],
        request: RunRequest,
        emit: Emit,
        cancel: asyncio.Event,
        pace: StreamPace | None,
        notices: list[str],
        deadline: float,
    ) -> _RunPart:
        kernel_id = session.kernel_id  # the notebook's kernel keeps its id when it is restarted
        code_cells = [t for t in targets if t.cell_type == "code"]
        by_index = {t.index: t for t in code_cells}
        answered: dict[int, dict[str, Any]] = {}  # each code cell's part of the answer, by index
        outcomes = []
        hash_: str | None = None
        not_written: list[str] = []  # why outputs could not be written (the notebook went away...)

        async def run_one(cell: Cell, position: int, emit: Emit) -> tuple[CellExecution, int | None]:
            nonlocal hash_
            target = by_index[cell.index]
            ran = await self._run_one(
                path, session, target, request, emit, cancel, pace, deadline, not_written
            )
            hash_ = ran.hash
            answered[target.index] = entry = _cell_result(path, target, request, ran)
            for display in entry["displays"]:  # images: known once the cell's outputs are stored
                if display["type"] == "image":
                    emit({"type": "display", "index": target.index, "display": display})
            name = _label(cell, "cell")
            outcomes.append(ran.execution.outcome(position, name, name, bool(entry["displays"])))
            return ran.execution, ran.execution_count

        def not_run(cell: Cell) -> None:
            answered[cell.index] = _not_run(by_index[cell.index], "not_run")

        run = await self.cells.run_cells(
            session,
            [Cell(t.index, t.source, t.cell_id, t.cell_id, notebook=True) for t in code_cells],
            emit=emit,
            cancel=cancel,
            deadline=deadline,
            timeout=request.timeout,
            pace=pace,
            hooks=CellHooks(run_one, not_run, _NotebookKernel(self, lambda cell: _label(cell, "Cell"))),
            rules=StopRules(on_error=request.stop_on_error, at_deadline=True),
        )
        notices = [*notices, *run.notices]
        cells = [answered[t.index] if t.cell_type == "code" else _not_run(t, "skipped") for t in targets]
        if not_written:
            notices.append(
                f"[The outputs could not be written into the notebook: {not_written[0]} The cells ran; "
                "their output is below and in this answer.]"
            )
        output = answer_text(outcomes, len(code_cells), notices)
        timed_out = any([c.pop("timed_out", False) for c in cells])  # popped from every cell
        if hash_ is None:
            with contextlib.suppress(AgentToolsError):  # the notebook went away: see outputs_error
                _, _, hash_, _ = await self.store.load(path)
        return _RunPart(
            kernel_id,
            hash_,
            cells,
            output,
            outputs_error=not_written[0] if not_written else None,
            cancelled=cancel.is_set() or any(c["status"] == "cancelled" for c in cells),
            timed_out=timed_out,
            restarted=run.restarted,
        )

    async def _run_one(
        self,
        path: str,
        session: KernelSession,
        target: _Target,
        request: RunRequest,
        emit: Emit,
        cancel: asyncio.Event,
        pace: StreamPace | None,
        deadline: float,
        not_written: list[str],
    ) -> _CellRun:
        """Run one cell and write its outputs."""
        outputs = CellOutputs(
            max_text_bytes=self.max_output_bytes_stored,
            max_bytes=self.max_cell_bytes_stored,
            open_artifact=lambda: self.artifacts.create(session.key),
        )
        live = (await self._write(path, target, [], None, clear=True))[2]
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
                snapshot = await asyncio.to_thread(stored.snapshot)  # a large add may hold the lock
                await self._write(path, target, snapshot, outputs.execution_count, audited=False)
                try:
                    await asyncio.wait_for(finished.wait(), LIVE_OUTPUT_INTERVAL)
                    return
                except asyncio.TimeoutError:
                    pass

        def added(changed_outputs: bool) -> None:
            if changed_outputs:
                session.last_output_at = time.time()
                if live:
                    changed.set()

        stored = _Stored(outputs, added)
        pushing = asyncio.ensure_future(push_live()) if live else None
        try:
            execution = await self.cells.execute(
                session,
                target.source,
                index=target.index,
                deadline=deadline,
                timeout=request.timeout,
                cancel=cancel,
                emit=emit,
                images=False,  # answered from what the cell stores (placeholders with the output's URL)
                observer=stored,
                pace=pace,
            )
        finally:
            outputs.close()
            if pushing is not None:
                finished.set()
                changed.set()
                await asyncio.gather(pushing, return_exceptions=True)
        final = outputs.to_nbformat()
        count = outputs.execution_count
        written, hash_, _ = await self._write(path, target, final, count, not_written=not_written)
        return _CellRun(execution, final, count, outputs.omitted(), written, hash_)

    async def _write(
        self,
        path: str,
        target: _Target,
        stored: list[dict[str, Any]],
        count: int | None,
        *,
        clear: bool = False,
        audited: bool = True,
        not_written: list[str] | None = None,
    ) -> tuple[bool, str | None, bool]:
        """Put the cell's outputs (or none, when it starts) into the notebook; (written, new hash, whether
        it went to a live document).

        Recorded as a ``run_clear`` or ``run_outputs`` change (outputs pushed to a live document while
        the cell runs are not: ``audited=False``; the cell's final write is).

        The cell is found by id (or, before nbformat 4.5, at its index with its source unchanged); a
        cell a person deleted meanwhile gets nothing. When the notebook cannot be written (deleted or
        moved during the run, not writable), the run goes on; a final write's reason goes to ``not_written``.
        """

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

        notes: dict[str, Any] = {}
        try:
            action = "run_clear" if clear else "run_outputs"
            written, hash_ = await self.store.change(
                path, transform, actions=[action], audited=audited, notes=notes
            )
        except AgentToolsError as e:  # the notebook went away or cannot be saved: the run goes on
            self.sessions.log.warning("notebook run %s: outputs not written: %s", path, e.message)
            if not_written is not None and not not_written:
                not_written.append(e.message if e.message.endswith(".") else e.message + ".")
            return False, None, False
        return written, hash_, bool(notes.get("live"))


@dataclass(frozen=True)
class _RunPart:
    """What running a notebook's cells gave: the part of the run's answer known when the cells end."""

    kernel_id: str | None
    hash: str | None
    cells: list[dict[str, Any]]
    output: str
    outputs_error: str | None = None
    cancelled: bool = False
    timed_out: bool = False
    restarted: bool = False

    @classmethod
    def cancelled_before(cls, session: KernelSession) -> _RunPart:
        return cls(session.kernel_id, None, [], "(cancelled before it started)", cancelled=True)


def _run_answer(
    path: str, part: _RunPart, edited: dict[str, Any] | None, recorded: dict[str, Any]
) -> RunAnswer:
    """A notebook run's answer, built once it is all known: the cells' part, the edit it made first
    (whose hash is the notebook's when no output was written), the change ledger's fields."""
    answer: RunAnswer = {
        "path": path,
        "kernel_id": part.kernel_id,
        "hash": part.hash if part.hash is not None or edited is None else edited["hash"],
        "cancelled": part.cancelled,
        "timed_out": part.timed_out,
        "restarted": part.restarted,
        "error": None,
        "output": part.output,
        "outputs_error": part.outputs_error,
        "cells": part.cells,
    }
    if edited is not None:
        answer["edit"] = edited
    return cast(RunAnswer, {**answer, **recorded})


@dataclass
class _NotebookKernel:
    """The policy for a notebook's kernel after a cell (a run's and eval's ``notebook``): one that died
    or was restarted is let go (the next call attaches again), one whose cell would not stop is
    restarted in place; the call stops, and nothing is ever run again."""

    runner: NotebookRunner
    label: Callable[[Cell], str]  # how the notice names the cell

    async def after(
        self, session: KernelSession, ran: Ran, reruns: int, cancel: asyncio.Event
    ) -> Told | None:
        execution = ran.execution
        if execution.kernel_died:
            return Told(notice=KERNEL_LOST_NOTICE, then=session.mark_dead)  # disconnects
        if execution.cancelled and not execution.settled:
            return Told(notice=await self.runner._restart_in_place(session, self.label(ran.cell)))
        return None


def _label(cell: Cell, word: str) -> str:
    """``word index (id ...)``: how a run's answer names one of its cells."""
    return f"{word} {cell.index}" + (f" (id {cell.cell_id})" if cell.cell_id else "")


def _plan(
    notebook: dict[str, Any], hash_: str, edit: EditRequest | None, request: RunRequest, path: str
) -> tuple[Any, dict[str, Any], list[_Target]]:
    """The run's edit applied to ``notebook`` (deterministic: its ids come from ``hash_``) and the cells
    it runs there: those the request names, else the code cells the ops inserted or edited."""
    if edit is None:
        return None, notebook, _select(notebook, request, path)
    outcome = apply_ops(notebook, edit.ops, id_seed=hash_, batch=True)
    edited = outcome.notebook
    if request.all or request.cell_ids is not None or request.cell_indices is not None:
        return outcome, edited, _select(edited, request, path)
    ids = [o.details.get("cellId") for o in outcome.outcomes if o.details.get("action") in RUN_AFTER]
    chosen = [
        i
        for i, c in enumerate(edited["cells"])
        if c.get("id") is not None and c.get("id") in ids and c.get("cell_type") == "code"
    ]
    return outcome, edited, [_target(edited["cells"], i) for i in chosen]


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
    return [_target(cells, i) for i in sorted(chosen)]


def _target(cells: list[dict[str, Any]], i: int) -> _Target:
    return _Target(
        index=i,
        cell_id=cells[i].get("id") if isinstance(cells[i].get("id"), str) else None,
        cell_type=str(cells[i].get("cell_type")),
        source=join_source(cells[i].get("source", "")),
    )


def _find(nb: dict[str, Any], target: _Target) -> int | None:
    cells = nb["cells"]
    if target.cell_id is not None:
        return next((i for i, c in enumerate(cells) if c.get("id") == target.cell_id), None)
    if target.index < len(cells) and join_source(cells[target.index].get("source", "")) == target.source:
        return target.index
    return None


def _cell_fields(target: _Target, fields: dict[str, Any], ran: _CellRun | None = None) -> dict[str, Any]:
    """A cell of a run's answer: which cell, how it ran (``fields``), what it stored."""
    return {
        "index": target.index,
        "cell_id": target.cell_id,
        "title": target.cell_id,
        **fields,
        "execution_count": ran.execution_count if ran else None,
        "outputs_written": ran.written if ran else False,
        "outputs_omitted": ran.omitted if ran else None,
    }


def _not_run(target: _Target, status: str) -> dict[str, Any]:
    return _cell_fields(target, not_run_fields(status))


def _cell_result(path: str, target: _Target, request: RunRequest, ran: _CellRun) -> dict[str, Any]:
    fields = ran.execution.result_fields()
    ref = target.cell_id if target.cell_id is not None else f"@{target.index}"
    images = _images(ran.stored, path, ref if ran.written else None, request.include_images)
    fields["displays"] = [d for d in fields["displays"] if d.get("type") != "image"] + images
    return {**_cell_fields(target, fields, ran), "timed_out": ran.execution.timed_out}


def _images(
    stored: list[dict[str, Any]], path: str, ref: str | None, include_data: bool
) -> list[dict[str, Any]]:
    """The images a cell stored, as the answer gives them: ``{type, mime, bytes, url}`` (``url``: the
    output route, None when the outputs were not written), with ``data`` only when asked."""
    images: list[dict[str, Any]] = []
    for n, output in enumerate(stored):
        data = output.get("data")
        if not isinstance(data, dict):
            continue
        for mime, value in data.items():
            raw = joined_text(value) if mime.startswith("image/") else None
            if raw is None:
                continue
            size = data_size(mime, raw)
            image: dict[str, Any] = {
                "type": "image",
                "mime": mime,
                "bytes": size,
                "url": output_url(path, ref, n, mime) if ref is not None else None,
            }
            if include_data:
                image["data"] = raw
            images.append(image)
    return images

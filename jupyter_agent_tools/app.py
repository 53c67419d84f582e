"""The Jupyter Server extension application: configuration traits, service wiring, shutdown."""

from __future__ import annotations

import asyncio
import tempfile
from typing import Any, cast

from jupyter_server.base.handlers import path_regex
from jupyter_server.extension.application import ExtensionApp
from traitlets import Bool, CaselessStrEnum, Float, Int, TraitError, Type, Unicode, validate

from . import __version__
from .artifacts import ArtifactStore
from .audit import Audit
from .eval.kernels import KernelService
from .eval.messages import OutputLimits
from .eval.notebook_kernels import NotebookKernels
from .eval.notebook_run import NotebookRunner
from .eval.pool import KernelPool
from .eval.recovery import KernelRecovery
from .eval.service import EvalService
from .eval.sessions import SessionManager
from .handlers.changes import (
    ChangesHandler,
    NotebookChangeHandler,
    NotebookChangesHandler,
    NotebookUndoHandler,
)
from .handlers.eval import EvalHandler
from .handlers.mcp import McpHandler
from .handlers.notebooks import (
    NOTEBOOK_PATH_REGEX,
    NotebookHandler,
    NotebookKernelHandler,
    NotebookOutputHandler,
    NotebookRunHandler,
)
from .handlers.openapi import OpenAPIHandler, UnknownRouteHandler
from .handlers.sessions import (
    ArtifactHandler,
    SessionHandler,
    SessionInterruptHandler,
    SessionListHandler,
)
from .handlers.tokens import TokenHandler, TokenListHandler
from .ledger.service import Ledger
from .mcp.server import MAX_SESSIONS as MCP_MAX_SESSIONS
from .mcp.server import McpServer
from .notebook.live import RTC_MODES, LiveDocuments
from .notebook.store import NotebookStore
from .traits import at_least

GIB = 1024**3


def _in_range(proposal: Any, low: int, high: int, unit: str = "bytes") -> int:
    """The proposed value of an Int trait, or a TraitError naming the trait and its range."""
    value = int(proposal["value"])
    if not low <= value <= high:
        name = proposal["trait"].name
        raise TraitError(f"AgentToolsApp.{name} must be between {low} and {high} {unit}, got {value}")
    return value


# Any segment: a name no session can have answers a JSON 404 from the handler, not the server's HTML 404.
SESSION_NAME = r"(?P<name>[^/]+)"


class AgentToolsApp(ExtensionApp):
    """Routes where AI coding agents edit notebooks and run code.

    Configure with ``c.AgentToolsApp.<trait> = value`` in ``jupyter_server_config.py``
    or ``--AgentToolsApp.<trait>=value`` on the command line.
    """

    name = "jupyter_agent_tools"
    version = __version__
    description = __doc__
    load_other_extensions = True

    # -- notebooks --
    summary_max_chars = Int(
        2000,
        help="Characters of each text output (stream, result, traceback) shown when an agent reads a "
        "notebook; longer text is cut with a note. 0 means no limit.",
    ).tag(config=True)

    max_ops_per_request = Int(1000, help="Most cell operations accepted in one batch edit request.").tag(
        config=True
    )

    notebook_busy_timeout = Float(
        3.0,
        help="Seconds a notebook read or edit waits for a file that another writer (JupyterLab saving "
        "through /api/contents, an editor) is in the middle of writing; past it the request answers 503 "
        "with Retry-After. Reads never treat such a file as corrupt.",
    ).tag(config=True)

    rtc_mode = CaselessStrEnum(
        RTC_MODES,
        default_value="auto",
        help="Where notebook edits go when real-time collaboration (jupyter-collaboration or "
        "jupyter-server-documents) has the notebook open in a room. 'auto': into the room's live document, "
        "so people see them at once and keep their unsaved work (the room autosaves the file); 'never': "
        "always into the file, as without collaboration.",
    ).tag(config=True)

    live_ready_timeout = Float(
        10.0,
        help="Seconds a notebook read or edit waits for a collaborative room that is loading or reloading "
        "the notebook from disk; past it the request answers 503 with Retry-After.",
    ).tag(config=True)

    # -- eval --
    max_sessions = Int(
        4,
        help="Most named eval sessions (kernels) at once. A new session evicts the least recently used "
        "idle one; when all are busy the request answers 503 with Retry-After.",
    ).tag(config=True)

    idle_timeout = Float(
        300.0, help="Seconds a session may stay unused before the sweep shuts its kernel down (0: never)."
    ).tag(config=True)

    cleanup_interval = Float(
        30.0, help="Seconds between sweeps for idle and dead sessions and expired artifacts."
    ).tag(config=True)

    notebook_kernel_idle_timeout = Float(
        600.0,
        help="Seconds a kernel that a notebook run started (the notebook had no jupyter session) may stay "
        "unused before the sweep shuts it down with its session; never one that is busy or that a client "
        "(a browser) is connected to, nor one JupyterLab started. 0: never.",
    ).tag(config=True)

    max_notebook_kernels = Int(
        8,
        help="Most kernels started by notebook runs kept at once: a run that starts one more shuts down the "
        "least recently used unused one first (never a busy or connected one).",
    ).tag(config=True)

    max_output_bytes = Int(
        50 * 1024,
        help="Bytes of output kept visible per cell; past it the tail is kept and the full output is "
        "spilled to an artifact.",
    ).tag(config=True)

    max_run_output_bytes = Int(
        256 * 1024,
        help="Bytes of text one output of a notebook run may store in the notebook file; past it the head "
        "is kept with a note naming the artifact that holds the whole text.",
    ).tag(config=True)

    max_run_cell_bytes = Int(
        4 * 1024 * 1024,
        help="Bytes of outputs one cell of a notebook run may store in the notebook file, every kind "
        "together (images included); past it later outputs are left out of the file and written to an "
        "artifact as they arrive, and one placeholder output says how many, how large and where. "
        "What clear_output removes no longer counts.",
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

    max_cells_per_request = Int(100, help="Most cells accepted in one eval request.").tag(config=True)

    max_body_bytes = Int(
        10 * 1024 * 1024,
        help="Largest request body (bytes) an agent route accepts; a larger one answers 413. 0: no limit "
        "of ours (Tornado's server-wide max_body_size, 100 MB by default, still applies).",
    ).tag(config=True)

    interrupt_timeout = Float(
        5.0,
        help="Seconds to wait for a kernel to settle after an interrupt (timeout or cancel) before the "
        "kernel is restarted.",
    ).tag(config=True)

    stream_heartbeat_interval = Float(
        5.0,
        help="Seconds of silence after which the NDJSON eval stream sends a heartbeat event, and an MCP "
        "call is answered as an SSE stream that sends a heartbeat (progress or a comment).",
    ).tag(config=True)

    stream_backlog_bytes = Int(
        16 * 1024 * 1024,
        help="Bytes of output text the NDJSON eval stream holds for a client that reads slower than the "
        "kernel prints; text past it is not sent (a 'gap' event says how much) and stays in the cell's "
        "result and artifact. Also the largest single output message a client gets whole (ipykernel "
        "sends what a cell prints unflushed in 0.2 s as one message, often megabytes).",
    ).tag(config=True)

    stream_lag_grace = Float(
        1.0,
        help="Seconds an eval may wait, each time, for an NDJSON client that fell behind (past three "
        "quarters of stream_backlog_bytes) before the client's text is skipped with a 'gap' event; the "
        "kernel's output waits meanwhile in the connection's buffer (only while it is less than half "
        "full and takes every message, so the kernel is never held up). 0: skip at once.",
    ).tag(config=True)

    kernel_ready_timeout = Float(
        60.0, help="Seconds to wait for a newly started kernel to answer before giving up."
    ).tag(config=True)

    init_timeout = Float(
        60.0,
        help="Seconds the silent init step (cwd, env, sys.path) may take on a new kernel before the call "
        "goes on without it (it is tried again on the next call).",
    ).tag(config=True)

    liveness_interval = Float(
        1.0,
        help="Seconds without kernel messages after which a running execution checks that its kernel "
        "is still alive.",
    ).tag(config=True)

    heartbeat_interval = Float(
        5.0,
        help="Seconds between liveness checks of each idle session's kernel; a dead kernel is cleaned up "
        "and restarted on the session's next call (0: no heartbeat).",
    ).tag(config=True)

    per_call_pool_size = Int(
        1,
        help="Warm kernels of the default kernel spec kept started for per-call evals and new sessions "
        "(0 disables). Filling starts at the first eval; each pooled kernel runs one call (or one "
        "session) and is shut down, then the pool starts another. Pooled kernels are not sessions, hold "
        "file descriptors like any kernel (a refill waits while fewer than 2 x fd_headroom are free) and "
        "are shut down first when a kernel start runs out of descriptors.",
    ).tag(config=True)

    kernel_create_retry_delay = Float(
        1.0,
        help="Seconds to wait before the single retry of a kernel creation that failed with HTTP >= 500 "
        "(a remote gateway's error, 503 unreachable, 599 timeout).",
    ).tag(config=True)

    fd_headroom = Int(
        64,
        help="Free file descriptors required before starting a local kernel; below it the start is treated "
        "as EMFILE (idle sessions are shut down and the start retried once). 0 disables the check.",
    ).tag(config=True)

    iopub_hwm = Int(
        2,
        help="Most kernel output messages ZMQ receives into the server (per kernel connection) beyond those "
        "the connection already holds (iopub_buffer_bytes). Counted in messages of any size: a kernel "
        "message may be 100 MB.",
    ).tag(config=True)

    iopub_buffer_bytes = Int(
        16 * 1024 * 1024,
        help="Bytes of kernel output messages a kernel connection takes in ahead of the code that processes "
        "them (a message that arrives with room left is taken whole); past it the connection stops reading "
        "and the kernel holds the rest. Too little makes a kernel that prints fast drop messages (it keeps "
        "1000 at most); 0: no limit (memory grows with a flood).",
    ).tag(config=True)

    hold_kernel_activity = Bool(
        True,
        help="While an eval connection to a local kernel is open, it keeps the kernel's activity "
        "(last_activity, execution_state) for jupyter_server in place of jupyter_server's own iopub "
        "watcher, so the server reads each output message once instead of twice. False: jupyter_server's "
        "watcher always runs.",
    ).tag(config=True)

    artifacts_dir = Unicode(
        "",
        help="Directory for spilled outputs (artifacts). Empty: a private temporary directory removed "
        "when the server stops.",
    ).tag(config=True)

    artifact_retention = Float(
        24 * 3600.0, help="Seconds an artifact is kept at most (it also goes with its session; 0: forever)."
    ).tag(config=True)

    artifacts_max_bytes = Int(
        GIB,
        help="Bytes all artifacts hold at most. A spill that would pass it first removes the oldest "
        "artifacts of idle sessions (never those of a running call); what still does not fit is cut, and "
        "the cell's notice says its artifact is incomplete. 0: no cap.",
    ).tag(config=True)

    # -- MCP --
    mcp_max_batch_items = Int(
        100,
        help="Most messages in one JSON-RPC batch sent to the MCP endpoint (protocol 2025-03-26 only); a "
        "longer batch is refused whole (-32600) before any of it runs.",
    ).tag(config=True)

    mcp_max_batch_answer_bytes = Int(
        10 * 1024 * 1024,
        help="Bytes of answers one MCP JSON-RPC batch may build; once its answers take more, the requests "
        "left in it are not run and each gets a -32600 error saying the batch's answer is too large.",
    ).tag(config=True)

    mcp_max_sessions_per_identity = Int(
        100,
        help="Most legacy MCP sessions (of the 1000 the server keeps) one identity holds: the token a "
        "request authenticates with, else the logged-in user. A new session past it ends that identity's "
        "least recently used one, so one client's initialize flood ends only its own sessions.",
    ).tag(config=True)

    # -- audit --
    audit_include_code = Bool(
        False,
        help="Put the source of the cells an agent ran or changed into the audit events (execution: "
        "'code'; notebook_change: 'sources'). Off by default: code can hold secrets. Outputs are never "
        "in events.",
    ).tag(config=True)

    # -- change ledger --
    ledger_db_path = Unicode(
        "",
        help="The SQLite file of the change ledger (every change the extension makes to a notebook, for "
        "review and undo). Empty: agent_tools_ledger.db in the Jupyter data directory.",
    ).tag(config=True)

    ledger_max_changes_per_notebook = Int(
        200,
        help="Changes the ledger keeps per notebook; the oldest are pruned first. 0: the ledger records "
        "nothing (no undo, no 'since').",
    ).tag(config=True)

    ledger_max_bytes = Int(
        256 * 1024 * 1024,
        help="Bytes the ledger's database may take; past it the oldest changes (of any notebook) are pruned "
        "first. At least 262144 (256 KiB).",
    ).tag(config=True)

    # -- service classes --
    notebook_store_class = Type(
        default_value="jupyter_agent_tools.notebook.store.NotebookStore",
        klass=NotebookStore,
        help="The class that reads and edits notebooks (a subclass of NotebookStore). Built with "
        "parent=the app and contents_manager, live, summary_max_chars, max_ops, busy_timeout, audit, ledger.",
    ).tag(config=True)

    artifact_store_class = Type(
        default_value="jupyter_agent_tools.artifacts.ArtifactStore",
        klass=ArtifactStore,
        help="The class that keeps spilled outputs (a subclass of ArtifactStore). Built with "
        "parent=the app and root, retention, max_bytes.",
    ).tag(config=True)

    kernel_service_class = Type(
        default_value="jupyter_agent_tools.eval.kernels.KernelService",
        klass=KernelService,
        help="The class that starts, connects to and shuts down kernels (a subclass of KernelService). "
        "Built with parent=the app and kernel_manager, ready_timeout, fd_headroom, iopub_hwm, "
        "iopub_buffer_bytes, hold_activity.",
    ).tag(config=True)

    session_manager_class = Type(
        default_value="jupyter_agent_tools.eval.sessions.SessionManager",
        klass=SessionManager,
        help="The class that keeps, evicts and sweeps the eval sessions (a subclass of SessionManager). "
        "Built with parent=the app and kernels, artifacts, max_sessions, idle_timeout, cleanup_interval, "
        "heartbeat_interval, audit.",
    ).tag(config=True)

    eval_service_class = Type(
        default_value="jupyter_agent_tools.eval.service.EvalService",
        klass=EvalService,
        help="The class that runs eval requests (a subclass of EvalService). Built with parent=the app "
        "and sessions, kernels, artifacts, contents_manager, pool, recovery, max_output_bytes, "
        "interrupt_grace, max_cells, liveness_interval, init_timeout, output_limits.",
    ).tag(config=True)

    notebook_runner_class = Type(
        default_value="jupyter_agent_tools.eval.notebook_run.NotebookRunner",
        klass=NotebookRunner,
        help="The class that runs a notebook's cells in its kernel (a subclass of NotebookRunner). Built "
        "with parent=the app and eval_service, store, session_manager, max_output_bytes_stored, "
        "notebook_kernels, max_cell_bytes_stored.",
    ).tag(config=True)

    ledger_class = Type(
        default_value="jupyter_agent_tools.ledger.service.Ledger",
        klass=Ledger,
        help="The class that records notebook changes (a subclass of Ledger). Built with parent=the app "
        "and db_path, max_changes_per_notebook, max_bytes.",
    ).tag(config=True)

    @validate(
        "max_sessions",
        "max_output_bytes",
        "max_cells_per_request",
        "max_ops_per_request",
        "max_run_output_bytes",
        "max_notebook_kernels",
        "max_run_cell_bytes",
    )
    def _at_least_one(self, proposal: Any) -> int:
        value = int(proposal["value"])
        if value < 1:
            name = proposal["trait"].name
            raise TraitError(f"AgentToolsApp.{name} must be at least 1, got {value}")
        return value

    @validate(
        "notebook_busy_timeout",
        "idle_timeout",
        "cleanup_interval",
        "heartbeat_interval",
        "interrupt_timeout",
        "kernel_create_retry_delay",
        "artifact_retention",
        "artifacts_max_bytes",
        "max_body_bytes",
        "fd_headroom",
        "per_call_pool_size",
        "stream_lag_grace",
        "notebook_kernel_idle_timeout",
        "ledger_max_changes_per_notebook",
    )
    def _not_negative(self, proposal: Any) -> Any:
        return at_least(proposal, 0)

    @validate(
        "kernel_ready_timeout",
        "init_timeout",
        "liveness_interval",
        "stream_heartbeat_interval",
        "live_ready_timeout",
    )
    def _positive(self, proposal: Any) -> Any:
        return at_least(proposal, 0, strict=True)

    @validate("stream_backlog_bytes")
    def _valid_backlog(self, proposal: Any) -> int:
        return _in_range(proposal, 1024, GIB)

    @validate("max_display_bytes")
    def _valid_display(self, proposal: Any) -> int:
        return _in_range(proposal, 0, GIB)

    @validate("max_html_convert_bytes")
    def _valid_html(self, proposal: Any) -> int:
        return _in_range(proposal, 1024, 16 * 1024 * 1024)

    @validate("ledger_max_bytes")
    def _valid_ledger_bytes(self, proposal: Any) -> int:
        return _in_range(proposal, 256 * 1024, 1024 * GIB)

    @validate("iopub_hwm")
    def _valid_hwm(self, proposal: Any) -> int:
        return _in_range(proposal, 1, 100_000, "messages")

    @validate("iopub_buffer_bytes")
    def _valid_iopub_buffer(self, proposal: Any) -> int:
        return _in_range(proposal, 0, GIB)

    @validate("mcp_max_batch_items")
    def _valid_batch_items(self, proposal: Any) -> int:
        return _in_range(proposal, 1, 10_000, "messages")

    @validate("mcp_max_batch_answer_bytes")
    def _valid_batch_answer(self, proposal: Any) -> int:
        return _in_range(proposal, 1024, GIB)

    @validate("mcp_max_sessions_per_identity")
    def _valid_sessions_per_identity(self, proposal: Any) -> int:
        return _in_range(proposal, 1, MCP_MAX_SESSIONS, "sessions")

    audit: Audit
    ledger: Ledger
    notebook_store: NotebookStore
    eval_service: EvalService
    notebook_runner: NotebookRunner
    mcp_server: McpServer
    _own_artifacts_dir: bool = False

    def initialize_settings(self) -> None:
        assert self.serverapp is not None
        serverapp = self.serverapp
        self.audit = audit = Audit(
            parent=self,
            event_logger=getattr(serverapp, "event_logger", None),
            include_code=self.audit_include_code,
        )
        audit.register_schemas()
        # AgentAuthorizer (jupyter_agent_tools.auth) records agent refusals on every route through it
        self.settings["jupyter_agent_tools_audit"] = audit
        self.ledger = cast("type[Ledger]", self.ledger_class)(
            parent=self,
            max_changes_per_notebook=self.ledger_max_changes_per_notebook,
            max_bytes=self.ledger_max_bytes,
            **({"db_path": self.ledger_db_path} if self.ledger_db_path else {}),
        )
        self.notebook_store = cast("type[NotebookStore]", self.notebook_store_class)(
            parent=self,
            contents_manager=serverapp.contents_manager,
            summary_max_chars=self.summary_max_chars,
            max_ops=self.max_ops_per_request,
            busy_timeout=self.notebook_busy_timeout,
            audit=audit,
            ledger=self.ledger,
            live=LiveDocuments(
                lambda: serverapp.web_app.settings,
                mode=self.rtc_mode,
                log=self.log,
                ready_timeout=self.live_ready_timeout,
            ),
        )
        artifacts_root = self.artifacts_dir
        if not artifacts_root:
            artifacts_root = tempfile.mkdtemp(prefix="jupyter-agent-artifacts-")
            self._own_artifacts_dir = True
        artifacts = cast("type[ArtifactStore]", self.artifact_store_class)(
            parent=self,
            root=artifacts_root,
            retention=self.artifact_retention,
            max_bytes=self.artifacts_max_bytes,
        )
        kernels = cast("type[KernelService]", self.kernel_service_class)(
            parent=self,
            kernel_manager=serverapp.kernel_manager,
            ready_timeout=self.kernel_ready_timeout,
            fd_headroom=self.fd_headroom,
            iopub_hwm=self.iopub_hwm,
            iopub_buffer_bytes=self.iopub_buffer_bytes,
            hold_activity=self.hold_kernel_activity,
        )
        sessions = cast("type[SessionManager]", self.session_manager_class)(
            parent=self,
            kernels=kernels,
            artifacts=artifacts,
            max_sessions=self.max_sessions,
            idle_timeout=self.idle_timeout,
            cleanup_interval=self.cleanup_interval,
            heartbeat_interval=self.heartbeat_interval,
            audit=audit,
        )
        pool = KernelPool(kernels, size=self.per_call_pool_size, parent=self)
        self.eval_service = cast("type[EvalService]", self.eval_service_class)(
            parent=self,
            sessions=sessions,
            kernels=kernels,
            artifacts=artifacts,
            contents_manager=serverapp.contents_manager,
            pool=pool,
            recovery=KernelRecovery(
                kernels, sessions, retry_backoff=self.kernel_create_retry_delay, pool=pool
            ),
            max_output_bytes=self.max_output_bytes,
            interrupt_grace=self.interrupt_timeout,
            max_cells=self.max_cells_per_request,
            liveness_interval=self.liveness_interval,
            init_timeout=self.init_timeout,
            output_limits=OutputLimits(
                display_bytes=self.max_display_bytes, html_convert_bytes=self.max_html_convert_bytes
            ),
        )

        notebook_kernels = NotebookKernels(
            serverapp.session_manager,
            sessions,
            parent=self,
            idle_timeout=self.notebook_kernel_idle_timeout,
            max_kernels=self.max_notebook_kernels,
        )
        self.notebook_runner = cast("type[NotebookRunner]", self.notebook_runner_class)(
            parent=self,
            eval_service=self.eval_service,
            store=self.notebook_store,
            session_manager=serverapp.session_manager,
            notebook_kernels=notebook_kernels,
            max_output_bytes_stored=self.max_run_output_bytes,
            max_cell_bytes_stored=self.max_run_cell_bytes,
        )
        self.eval_service.notebooks = self.notebook_runner  # eval with "notebook" runs in its kernel
        self.mcp_server = McpServer(
            self,
            heartbeat_interval=self.stream_heartbeat_interval,
            max_batch_items=self.mcp_max_batch_items,
            max_batch_answer_bytes=self.mcp_max_batch_answer_bytes,
            max_sessions_per_identity=self.mcp_max_sessions_per_identity,
            log=self.log,
        )

    def initialize_handlers(self) -> None:
        self.handlers.extend(
            [
                (rf"/api/agent/notebooks{path_regex}/run", NotebookRunHandler),
                (
                    rf"/api/agent/notebooks{NOTEBOOK_PATH_REGEX}/cells/(?P<cell>[^/]+)/outputs/(?P<n>[^/]+)",
                    NotebookOutputHandler,
                ),
                (rf"/api/agent/notebooks{NOTEBOOK_PATH_REGEX}/changes", NotebookChangesHandler),
                (rf"/api/agent/notebooks{NOTEBOOK_PATH_REGEX}/kernel", NotebookKernelHandler),
                (
                    rf"/api/agent/notebooks{NOTEBOOK_PATH_REGEX}/changes/(?P<change_id>[^/]+)",
                    NotebookChangeHandler,
                ),
                (
                    rf"/api/agent/notebooks{NOTEBOOK_PATH_REGEX}/changes/(?P<change_id>[^/]+)/undo",
                    NotebookUndoHandler,
                ),
                (rf"/api/agent/notebooks{path_regex}", NotebookHandler),
                (r"/api/agent/eval", EvalHandler),
                (r"/api/agent/sessions", SessionListHandler),
                (rf"/api/agent/sessions/{SESSION_NAME}", SessionHandler),
                (rf"/api/agent/sessions/{SESSION_NAME}/interrupt", SessionInterruptHandler),
                (r"/api/agent/artifacts/(?P<artifact_id>[^/]+)", ArtifactHandler),
                (r"/api/agent/tokens", TokenListHandler),
                (r"/api/agent/tokens/(?P<name>[^/]+)", TokenHandler),
                (r"/api/agent/openapi\.json", OpenAPIHandler),
                (r"/api/agent/mcp", McpHandler),
                (r"/api/agent/changes", ChangesHandler),
                # Last: every other path under /api/agent (the server's own 404 page is HTML).
                (r"/api/agent(?:/.*)?", UnknownRouteHandler),
            ]
        )

    async def _start_jupyter_server_extension(self, serverapp: object) -> None:
        self.eval_service.sessions.start()
        self.ledger.start()

    async def stop_extension(self) -> None:
        """Shut down every kernel this extension started and remove its private artifacts."""
        await self.eval_service.shutdown()
        await asyncio.to_thread(self.ledger.close)
        if self._own_artifacts_dir:
            self.eval_service.artifacts.remove_all()

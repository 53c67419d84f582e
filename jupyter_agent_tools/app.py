"""The Jupyter Server extension application: configuration traits, service wiring, shutdown."""

from __future__ import annotations

import tempfile
from typing import Any

from jupyter_server.base.handlers import path_regex
from jupyter_server.extension.application import ExtensionApp
from traitlets import CaselessStrEnum, Float, Int, TraitError, Unicode, validate

from . import __version__
from .artifacts import ArtifactStore
from .eval.kernels import KernelService
from .eval.service import EvalService
from .eval.sessions import SessionManager
from .handlers.eval import EvalHandler
from .handlers.mcp import McpHandler
from .handlers.notebooks import NotebookHandler
from .handlers.openapi import OpenAPIHandler
from .handlers.sessions import (
    ArtifactHandler,
    SessionHandler,
    SessionInterruptHandler,
    SessionListHandler,
)
from .mcp.server import McpServer
from .notebook.live import RTC_MODES, LiveDocuments
from .notebook.store import NotebookStore

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

    rtc_mode = CaselessStrEnum(
        RTC_MODES,
        default_value="auto",
        help="Where notebook edits go when real-time collaboration (jupyter-collaboration or "
        "jupyter-server-documents) has the notebook open in a room. 'auto': into the room's live document, "
        "so people see them at once and keep their unsaved work (the room autosaves the file); 'never': "
        "always into the file, as without collaboration.",
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

    max_output_bytes = Int(
        50 * 1024,
        help="Bytes of output kept visible per cell; past it the tail is kept and the full output is "
        "spilled to an artifact.",
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

    kernel_ready_timeout = Float(
        60.0, help="Seconds to wait for a newly started kernel to answer before giving up."
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

    artifacts_dir = Unicode(
        "",
        help="Directory for spilled outputs (artifacts). Empty: a private temporary directory removed "
        "when the server stops.",
    ).tag(config=True)

    artifact_retention = Float(
        24 * 3600.0, help="Seconds an artifact is kept at most (it also goes with its session; 0: forever)."
    ).tag(config=True)

    @validate("max_sessions", "max_output_bytes", "max_cells_per_request", "max_ops_per_request")
    def _at_least_one(self, proposal: Any) -> int:
        value = int(proposal["value"])
        if value < 1:
            name = proposal["trait"].name
            raise TraitError(f"AgentToolsApp.{name} must be at least 1, got {value}")
        return value

    notebook_store: NotebookStore
    eval_service: EvalService
    mcp_server: McpServer
    _own_artifacts_dir: bool = False

    def initialize_settings(self) -> None:
        assert self.serverapp is not None
        serverapp = self.serverapp
        self.notebook_store = NotebookStore(
            self.serverapp.contents_manager,
            log=self.log,
            summary_max_chars=self.summary_max_chars,
            max_ops=self.max_ops_per_request,
            live=LiveDocuments(lambda: serverapp.web_app.settings, mode=self.rtc_mode, log=self.log),
        )
        artifacts_root = self.artifacts_dir
        if not artifacts_root:
            artifacts_root = tempfile.mkdtemp(prefix="jupyter-agent-artifacts-")
            self._own_artifacts_dir = True
        artifacts = ArtifactStore(artifacts_root, retention=self.artifact_retention)
        kernels = KernelService(
            self.serverapp.kernel_manager,
            ready_timeout=self.kernel_ready_timeout,
            retry_backoff=self.kernel_create_retry_delay,
            fd_headroom=self.fd_headroom,
        )
        sessions = SessionManager(
            kernels,
            artifacts,
            max_sessions=self.max_sessions,
            idle_timeout=self.idle_timeout,
            cleanup_interval=self.cleanup_interval,
            heartbeat_interval=self.heartbeat_interval,
            log=self.log,
        )
        self.eval_service = EvalService(
            sessions,
            kernels,
            artifacts,
            self.serverapp.contents_manager,
            max_output_bytes=self.max_output_bytes,
            interrupt_grace=self.interrupt_timeout,
            max_cells=self.max_cells_per_request,
            liveness_interval=self.liveness_interval,
        )
        self.mcp_server = McpServer(self, heartbeat_interval=self.stream_heartbeat_interval, log=self.log)

    def initialize_handlers(self) -> None:
        self.handlers.extend(
            [
                (rf"/api/agent/notebooks{path_regex}", NotebookHandler),
                (r"/api/agent/eval", EvalHandler),
                (r"/api/agent/sessions", SessionListHandler),
                (rf"/api/agent/sessions/{SESSION_NAME}", SessionHandler),
                (rf"/api/agent/sessions/{SESSION_NAME}/interrupt", SessionInterruptHandler),
                (r"/api/agent/artifacts/(?P<artifact_id>[^/]+)", ArtifactHandler),
                (r"/api/agent/openapi\.json", OpenAPIHandler),
                (r"/api/agent/mcp", McpHandler),
            ]
        )

    async def _start_jupyter_server_extension(self, serverapp: object) -> None:
        self.eval_service.sessions.start()

    async def stop_extension(self) -> None:
        """Shut down every kernel this extension started and remove its private artifacts."""
        await self.eval_service.shutdown()
        if self._own_artifacts_dir:
            self.eval_service.artifacts.remove_all()

"""The Jupyter Server extension application: configuration traits, service wiring, shutdown."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, cast

from jupyter_server.base.handlers import path_regex
from jupyter_server.extension.application import ExtensionApp
from traitlets import Float, Int, Type, validate

from . import __version__
from .approvals import ApprovalPolicy
from .artifacts import ArtifactStore
from .audit import Audit
from .audit.feed import EventFeed
from .auth.hub_tokens import HubAgentTokens
from .auth.identity import APPROVALS_SETTING, AgentTokens, TokenEnded, adopt_agent_tokens
from .compat import install as install_compat
from .compat import local_root
from .execution.cells import CellExecutor
from .execution.eval_service import EvalService
from .execution.kernel_service import KernelService
from .execution.notebook_run import NotebookRunner
from .execution.pool import KernelPool
from .execution.recovery import KernelRecovery
from .execution.run_kernels import NotebookKernels
from .execution.session_manager import EvalSessionManager
from .focus import FocusStore
from .handlers import events, oauth, server_routes
from .handlers.approvals import ApprovalHandler, ApprovalListHandler
from .handlers.artifacts import ArtifactHandler
from .handlers.changes import (
    ChangesHandler,
    NotebookChangeHandler,
    NotebookChangesHandler,
    NotebookUndoHandler,
)
from .handlers.contents_save import watch_contents_removals, watch_contents_saves
from .handlers.eval import EvalHandler
from .handlers.files import FilesHandler
from .handlers.focus import FocusActionHandler, FocusHandler, FocusTabHandler
from .handlers.mcp import McpHandler
from .handlers.notebooks import (
    NOTEBOOK_PATH_REGEX,
    NotebookHandler,
    NotebookKernelHandler,
    NotebookOutputHandler,
    NotebookRunHandler,
)
from .handlers.openapi import OpenAPIHandler, UnknownRouteHandler
from .handlers.runs import RunCancelHandler, RunEventsHandler, RunHandler, RunListHandler
from .handlers.sessions import (
    SessionHandler,
    SessionInterruptHandler,
    SessionListHandler,
)
from .handlers.tokens import TokenHandler, TokenListHandler
from .ledger.service import Ledger
from .mcp.server import MAX_SESSIONS as MCP_MAX_SESSIONS
from .mcp.server import McpServer
from .notebook.live import LiveDocuments
from .notebook.store import NotebookStore
from .oauth.service import AgentOAuth
from .runs import RunRegistry
from .service import at_least, in_range
from .stores import AgentStores

GIB = 1024**3


# Any segment: a name no session can have answers a JSON 404 from the handler, not the server's HTML 404.
SESSION_NAME = r"(?P<name>[^/]+)"


class AgentToolsApp(ExtensionApp):
    """Routes where AI coding agents edit notebooks and run code.

    The application holds what is its own (the front door's limits, which class each service is); each
    service holds its own settings. Configure with ``c.<Class>.<trait> = value`` in
    ``jupyter_server_config.py`` or ``--<Class>.<trait>=value`` on the command line, for example
    ``c.AgentToolsApp.max_body_bytes`` or ``c.EvalSessionManager.max_sessions``.
    """

    name = "jupyter_agent_tools"
    version = __version__
    description = __doc__
    load_other_extensions = True
    # The configurables this extension builds: each holds its own settings (--help-all lists them).
    classes = [
        *ExtensionApp.classes,
        NotebookStore,
        LiveDocuments,
        ArtifactStore,
        KernelService,
        EvalSessionManager,
        KernelPool,
        KernelRecovery,
        CellExecutor,
        EvalService,
        NotebookRunner,
        NotebookKernels,
        Audit,
        EventFeed,
        Ledger,
        RunRegistry,
        ApprovalPolicy,
        AgentStores,
        AgentOAuth,
        HubAgentTokens,
        FocusStore,
    ]

    # -- the front door: request bodies, streams, MCP (the handlers read these) --
    max_body_bytes = Int(
        10 * 1024 * 1024,
        help="Largest request body (bytes) an agent route accepts; a larger one answers 413. 0: no limit "
        "of ours (Tornado's server-wide max_body_size, 100 MB by default, still applies).",
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

    # -- service classes --
    notebook_store_class = Type(
        default_value="jupyter_agent_tools.notebook.store.NotebookStore",
        klass=NotebookStore,
        help="The class that reads and edits notebooks (a subclass of NotebookStore). Built with "
        "parent=the app and contents_manager, live, audit, ledger; its settings are c.NotebookStore.*.",
    ).tag(config=True)

    artifact_store_class = Type(
        default_value="jupyter_agent_tools.artifacts.ArtifactStore",
        klass=ArtifactStore,
        help="The class that keeps spilled outputs (a subclass of ArtifactStore). Built with "
        "parent=the app; its settings are c.ArtifactStore.*.",
    ).tag(config=True)

    kernel_service_class = Type(
        default_value="jupyter_agent_tools.execution.kernel_service.KernelService",
        klass=KernelService,
        help="The class that starts, connects to and shuts down kernels (a subclass of KernelService). "
        "Built with parent=the app and kernel_manager; its settings are c.KernelService.*.",
    ).tag(config=True)

    session_manager_class = Type(
        default_value="jupyter_agent_tools.execution.session_manager.EvalSessionManager",
        klass=EvalSessionManager,
        help="The class that keeps, evicts and sweeps the eval sessions (a subclass of EvalSessionManager). "
        "Built with parent=the app and kernels, artifacts, audit; its settings are c.EvalSessionManager.*.",
    ).tag(config=True)

    eval_service_class = Type(
        default_value="jupyter_agent_tools.execution.eval_service.EvalService",
        klass=EvalService,
        help="The class that runs eval requests (a subclass of EvalService). Built with parent=the app "
        "and sessions, kernels, artifacts, contents_manager, pool; its settings are c.EvalService.*.",
    ).tag(config=True)

    notebook_runner_class = Type(
        default_value="jupyter_agent_tools.execution.notebook_run.NotebookRunner",
        klass=NotebookRunner,
        help="The class that runs a notebook's cells in its kernel (a subclass of NotebookRunner). Built "
        "with parent=the app and its collaborators (sessions, kernels, recovery, artifacts, audit, pool, "
        "execute: the eval service's, store, session_manager, notebook_kernels); its settings are "
        "c.NotebookRunner.*.",
    ).tag(config=True)

    run_registry_class = Type(
        default_value="jupyter_agent_tools.runs.registry.RunRegistry",
        klass=RunRegistry,
        help="The detached runs' registry (a subclass of RunRegistry): built with parent=the app, artifacts "
        "and root_dir; its settings are its own (c.RunRegistry.*).",
    ).tag(config=True)
    ledger_class = Type(
        default_value="jupyter_agent_tools.ledger.service.Ledger",
        klass=Ledger,
        help="The class that records notebook changes (a subclass of Ledger). Built with parent=the app; "
        "its settings are c.Ledger.*.",
    ).tag(config=True)

    approval_policy_class = Type(
        default_value="jupyter_agent_tools.approvals.service.ApprovalPolicy",
        klass=ApprovalPolicy,
        help="The approval gate (a subclass of ApprovalPolicy): built with parent=the app and audit; its "
        "settings are c.ApprovalPolicy.*.",
    ).tag(config=True)

    @validate("max_body_bytes")
    def _valid_body_bytes(self, proposal: Any) -> Any:
        return at_least(proposal, 0)

    @validate("stream_lag_grace")
    def _valid_lag_grace(self, proposal: Any) -> Any:
        return at_least(proposal, 0)

    @validate("stream_heartbeat_interval")
    def _valid_heartbeat(self, proposal: Any) -> Any:
        return at_least(proposal, 0, strict=True)

    @validate("stream_backlog_bytes")
    def _valid_backlog(self, proposal: Any) -> int:
        return in_range(proposal, 1024, GIB)

    @validate("mcp_max_batch_items")
    def _valid_batch_items(self, proposal: Any) -> int:
        return in_range(proposal, 1, 10_000, "messages")

    @validate("mcp_max_batch_answer_bytes")
    def _valid_batch_answer(self, proposal: Any) -> int:
        return in_range(proposal, 1024, GIB)

    @validate("mcp_max_sessions_per_identity")
    def _valid_sessions_per_identity(self, proposal: Any) -> int:
        return in_range(proposal, 1, MCP_MAX_SESSIONS, "sessions")

    audit: Audit
    event_feed: EventFeed
    ledger: Ledger
    notebook_store: NotebookStore
    eval_service: EvalService
    notebook_runner: NotebookRunner
    mcp_server: McpServer
    run_registry: RunRegistry
    approval_policy: ApprovalPolicy
    oauth: AgentOAuth
    focus: FocusStore

    @classmethod
    def _load_jupyter_server_extension(cls, serverapp: Any) -> None:
        """Load as every extension does; when that fails (a typo in ``c.ApprovalPolicy.rules``...), say so
        loudly and leave nothing that would let agent tokens in: without the extension's settings the
        identity provider refuses them everywhere (fail closed). jupyter_server itself only logs a warning
        and serves on without the extension.

        First, agent tokens are put in front of a server's own identity provider when it has one
        (JupyterHub's): even if the rest fails to load, an agent token is then refused here, never handed on
        to the hub's API. Before anything, the upstream patches are applied, once per process
        (:func:`.compat.install`)."""
        install_compat()
        adopt_agent_tokens(serverapp)
        try:
            super()._load_jupyter_server_extension(serverapp)
        except Exception as e:
            # broad: whatever fails the load (a bad setting, a service that cannot start) drops the gate's
            # setting; re-raised
            serverapp.web_app.settings.pop(APPROVALS_SETTING, None)
            serverapp.log.critical(
                "\n%s\n jupyter_agent_tools did NOT load: %s\n Agent tokens are refused on every route until "
                "the configuration is fixed and the server restarted.\n%s",
                "!" * 78,
                e,
                "!" * 78,
            )
            raise

    def initialize_settings(self) -> None:
        """Build the services, each with ``parent=self``: their settings (``c.EvalService.*``, ...) reach
        them through the configuration, so only collaborators are passed here."""
        assert self.serverapp is not None
        serverapp = self.serverapp
        self.audit = audit = Audit(parent=self, event_logger=getattr(serverapp, "event_logger", None))
        audit.register_schemas()
        # AgentAuthorizer (jupyter_agent_tools.auth) records agent refusals on every route through it
        self.settings["jupyter_agent_tools_audit"] = audit
        self.event_feed = EventFeed(parent=self)
        self.ledger = cast("type[Ledger]", self.ledger_class)(parent=self, audit=audit)
        self.approval_policy = cast("type[ApprovalPolicy]", self.approval_policy_class)(
            parent=self, audit=audit, root_dir=local_root(serverapp.contents_manager)
        )
        # AgentAuthorizer closes the routes that cannot ask (kernels, terminals) to agents that must ask
        self.settings[APPROVALS_SETTING] = self.approval_policy
        self.notebook_store = cast("type[NotebookStore]", self.notebook_store_class)(
            parent=self,
            contents_manager=serverapp.contents_manager,
            kernel_spec_manager=serverapp.kernel_spec_manager,
            audit=audit,
            ledger=self.ledger,
            live=LiveDocuments(parent=self, settings=lambda: serverapp.web_app.settings),
        )
        # saves through /api/contents that overwrite an agent's change are recorded
        watch_contents_saves(serverapp.contents_manager, self.notebook_store)
        watch_contents_removals(getattr(serverapp, "event_logger", None), self.ledger)
        artifacts = cast("type[ArtifactStore]", self.artifact_store_class)(parent=self)
        kernels = cast("type[KernelService]", self.kernel_service_class)(
            parent=self, kernel_manager=serverapp.kernel_manager
        )
        sessions = cast("type[EvalSessionManager]", self.session_manager_class)(
            parent=self, kernels=kernels, artifacts=artifacts, audit=audit
        )
        notebook_kernels = NotebookKernels(
            parent=self, session_manager=serverapp.session_manager, sessions=sessions
        )
        # Built once here and given to eval and notebook runs alike: the warm pool, the recovery policy
        # and the cell executor (the one cell loop and execution path, bounded by c.CellExecutor.*).
        pool = KernelPool(parent=self, kernels=kernels)
        recovery = KernelRecovery(parent=self, kernels=kernels, sessions=sessions, pool=pool)
        cells = CellExecutor(parent=self, kernels=kernels, artifacts=artifacts, sessions=sessions)
        self.eval_service = evals = cast("type[EvalService]", self.eval_service_class)(
            parent=self,
            sessions=sessions,
            kernels=kernels,
            artifacts=artifacts,
            contents_manager=serverapp.contents_manager,
            pool=pool,
            recovery=recovery,
            cells=cells,
            notebook_kernels=notebook_kernels,
        )
        self.notebook_runner = cast("type[NotebookRunner]", self.notebook_runner_class)(
            parent=self,
            sessions=sessions,
            kernels=kernels,
            recovery=recovery,
            artifacts=artifacts,
            audit=audit,
            pool=pool,
            cells=cells,
            max_cells=evals.max_cells,  # eval with "notebook" takes as many cells as any eval
            store=self.notebook_store,
            session_manager=serverapp.session_manager,
            notebook_kernels=notebook_kernels,
        )
        self._on_a_gateway(kernels, sessions, pool)
        self.run_registry = cast("type[RunRegistry]", self.run_registry_class)(
            parent=self, artifacts=artifacts, root_dir=str(getattr(serverapp, "root_dir", "") or "")
        )
        self._end_what_tokens_start(getattr(serverapp, "identity_provider", None))
        # what the person looks at, when they share it: in memory only (docs/panel.md, "Share my focus")
        self.focus = FocusStore(
            parent=self, audit=audit, root_dir=getattr(serverapp.contents_manager, "root_dir", None)
        )
        # MCP clients sign in with OAuth (the access tokens are agent tokens): only with agent tokens on
        self.oauth = AgentOAuth(
            parent=self,
            provider=getattr(serverapp, "identity_provider", None),
            data_dir=str(getattr(serverapp, "data_dir", "") or ""),
        )
        self.mcp_server = McpServer(
            self,
            heartbeat_interval=self.stream_heartbeat_interval,
            max_batch_items=self.mcp_max_batch_items,
            max_batch_answer_bytes=self.mcp_max_batch_answer_bytes,
            max_sessions_per_identity=self.mcp_max_sessions_per_identity,
            log=self.log,
        )

    def _on_a_gateway(self, kernels: KernelService, sessions: EvalSessionManager, pool: KernelPool) -> None:
        """Kernels on a remote gateway (GatewayClient.url set): record the kernels started there (for the
        clean-up of those a process leaves behind), let a kernel the gateway refuses for its per-user cap
        take the warm pool's place, and say once which defaults changed (docs/admin.md)."""
        if not kernels.gateway:
            return
        from .execution.gateway import RECORD_NAME, watch_kernel_cap

        owned = kernels.own_kernels_on_gateway(AgentStores(parent=self).path(RECORD_NAME))
        watch_kernel_cap(kernels.kernel_manager, pool.release, self.log)
        self.log.info(
            "jupyter_agent_tools: kernels run on a gateway, so: warm pool of %d kernel(s)%s; idle sessions' "
            "kernels checked every %g s; notebook runs never adopt pooled kernels; a kernel start does not "
            "count against a call's timeout; kernels started there carry KERNEL_AGENT_TOOLS_SERVER=%s and "
            "are recorded in %s, where the next start finds those left behind",
            pool.size,
            "" if "size" in self.config.get("KernelPool", {}) else " (default on a gateway)",
            sessions.heartbeat_interval,
            owned.server_id if owned is not None else "-",
            owned.path if owned is not None else "-",
        )

    def _end_what_tokens_start(self, provider: Any) -> None:
        """An agent token that ends (revoked, expired) ends what it started: its approval requests are
        withdrawn and its grants dropped, its detached runs cancelled, its MCP focus subscriptions ended
        (its websockets: the provider)."""
        if not isinstance(provider, AgentTokens):
            return
        approvals, runs = self.approval_policy, self.run_registry

        def ended(token: TokenEnded) -> None:
            approvals.withdraw_token(token.token_id, token.reason)
            runs.cancel_token(token.token_id, token.reason)
            mcp = getattr(self, "mcp_server", None)
            if mcp is not None:  # its subscriptions to the person's focus end
                mcp.end_token(token.token_id)

        provider.on_token_ended(ended)

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
                (r"/api/agent/runs", RunListHandler),
                (r"/api/agent/runs/(?P<run_id>[^/]+)", RunHandler),
                (r"/api/agent/runs/(?P<run_id>[^/]+)/events", RunEventsHandler),
                (r"/api/agent/runs/(?P<run_id>[^/]+)/cancel", RunCancelHandler),
                (r"/api/agent/approvals", ApprovalListHandler),
                (r"/api/agent/approvals/(?P<approval_id>[^/]+)", ApprovalHandler),
                (r"/api/agent/tokens", TokenListHandler),
                (r"/api/agent/tokens/(?P<name>[^/]+)", TokenHandler),
                (r"/api/agent/openapi\.json", OpenAPIHandler),
                (r"/api/agent/mcp", McpHandler),
                (r"/api/agent/changes", ChangesHandler),
                (r"/api/agent/files", FilesHandler),
                (r"/api/agent/focus", FocusHandler),
                (r"/api/agent/focus/tabs/(?P<tab>[^/]+)", FocusTabHandler),
                (r"/api/agent/focus/actions", FocusActionHandler),
                *oauth.handlers(self.oauth),
                # Last: every other path under /api/agent (the server's own 404 page is HTML).
                (r"/api/agent(?:/.*)?", UnknownRouteHandler),
            ]
        )
        # jupyter_server's own routes on the same URLs (an extension's are matched first): the event
        # websocket, bounded per subscriber and filtered for agents; with agent tokens, the kernel and
        # session lists as an agent may see them
        own: list[tuple[str, Any]] = list(events.HANDLERS)
        if getattr(getattr(self.serverapp, "authorizer", None), "applies_agent_scopes", False):
            own += server_routes.HANDLERS
        self.handlers[:0] = own
        web_app = getattr(self.serverapp, "web_app", None)
        if web_app is not None and self.oauth.active:
            # the well-known documents at the origin, whatever the base URL (extension routes are under it)
            web_app.add_handlers(".*$", oauth.origin_handlers(self.oauth, web_app.settings["base_url"]))

    async def _start_jupyter_server_extension(self, serverapp: object) -> None:
        if not hasattr(self, "mcp_server"):  # initialize_settings failed (logged by jupyter_server)
            return
        self.eval_service.sessions.start()
        # Kernels an earlier process of this server left on the gateway: shut down in the background.
        self._reaping = asyncio.ensure_future(self.eval_service.kernels.reap_orphans())
        self.ledger.start()
        self.focus.start()
        await self.run_registry.load()  # a previous process's unfinished runs become "lost"
        await self.approval_policy.start()  # requests a previous process left pending expire

    async def stop_extension(self) -> None:
        """Shut down every kernel this extension started and remove its private artifacts.

        After a partial start (a service failed to build, so the extension did not load) only what was
        built is stopped, and a step that fails is logged: the server must still exit."""
        registry, evals, ledger = (getattr(self, n, None) for n in ("run_registry", "eval_service", "ledger"))
        approvals = getattr(self, "approval_policy", None)
        signins = getattr(self, "oauth", None)
        focus = getattr(self, "focus", None)
        if focus is not None:
            focus.stop_sweeping()
        steps: list[tuple[str, Callable[[], Awaitable[Any]]]] = []
        if registry is not None:  # first: its unfinished runs are lost, not failed
            steps.append(("runs", registry.shutdown))
        if evals is not None:
            steps.append(("eval sessions", evals.shutdown))
        if ledger is not None:
            steps.append(("ledger", lambda: asyncio.to_thread(ledger.close)))
        if approvals is not None:
            steps.append(("approvals", lambda: asyncio.to_thread(approvals.stop)))
        if signins is not None:
            steps.append(("OAuth grants", lambda: asyncio.to_thread(signins.close)))
        for what, step in steps:
            try:
                await step()
            except Exception:  # broad: one shutdown step failing in any way must not skip the others; logged
                self.log.exception("jupyter_agent_tools: stopping the %s failed", what)
        owned = evals.kernels.owned if evals is not None else None
        if owned is not None:
            owned.close()  # its last writes (kernels shut down just now) are done first
        if evals is not None and evals.artifacts.owns_root:
            evals.artifacts.remove_all()

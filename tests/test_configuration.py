"""Jupyter-native configuration: swappable service classes, validated traits, documented names."""

from __future__ import annotations

from typing import Any

import nbformat
import pytest
from traitlets import TraitError
from traitlets.config import Config, LoggingConfigurable

from jupyter_agent_tools.app import AgentToolsApp
from jupyter_agent_tools.artifacts import ArtifactStore
from jupyter_agent_tools.eval.kernels import KernelService
from jupyter_agent_tools.eval.notebook_kernels import NotebookKernels
from jupyter_agent_tools.eval.notebook_run import NotebookRunner
from jupyter_agent_tools.eval.service import EvalService
from jupyter_agent_tools.eval.sessions import SessionManager
from jupyter_agent_tools.notebook.store import NotebookStore


class RecordingStore(NotebookStore):
    """A store configured through ``c.AgentToolsApp.notebook_store_class``: notes every read."""

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self.reads: list[str] = []

    async def read(self, path: str, **kwargs: Any) -> dict[str, Any]:
        self.reads.append(path)
        return await super().read(path, **kwargs)


# Documented c.AgentToolsApp values, and where each one must arrive.
DOCUMENTED = {
    "max_sessions": (3, "sessions", "max_sessions"),
    "idle_timeout": (12.0, "sessions", "idle_timeout"),
    "cleanup_interval": (45.0, "sessions", "cleanup_interval"),
    "heartbeat_interval": (0.0, "sessions", "heartbeat_interval"),
    "summary_max_chars": (77, "store", "summary_max_chars"),
    "max_ops_per_request": (9, "store", "max_ops"),
    "notebook_busy_timeout": (0.5, "store", "busy_timeout"),
    "kernel_ready_timeout": (20.0, "kernels", "ready_timeout"),
    "fd_headroom": (0, "kernels", "fd_headroom"),
    "iopub_hwm": (7, "kernels", "iopub_hwm"),
    "iopub_buffer_bytes": (3_000_000, "kernels", "iopub_buffer_bytes"),
    "max_output_bytes": (4096, "eval", "max_output_bytes"),
    "interrupt_timeout": (2.5, "eval", "interrupt_grace"),
    "max_cells_per_request": (5, "eval", "max_cells"),
    "liveness_interval": (0.25, "eval", "liveness_interval"),
    "init_timeout": (30.0, "eval", "init_timeout"),
    "max_run_output_bytes": (2048, "runner", "max_output_bytes_stored"),
    "notebook_kernel_idle_timeout": (90.0, "notebook_kernels", "idle_timeout"),
    "max_notebook_kernels": (2, "notebook_kernels", "max_kernels"),
    "artifact_retention": (600.0, "artifacts", "retention"),
    "artifacts_max_bytes": (5_000_000, "artifacts", "max_bytes"),
}


@pytest.fixture
def jp_server_config() -> dict[str, Any]:
    agent: dict[str, Any] = {name: value for name, (value, _, _) in DOCUMENTED.items()}
    agent.update(notebook_store_class=RecordingStore, max_display_bytes=5000, kernel_create_retry_delay=0.3)
    return {"ServerApp": {"jpserver_extensions": {"jupyter_agent_tools": True}}, "AgentToolsApp": agent}


def agent_app(jp_serverapp: Any) -> AgentToolsApp:
    (app,) = jp_serverapp.extension_manager.extension_apps["jupyter_agent_tools"]
    assert isinstance(app, AgentToolsApp)
    return app


def services(app: AgentToolsApp) -> dict[str, Any]:
    return {
        "store": app.notebook_store,
        "eval": app.eval_service,
        "sessions": app.eval_service.sessions,
        "kernels": app.eval_service.kernels,
        "artifacts": app.eval_service.artifacts,
        "runner": app.notebook_runner,
        "notebook_kernels": app.notebook_runner.notebook_kernels,
    }


async def test_configured_store_class_is_the_one_the_routes_use(jp_serverapp, jp_root_dir, api):
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1 + 1")])
    nbformat.write(notebook, jp_root_dir / "a.ipynb")
    app = agent_app(jp_serverapp)
    store = app.notebook_store
    assert type(store) is RecordingStore
    assert app.notebook_runner.store is store

    status, answer = await api("GET", "notebooks", "a.ipynb")

    assert status == 200, answer
    assert [path.strip("/") for path in store.reads] == ["a.ipynb"]


async def test_documented_values_reach_the_services(jp_serverapp):
    app = agent_app(jp_serverapp)
    found = services(app)
    for name, (value, service, attribute) in DOCUMENTED.items():
        assert getattr(app, name) == value, name
        assert getattr(found[service], attribute) == value, f"AgentToolsApp.{name} -> {service}.{attribute}"
    assert app.eval_service.output_limits.display_bytes == 5000
    assert app.eval_service.recovery.retry_backoff == 0.3


async def test_services_are_configurables_of_the_app(jp_serverapp):
    app = agent_app(jp_serverapp)
    for name, service in services(app).items():
        assert isinstance(service, LoggingConfigurable), name
        assert service.parent is app, name
        assert service.log is app.log, name


def test_class_traits_default_to_the_shipped_services():
    app = AgentToolsApp()
    assert app.notebook_store_class is NotebookStore
    assert app.artifact_store_class is ArtifactStore
    assert app.kernel_service_class is KernelService
    assert app.session_manager_class is SessionManager
    assert app.eval_service_class is EvalService
    assert app.notebook_runner_class is NotebookRunner


def test_class_trait_accepts_an_import_name_and_refuses_other_classes():
    app = AgentToolsApp()
    app.notebook_store_class = f"{__name__}.RecordingStore"
    assert app.notebook_store_class is RecordingStore
    with pytest.raises(TraitError, match="notebook_store_class"):
        app.notebook_store_class = SessionManager


INVALID = [
    ("max_sessions", 0, "at least 1"),
    ("max_notebook_kernels", 0, "at least 1"),
    ("notebook_kernel_idle_timeout", -1.0, "at least 0"),
    ("max_ops_per_request", 0, "at least 1"),
    ("notebook_busy_timeout", -1.0, "at least 0"),
    ("idle_timeout", -1.0, "at least 0"),
    ("cleanup_interval", -0.5, "at least 0"),
    ("heartbeat_interval", -1.0, "at least 0"),
    ("interrupt_timeout", -1.0, "at least 0"),
    ("kernel_create_retry_delay", -1.0, "at least 0"),
    ("artifact_retention", -1.0, "at least 0"),
    ("artifacts_max_bytes", -1, "at least 0"),
    ("max_body_bytes", -1, "at least 0"),
    ("fd_headroom", -1, "at least 0"),
    ("kernel_ready_timeout", 0.0, "greater than 0"),
    ("init_timeout", 0.0, "greater than 0"),
    ("liveness_interval", 0.0, "greater than 0"),
    ("stream_heartbeat_interval", 0.0, "greater than 0"),
    ("kernel_ready_timeout", float("nan"), "greater than 0"),
    ("iopub_hwm", 0, "between 1 and 100000"),
    ("iopub_buffer_bytes", -1, "between 0 and"),
    ("mcp_max_batch_items", 0, "between 1 and 10000"),
    ("mcp_max_batch_answer_bytes", 100, "between 1024 and"),
    ("mcp_max_sessions_per_identity", 1001, "between 1 and 1000"),
]


@pytest.mark.parametrize(("name", "value", "bound"), INVALID, ids=[f"{n}={v}" for n, v, _ in INVALID])
def test_invalid_value_raises_trait_error_naming_the_trait(name, value, bound):
    with pytest.raises(TraitError, match=rf"^AgentToolsApp\.{name} must be {bound}"):
        AgentToolsApp(config=Config({"AgentToolsApp": {name: value}}))
    with pytest.raises(TraitError, match=rf"^AgentToolsApp\.{name} must be {bound}"):
        setattr(AgentToolsApp(), name, value)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("idle_timeout", 0.0),
        ("heartbeat_interval", 0.0),
        ("artifact_retention", 0.0),
        ("artifacts_max_bytes", 0),
        ("fd_headroom", 0),
        ("notebook_kernel_idle_timeout", 0.0),
    ],
)
def test_zero_is_accepted_where_it_means_never(name, value):
    assert getattr(AgentToolsApp(config=Config({"AgentToolsApp": {name: value}})), name) == value


def test_services_validate_their_own_traits(tmp_path):
    with pytest.raises(TraitError, match=r"^SessionManager\.max_sessions must be at least 1, got 0"):
        SessionManager(max_sessions=0)
    with pytest.raises(TraitError, match=r"^KernelService\.ready_timeout must be greater than 0"):
        KernelService(object(), ready_timeout=0)
    with pytest.raises(TraitError, match=r"^ArtifactStore\.retention must be at least 0"):
        ArtifactStore(tmp_path, retention=-1)
    with pytest.raises(TraitError, match=r"^ArtifactStore\.max_bytes must be at least 0"):
        ArtifactStore(tmp_path, max_bytes=-1)
    with pytest.raises(TraitError, match=r"^NotebookStore\.busy_timeout must be at least 0"):
        NotebookStore(object(), busy_timeout=-1)
    with pytest.raises(TraitError, match=r"^NotebookRunner\.max_output_bytes_stored must be at least 1"):
        NotebookRunner(max_output_bytes_stored=0)
    sessions = SessionManager(KernelService(object()), ArtifactStore(tmp_path))
    with pytest.raises(TraitError, match=r"^NotebookKernels\.max_kernels must be at least 1, got 0"):
        NotebookKernels(object(), sessions, max_kernels=0)
    with pytest.raises(TraitError, match=r"^EvalService\.liveness_interval must be greater than 0"):
        EvalService(liveness_interval=0)
    with pytest.raises(TraitError, match="sessions"):
        EvalService(sessions=object())  # a collaborator of the wrong kind


def test_positional_construction_still_works(tmp_path):
    artifacts = ArtifactStore(tmp_path / "a")
    kernels = KernelService(object(), ready_timeout=5.0)
    sessions = SessionManager(kernels, artifacts, max_sessions=2)
    service = EvalService(sessions, kernels, artifacts, object(), max_cells=3)
    assert (artifacts.root, artifacts.retention) == (tmp_path / "a", 24 * 3600.0)
    assert (sessions.kernels, sessions.artifacts, sessions.max_sessions) == (kernels, artifacts, 2)
    assert service.recovery.kernels is kernels and service.recovery.sessions is sessions
    assert service.max_cells == 3 and service.output_limits.display_bytes == 2 * 1024 * 1024
    assert sessions.log.name == "jupyter_agent_tools.eval.sessions"

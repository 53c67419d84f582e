"""Jupyter-native configuration: swappable service classes, validated traits, documented names."""

from __future__ import annotations

import inspect
import logging
from pathlib import Path
from typing import Any

import nbformat
import pytest
from traitlets import TraitError
from traitlets.config import Config, LoggingConfigurable

from jupyter_agent_tools.app import AgentToolsApp
from jupyter_agent_tools.artifacts import ArtifactStore
from jupyter_agent_tools.execution.cells import CellExecutor, CellLimits
from jupyter_agent_tools.execution.eval_service import EvalService
from jupyter_agent_tools.execution.executor import ExecutionLimits, run_cell
from jupyter_agent_tools.execution.kernel_service import KernelService
from jupyter_agent_tools.execution.messages import OutputLimits, RichOutput
from jupyter_agent_tools.execution.notebook_run import NotebookRunner
from jupyter_agent_tools.execution.pace import StreamPace
from jupyter_agent_tools.execution.pool import KernelPool
from jupyter_agent_tools.execution.recovery import KernelRecovery
from jupyter_agent_tools.execution.run_kernels import NotebookKernels
from jupyter_agent_tools.execution.session_manager import EvalSessionManager
from jupyter_agent_tools.execution.sink import OutputSink
from jupyter_agent_tools.ledger.service import Ledger
from jupyter_agent_tools.mcp.server import McpServer
from jupyter_agent_tools.notebook.live import LiveDocuments
from jupyter_agent_tools.notebook.store import NotebookStore


class RecordingStore(NotebookStore):
    """A store configured through ``c.AgentToolsApp.notebook_store_class``: notes every read."""

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self.reads: list[str] = []

    async def read(self, path: str, **kwargs: Any) -> dict[str, Any]:
        self.reads.append(path)
        return await super().read(path, **kwargs)


# Documented settings, as c.<Class>.<trait> = value, and the service each one must arrive at.
DOCUMENTED = {
    ("EvalSessionManager", "max_sessions"): (3, "sessions"),
    ("EvalSessionManager", "idle_timeout"): (12.0, "sessions"),
    ("EvalSessionManager", "cleanup_interval"): (45.0, "sessions"),
    ("EvalSessionManager", "heartbeat_interval"): (0.0, "sessions"),
    ("NotebookStore", "summary_max_chars"): (77, "store"),
    ("NotebookStore", "max_ops"): (9, "store"),
    ("NotebookStore", "busy_timeout"): (0.5, "store"),
    ("LiveDocuments", "mode"): ("never", "live"),
    ("LiveDocuments", "ready_timeout"): (4.0, "live"),
    ("KernelService", "ready_timeout"): (20.0, "kernels"),
    ("KernelService", "fd_headroom"): (0, "kernels"),
    ("KernelService", "iopub_hwm"): (7, "kernels"),
    ("KernelService", "iopub_spill_bytes"): (7_000_000, "kernels"),
    ("KernelService", "iopub_buffer_bytes"): (3_000_000, "kernels"),
    ("KernelService", "hold_activity"): (False, "kernels"),
    ("KernelService", "check_ports"): (False, "kernels"),
    ("CellExecutor", "max_output_bytes"): (4096, "cells"),
    ("CellExecutor", "interrupt_grace"): (2.5, "cells"),
    ("EvalService", "max_cells"): (5, "eval"),
    ("CellExecutor", "liveness_interval"): (0.25, "cells"),
    ("EvalService", "init_timeout"): (30.0, "eval"),
    ("CellExecutor", "max_display_bytes"): (5000, "cells"),
    ("CellExecutor", "max_html_convert_bytes"): (4096, "cells"),
    ("KernelPool", "size"): (0, "pool"),
    ("KernelRecovery", "retry_backoff"): (0.3, "recovery"),
    ("NotebookRunner", "max_output_bytes_stored"): (2048, "runner"),
    ("NotebookRunner", "max_cell_bytes_stored"): (8192, "runner"),
    ("NotebookKernels", "idle_timeout"): (90.0, "notebook_kernels"),
    ("NotebookKernels", "max_kernels"): (2, "notebook_kernels"),
    ("ArtifactStore", "retention"): (600.0, "artifacts"),
    ("ArtifactStore", "max_bytes"): (5_000_000, "artifacts"),
    ("Audit", "include_code"): (True, "audit"),
    ("Ledger", "max_changes_per_notebook"): (50, "ledger"),
    ("Ledger", "max_bytes"): (1024 * 1024, "ledger"),
    ("AgentToolsApp", "max_body_bytes"): (1000, "app"),
    ("AgentToolsApp", "stream_heartbeat_interval"): (2.0, "app"),
}


@pytest.fixture
def jp_server_config(tmp_path: Path) -> dict[str, Any]:
    config: dict[str, Any] = {"ServerApp": {"jpserver_extensions": {"jupyter_agent_tools": True}}}
    for (section, name), (value, _) in DOCUMENTED.items():
        config.setdefault(section, {})[name] = value
    config["AgentToolsApp"]["notebook_store_class"] = RecordingStore
    config["ArtifactStore"]["root_dir"] = str(tmp_path / "artifacts")
    return config


def agent_app(jp_serverapp: Any) -> AgentToolsApp:
    (app,) = jp_serverapp.extension_manager.extension_apps["jupyter_agent_tools"]
    assert isinstance(app, AgentToolsApp)
    return app


def services(app: AgentToolsApp) -> dict[str, Any]:
    """The services the application built, each a configurable whose parent is the application."""
    return {
        "store": app.notebook_store,
        "live": app.notebook_store.live,
        "eval": app.eval_service,
        "sessions": app.eval_service.sessions,
        "kernels": app.eval_service.kernels,
        "artifacts": app.eval_service.artifacts,
        "pool": app.eval_service.pool,
        "cells": app.eval_service.cells,
        "runner": app.notebook_runner,
        "notebook_kernels": app.notebook_runner.notebook_kernels,
        "audit": app.audit,
        "ledger": app.ledger,
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


async def test_documented_values_reach_the_services(jp_serverapp, tmp_path):
    app = agent_app(jp_serverapp)
    found = {**services(app), "app": app, "recovery": app.eval_service.recovery}
    for (section, name), (value, service) in DOCUMENTED.items():
        target = found[service]
        assert section in [cls.__name__ for cls in type(target).__mro__], (section, service)
        assert getattr(target, name) == value, f"{section}.{name} did not reach {service}"
    assert app.eval_service.cells.limits.output_limits.display_bytes == 5000
    assert app.eval_service.cells.limits.output_limits.html_convert_bytes == 4096
    assert app.eval_service.artifacts.root == tmp_path / "artifacts"
    assert not app.eval_service.artifacts.owns_root  # a configured directory is not removed at stop
    assert app.mcp_server.heartbeat_interval == 2.0


async def test_services_are_configurables_of_the_app(jp_serverapp):
    app = agent_app(jp_serverapp)
    for name, service in services(app).items():
        assert isinstance(service, LoggingConfigurable), name
        assert service.parent is app, name
        assert service.log is app.log, name
    assert app.eval_service.recovery.parent is app  # built once by the application, given to both


def test_a_setting_is_declared_on_one_class_only():
    """The application keeps the front door's limits and the service classes; every other setting is a
    trait of the one service that uses it (no copy of it on the application)."""
    own = set(AgentToolsApp.class_own_traits(config=True))
    assert {name for name in own if not name.endswith("_class")} == {
        "max_body_bytes",
        "stream_heartbeat_interval",
        "stream_backlog_bytes",
        "stream_lag_grace",
        "mcp_max_batch_items",
        "mcp_max_batch_answer_bytes",
        "mcp_max_sessions_per_identity",
    }
    holders: dict[str, list[str]] = {}
    for cls in CONFIGURABLES:
        for name in cls.class_own_traits(config=True):
            holders.setdefault(name, []).append(cls.__name__)
    # A name on two classes is two settings (each documented under its class), never a copy of one.
    assert {name: classes for name, classes in holders.items() if len(classes) > 1} == {
        "ready_timeout": ["LiveDocuments", "KernelService"],
        "max_bytes": ["ArtifactStore", "Ledger", "ApprovalPolicy"],
        "idle_timeout": ["EvalSessionManager", "NotebookKernels"],
        "db_path": ["Ledger", "ApprovalPolicy"],
    }


# Values the pure core and the connections take from a service's validated traits: required parameters,
# so a setting changed on its trait cannot silently keep an old default of its own here (issue 36.4).
TAKEN_FROM_TRAITS = [
    (OutputSink, "max_bytes"),
    (StreamPace, "grace"),
    (CellLimits, "max_output_bytes"),
    (CellLimits, "interrupt_grace"),
    (CellLimits, "liveness_interval"),
    (CellLimits, "output_limits"),
    (ExecutionLimits, "interrupt_grace"),
    (ExecutionLimits, "liveness_interval"),
    (OutputLimits, "display_bytes"),
    (OutputLimits, "html_convert_bytes"),
    (RichOutput, "limits"),
    (run_cell, "output_limits"),
    (McpServer, "heartbeat_interval"),
    (McpServer, "max_batch_items"),
    (McpServer, "max_batch_answer_bytes"),
    (McpServer, "max_sessions_per_identity"),
]


@pytest.mark.parametrize(("taker", "name"), TAKEN_FROM_TRAITS, ids=lambda v: getattr(v, "__name__", v))
def test_a_value_taken_from_a_trait_has_no_default_of_its_own(taker, name):
    parameter = inspect.signature(taker).parameters[name]
    assert parameter.default is inspect.Parameter.empty, f"{taker.__name__}({name}=...) shadows its trait"


def test_class_traits_default_to_the_shipped_services():
    app = AgentToolsApp()
    assert app.notebook_store_class is NotebookStore
    assert app.artifact_store_class is ArtifactStore
    assert app.kernel_service_class is KernelService
    assert app.session_manager_class is EvalSessionManager
    assert app.eval_service_class is EvalService
    assert app.notebook_runner_class is NotebookRunner


def test_class_trait_accepts_an_import_name_and_refuses_other_classes():
    app = AgentToolsApp()
    app.notebook_store_class = f"{__name__}.RecordingStore"
    assert app.notebook_store_class is RecordingStore
    with pytest.raises(TraitError, match="notebook_store_class"):
        app.notebook_store_class = EvalSessionManager


# The application and every service it builds (tests/test_docs.py checks that the list is complete).
CONFIGURABLES = [AgentToolsApp, *AgentToolsApp.classes[1:]]


def build(cls: type, tmp_path: Path, **kwargs: Any) -> Any:
    """An instance of ``cls`` built alone (no server), with what it cannot do without."""
    if cls is ArtifactStore:
        return ArtifactStore(root=tmp_path, **kwargs)
    if cls is EvalSessionManager:
        return EvalSessionManager(artifacts=ArtifactStore(root=tmp_path), **kwargs)
    if cls is NotebookKernels:
        return NotebookKernels(sessions=build(EvalSessionManager, tmp_path), **kwargs)
    return cls(**kwargs)


INVALID = [
    (EvalSessionManager, "max_sessions", 0, "at least 1"),
    (NotebookKernels, "max_kernels", 0, "at least 1"),
    (NotebookKernels, "idle_timeout", -1.0, "at least 0"),
    (NotebookStore, "max_ops", 0, "at least 1"),
    (NotebookStore, "busy_timeout", -1.0, "at least 0"),
    (LiveDocuments, "ready_timeout", 0.0, "greater than 0"),
    (EvalSessionManager, "idle_timeout", -1.0, "at least 0"),
    (EvalSessionManager, "cleanup_interval", -0.5, "at least 0"),
    (EvalSessionManager, "heartbeat_interval", -1.0, "at least 0"),
    (CellExecutor, "interrupt_grace", -1.0, "at least 0"),
    (CellExecutor, "max_output_bytes", 0, "at least 1"),
    (EvalService, "max_cells", 0, "at least 1"),
    (EvalService, "init_timeout", 0.0, "greater than 0"),
    (CellExecutor, "liveness_interval", 0.0, "greater than 0"),
    (CellExecutor, "max_display_bytes", -1, "between 0 and"),
    (CellExecutor, "max_html_convert_bytes", 100, "between 1024 and"),
    (NotebookRunner, "max_output_bytes_stored", 0, "at least 1"),
    (NotebookRunner, "max_cell_bytes_stored", 0, "at least 1"),
    (KernelRecovery, "retry_backoff", -1.0, "at least 0"),
    (KernelPool, "size", -1, "at least 0"),
    (ArtifactStore, "retention", -1.0, "at least 0"),
    (ArtifactStore, "max_bytes", -1, "at least 0"),
    (KernelService, "fd_headroom", -1, "at least 0"),
    (KernelService, "ready_timeout", 0.0, "greater than 0"),
    (KernelService, "ready_timeout", float("nan"), "greater than 0"),
    (KernelService, "iopub_hwm", 0, "between 1 and 100000"),
    (KernelService, "iopub_spill_bytes", -1, "between 0 and"),
    (KernelService, "iopub_buffer_bytes", -1, "between 0 and"),
    (Ledger, "max_changes_per_notebook", -1, "at least 0"),
    (Ledger, "max_bytes", 1000, "between 262144 and"),
    (AgentToolsApp, "max_body_bytes", -1, "at least 0"),
    (AgentToolsApp, "stream_heartbeat_interval", 0.0, "greater than 0"),
    (AgentToolsApp, "stream_lag_grace", -1.0, "at least 0"),
    (AgentToolsApp, "stream_backlog_bytes", 10, "between 1024 and"),
    (AgentToolsApp, "mcp_max_batch_items", 0, "between 1 and 10000"),
    (AgentToolsApp, "mcp_max_batch_answer_bytes", 100, "between 1024 and"),
    (AgentToolsApp, "mcp_max_sessions_per_identity", 1001, "between 1 and 1000"),
]


@pytest.mark.parametrize(
    ("cls", "name", "value", "bound"), INVALID, ids=[f"{c.__name__}.{n}={v}" for c, n, v, _ in INVALID]
)
def test_invalid_value_raises_trait_error_naming_the_trait(cls, name, value, bound, tmp_path):
    message = rf"^{cls.__name__}\.{name} must be {bound}"
    with pytest.raises(TraitError, match=message):
        build(cls, tmp_path, config=Config({cls.__name__: {name: value}}))
    with pytest.raises(TraitError, match=message):
        setattr(build(cls, tmp_path), name, value)


@pytest.mark.parametrize(
    ("cls", "name", "value"),
    [
        (EvalSessionManager, "idle_timeout", 0.0),
        (EvalSessionManager, "heartbeat_interval", 0.0),
        (ArtifactStore, "retention", 0.0),
        (ArtifactStore, "max_bytes", 0),
        (KernelService, "fd_headroom", 0),
        (KernelService, "iopub_buffer_bytes", 0),
        (KernelService, "iopub_spill_bytes", 0),
        (KernelPool, "size", 0),
        (NotebookKernels, "idle_timeout", 0.0),
        (Ledger, "max_changes_per_notebook", 0),
        (CellExecutor, "max_display_bytes", 0),
        (AgentToolsApp, "max_body_bytes", 0),
    ],
)
def test_zero_is_accepted_where_it_means_never(cls, name, value, tmp_path):
    assert getattr(build(cls, tmp_path, config=Config({cls.__name__: {name: value}})), name) == value


def test_no_service_shares_a_configuration_section_with_jupyter_server():
    """A section is a class name: c.SessionManager.* would reach jupyter_server's session manager too (and
    each would warn about the other's options), so the eval sessions' class is EvalSessionManager."""
    from jupyter_server.serverapp import ServerApp

    server_sections = {cls.__name__ for cls in ServerApp().classes for cls in cls.mro()}
    ours = {cls.__name__ for cls in CONFIGURABLES}
    assert "SessionManager" in server_sections
    assert ours & server_sections == set()


def test_a_subclass_takes_the_settings_of_its_base(tmp_path):
    config = Config({"NotebookStore": {"max_ops": 3}})
    assert RecordingStore(config=config).max_ops == 3


def test_artifact_store_without_a_directory_makes_and_owns_a_private_one(tmp_path):
    store = ArtifactStore()
    assert store.owns_root and store.root.is_dir()
    store.remove_all()
    assert not store.root.exists()
    configured = ArtifactStore(config=Config({"ArtifactStore": {"root_dir": str(tmp_path / "a")}}))
    assert configured.root == tmp_path / "a" and not configured.owns_root


def test_empty_ledger_path_is_the_data_directory_default():
    assert Ledger(db_path="").db_path == Ledger().db_path
    assert Ledger().db_path.endswith("agent_tools_ledger.db")


def test_services_validate_their_own_traits(tmp_path):
    with pytest.raises(TraitError, match=r"^EvalSessionManager\.max_sessions must be at least 1, got 0"):
        EvalSessionManager(max_sessions=0)
    with pytest.raises(TraitError, match=r"^NotebookKernels\.max_kernels must be at least 1, got 0"):
        NotebookKernels(sessions=build(EvalSessionManager, tmp_path), max_kernels=0)
    with pytest.raises(TraitError, match="sessions"):
        EvalService(sessions=object())  # a collaborator of the wrong kind


def test_services_are_built_from_keywords(tmp_path):
    artifacts = ArtifactStore(root=tmp_path / "a")
    kernels = KernelService(kernel_manager=object(), ready_timeout=5.0)
    sessions = EvalSessionManager(kernels=kernels, artifacts=artifacts, max_sessions=2)
    service = EvalService(
        sessions=sessions, kernels=kernels, artifacts=artifacts, contents_manager=object(), max_cells=3
    )
    assert (artifacts.root, artifacts.retention) == (tmp_path / "a", 24 * 3600.0)
    assert (sessions.kernels, sessions.artifacts, sessions.max_sessions) == (kernels, artifacts, 2)
    assert service.recovery.kernels is kernels and service.recovery.sessions is sessions
    assert service.max_cells == 3 and service.cells.limits.output_limits.display_bytes == 2 * 1024 * 1024
    assert service.cells.kernels is kernels and service.cells.sessions is sessions
    assert sessions.log.name == "jupyter_agent_tools.execution.session_manager"
    with pytest.raises(TypeError):
        EvalSessionManager(kernels, artifacts)  # type: ignore[misc]  # no positional settings


def test_handlers_reach_services_through_the_typed_accessor():
    """Issue 36.3: one typed accessor (``AgentAPIHandler.app``), not ``self.extensionapp.X`` with a
    ``type: ignore`` in every handler (mypy then checks each service a handler calls)."""
    handlers = Path(__file__).parent.parent / "jupyter_agent_tools" / "handlers"
    reaching = [
        f"{path.name}:{n}"
        for path in sorted(handlers.glob("*.py"))
        if path.name != "base.py"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if "self.extensionapp" in line
    ]
    assert reaching == []


def test_the_notebook_runner_is_given_its_collaborators():
    """Issue 36.3: the NotebookRunner is built with what it uses (the application gives it the eval
    service's execute, recovery and pool); it no longer holds the EvalService to find them there by name."""
    assert "eval_service" not in NotebookRunner.class_traits()
    source = inspect.getsource(inspect.getmodule(NotebookRunner))  # type: ignore[arg-type]
    assert "eval_service" not in source and "EvalService" not in source


async def test_eval_and_runs_are_given_one_cell_executor_and_hold_not_each_other(jp_serverapp):
    """Issue 36.1/36.3: one cell loop below eval and notebook runs, given to both; the eval service holds
    no NotebookRunner (a body with 'notebook' is routed to the runner by the front doors)."""
    app = agent_app(jp_serverapp)
    evals, runner = app.eval_service, app.notebook_runner
    assert runner.cells is evals.cells and runner.pool is evals.pool and runner.recovery is evals.recovery
    assert evals.cells.limits.max_output_bytes == 4096 and evals.cells.limits.interrupt_grace == 2.5
    assert runner.max_cells == evals.max_cells == 5
    assert evals.notebook_kernels is runner.notebook_kernels
    assert "notebooks" not in EvalService.class_traits()
    source = inspect.getsource(inspect.getmodule(EvalService))  # type: ignore[arg-type]
    assert ".notebook_run import" not in source and "self.notebooks" not in source


def test_the_cell_limits_set_the_old_way_still_apply_with_a_warning(caplog):
    """Issue 47.1: the cell limits moved from c.EvalService.* to c.CellExecutor.* (they bound notebook
    runs too); the old names still work, each with a deprecation warning naming the new one, and the new
    name wins where both are set."""
    config = Config(
        {
            "EvalService": {"max_output_bytes": 777, "interrupt_grace": 1.5, "max_cells": 4},
            "CellExecutor": {"interrupt_grace": 0.5},
        }
    )
    with caplog.at_level(logging.WARNING):
        executor = CellExecutor(config=config)
    assert executor.max_output_bytes == 777 and executor.limits.max_output_bytes == 777
    assert executor.interrupt_grace == 0.5  # c.CellExecutor's own value wins
    warned = [r.getMessage() for r in caplog.records if "deprecated" in r.getMessage()]
    assert warned == [
        "c.EvalService.max_output_bytes is deprecated since jupyter-agent-tools 0.5: set "
        "c.CellExecutor.max_output_bytes (the value is used there)"
    ]
    with pytest.raises(TraitError, match=r"^CellExecutor\.max_output_bytes must be at least 1"):
        CellExecutor(config=Config({"EvalService": {"max_output_bytes": 0}}))

"""docs/architecture.md's layers, kept true: data flows one way, handler -> service -> pure core.

Every import of the package is read (module level and inside functions alike), so a shortcut that reaches
up a layer fails here instead of drifting into the code.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest
from parsing import parse

pytestmark = pytest.mark.quick  # the fast tier: no server, no kernel

PACKAGE = Path(__file__).resolve().parent.parent / "jupyter_agent_tools"

# The front doors and their wiring: they may import anything.
FRONT_DOORS = ("handlers/", "app.py", "hub_oauth/app.py")  # (the hub's OAuth service's web application)
# Where Tornado may be imported besides the front doors: the adapters to jupyter_server's own Tornado
# objects (its identity provider and authorizer, the websockets a token opened, the upstream shims) and the
# gateway's websocket client, the OAuth client-metadata fetch (Tornado's HTTP client with its resolver
# pinned to the checked address), the reads of the hub OAuth service's keys and revocation list. Services
# catch what jupyter_server raises as compat.ServerHTTPError.
TORNADO_ADAPTERS = (
    "compat.py",
    "auth/identity.py",
    "auth/authorizer.py",
    "auth/connections.py",
    "execution/gateway.py",
    "oauth/cimd.py",
    "auth/hub_tokens.py",
)
# The pure core: it imports no service, no handler, no Tornado, no jupyter_server.
PURE_CORE = (
    "notebook/operations.py",
    "notebook/format.py",
    "notebook/summary.py",
    "notebook/layout.py",
    "notebook/validity.py",
    "notebook/reading.py",
    "ledger/changes.py",
    "ledger/undo.py",
    "ledger/since.py",
    "approvals/policy.py",
    "globs.py",
    "ignore.py",
    "text.py",
    "sequences.py",
    "errors.py",
    "oauth/jwt.py",
    "schema_compile.py",
    "validation.py",
    "execution/ports.py",
)
SERVICES = (
    "execution.eval_service",
    "execution.cells",
    "execution.session_manager",
    "execution.kernel_service",
    "execution.notebook_run",
    "notebook.store",
    "ledger.service",
    "runs.registry",
    "approvals.service",
    "artifacts",
)


def modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "labextension" not in p.parts)


@functools.cache  # each module is parsed once for all the tests here
def imported(path: Path) -> frozenset[str]:
    """Every module ``path`` imports, absolute (``jupyter_agent_tools.x.y`` for the package's own)."""
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    package = list(rel.parts[:-1])  # a module's package (an __init__'s is its own folder)
    found: set[str] = set()
    for node in ast.walk(parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return frozenset(found)


def name(path: Path) -> str:
    return path.relative_to(PACKAGE).as_posix()


def test_nothing_below_the_front_doors_imports_a_handler() -> None:
    reaching_up = {
        name(p): sorted(m for m in imported(p) if m.startswith("jupyter_agent_tools.handlers"))
        for p in modules()
        if not name(p).startswith(FRONT_DOORS)
    }
    assert {k: v for k, v in reaching_up.items() if v} == {}


def test_only_the_front_doors_and_the_adapters_import_tornado() -> None:
    importers = {
        name(p) for p in modules() if any(m == "tornado" or m.startswith("tornado.") for m in imported(p))
    }
    assert {n for n in importers if not n.startswith(FRONT_DOORS) and n not in TORNADO_ADAPTERS} == set()


def test_the_pure_core_imports_no_service_and_no_server() -> None:
    services = tuple(f"jupyter_agent_tools.{s}" for s in SERVICES)
    for core in PURE_CORE:
        found = imported(PACKAGE / core)
        bad = sorted(
            m
            for m in found
            if m.startswith(("tornado", "jupyter_server", "jupyter_client", "jupyter_agent_tools.handlers"))
            or m.startswith(services)
        )
        assert bad == [], (core, bad)


def test_eval_and_notebook_runs_do_not_reach_each_other() -> None:
    """Issue 36.3: the cell executor is below both; neither service imports the other (a body with
    'notebook' is routed by the front doors), and the cell loop imports neither."""
    execution = PACKAGE / "execution"
    pairs = {
        "eval_service.py": "jupyter_agent_tools.execution.notebook_run",
        "notebook_run.py": "jupyter_agent_tools.execution.eval_service",
    }
    for module, other in pairs.items():
        assert not any(m.startswith(other) for m in imported(execution / module)), module
    cells = imported(execution / "cells.py")
    assert not any(m.startswith(tuple(pairs.values())) for m in cells)

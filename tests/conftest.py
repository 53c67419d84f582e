"""Test harness: a real Jupyter server (pytest-jupyter) with the extension enabled."""

from __future__ import annotations

import os
import tempfile
from typing import Any

import pytest

pytest_plugins = ["jupyter_server.pytest_plugin", "jupyter_agent_tools.pytest_plugin"]

# Every server of the suite (in-process or a subprocess, which inherits TMPDIR) keeps its temporary files,
# the default artifacts directory included, in a private directory: a test that goes wrong can never
# touch the system's temp directory or other programs' files.
PRIVATE_TMP = tempfile.mkdtemp(prefix="jupyter-agent-tools-tests-")
os.environ["TMPDIR"] = PRIVATE_TMP
tempfile.tempdir = PRIVATE_TMP


# The fast tier (python3 dev.py test --quick): pure core and fast route tests, well under a minute.
QUICK_MODULES = {
    "test_configuration",
    "test_docs",
    "test_session_state",
    "test_hostile",
    "test_messages",
    "test_notebook_reads",
    "test_notebook_routes",
    "test_operations",
    "test_outputs",
    "test_sink",
    "test_text",
    "test_ledger_core",
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        module = getattr(item, "module", None)
        if module is not None and module.__name__.rsplit(".", 1)[-1] in QUICK_MODULES:
            item.add_marker(pytest.mark.quick)


@pytest.fixture
def jp_server_config() -> dict[str, Any]:
    return {"ServerApp": {"jpserver_extensions": {"jupyter_agent_tools": True}}}


@pytest.fixture
def api(agent_api):
    """Call an agent route: (status, parsed JSON); see jupyter_agent_tools.pytest_plugin."""
    return agent_api


@pytest.fixture
def evaluate(agent_evaluate):
    """POST an eval of code cells, assert the status, return the answer."""
    return agent_evaluate

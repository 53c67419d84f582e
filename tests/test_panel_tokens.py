"""The person makes, lists and revokes agent tokens in the Agents panel (issue 43), in a real browser.

One real ``jupyter lab`` with agent tokens on, one headless Debian Chromium page logged in with the
server's token (the person), the frontend of the package under test:

- **Connect an agent…** (from the command palette: ``agents:connect-agent``) opens the form; a name the
  server refuses shows the server's message in the form again, with what was typed kept;
- a read-only token limited to ``reports/**`` is made; it is shown once with its configuration; **Copy**
  puts the token on the clipboard; the shown snippets work as pasted: the ``curl`` line in a shell answers
  the agent's identity, the ``export`` lines give ``jupyter agent`` the server, the MCP JSON connects the
  official MCP client; the token reads inside its paths, gets 404 outside them and 403 on an edit
  (screenshot ``test-artifacts/connect_agent.png``, the one in docs/);
- the panel lists it (scopes, paths, expiry, its last use once the panel is shown again); **Revoke** asks
  first, then the token answers 403;
- on a server without agent tokens the panel says the server's message (409) instead of the list, and
  offers no Connect button.

The DOM hooks used here are the ones docs/panel.md documents.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import nbformat
import pytest
import tomllib
from browser import ARTIFACTS, http, launch, needs_chromium, running_lab
from nbformat.v4 import new_code_cell, new_notebook

import jupyter_agent_tools

pytest.importorskip("jupyterlab", reason="jupyterlab is not installed")
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")

pytestmark = [needs_chromium, pytest.mark.timeout(240)]

PANEL = "#jp-agent-activity"
TAB = '.jp-SideBar [data-id="jp-agent-activity"]'
TOKENS = f'{PANEL} [data-section="agent-tokens"]'
DIALOG = ".jp-Dialog"
AGENT_TOKENS = {
    "ServerApp": {
        "identity_provider_class": "jupyter_agent_tools.auth.AgentIdentityProvider",
        "authorizer_class": "jupyter_agent_tools.auth.AgentAuthorizer",
    }
}
REPORT = "reports/q3.ipynb"


@pytest.fixture
def jp_asyncio_loop() -> None:
    """No in-process server here: pytest-jupyter's loop per test would take (and close) the event loop
    of the module's Playwright, which runs in this thread."""


@pytest.fixture
def jp_server_cleanup() -> None:
    """(Nothing to clean up: the server is a subprocess.)"""


def opened(playwright: Any, lab: dict[str, Any]) -> tuple[Any, Any]:
    """(browser, page): JupyterLab logged in as the person (the server's token), the Agents panel shown
    and connected; the page may read what it copies."""
    browser = launch(playwright)
    context = browser.new_context(
        viewport={"width": 1400, "height": 900}, permissions=["clipboard-read", "clipboard-write"]
    )
    page = context.new_page()
    page.goto(f"{lab['base']}/lab?reset&token={lab['token']}", timeout=90_000)
    page.wait_for_function("() => window.jupyterapp !== undefined", timeout=90_000)
    page.evaluate("() => window.jupyterapp.restored.then(() => true)")
    page.locator(TAB).click(timeout=90_000)
    page.wait_for_selector(f'{PANEL}[data-connected="true"]', state="visible", timeout=30_000)
    return browser, page


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("panel-tokens")
    with running_lab(tmp, config=AGENT_TOKENS) as running:
        (running["root"] / "reports").mkdir()
        for path, source in ((REPORT, "print('q3 revenue')"), ("secret.ipynb", "print('salaries')")):
            nbformat.write(new_notebook(cells=[new_code_cell(source)]), str(running["root"] / path))
        yield running


@pytest.fixture(scope="module")
def playwright() -> Iterator[Any]:
    """One Playwright for the module (a thread runs one at a time)."""
    with sync_api.sync_playwright() as running:
        yield running


@pytest.fixture(scope="module")
def page(lab: dict[str, Any], playwright: Any) -> Iterator[Any]:
    browser, page = opened(playwright, lab)
    try:
        yield page
    finally:
        browser.close()


def as_agent(lab: dict[str, Any], token: str, method: str, route: str, body: Any = None) -> tuple[int, Any]:
    return http(method, f"{lab['base']}/{route}", token, body)


def shell(script: str, runtime_dir: Path) -> subprocess.CompletedProcess[str]:
    """``script`` in a POSIX shell, as a person pastes it (the checkout first on ``PYTHONPATH``; no server
    to find but what the script names: ``runtime_dir`` is an empty Jupyter runtime directory)."""
    checkout = str(Path(jupyter_agent_tools.__file__).parent.parent)
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join([checkout, os.environ.get("PYTHONPATH", "")])}
    for name in ("JUPYTER_AGENT_URL", "JUPYTER_AGENT_TOKEN", "JUPYTER_TOKEN", "JUPYTERHUB_API_TOKEN"):
        environ.pop(name, None)
    runtime_dir.mkdir(mode=0o700, exist_ok=True)
    environ["JUPYTER_RUNTIME_DIR"] = str(runtime_dir)
    return subprocess.run(["sh", "-c", script], env=environ, capture_output=True, text=True, timeout=120)


async def mcp_read(url: str, headers: dict[str, str], path: str) -> str:
    """An MCP client connected with that configuration (the official SDK's client) reads a notebook."""
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    async with (
        create_mcp_http_client(headers=headers) as client,
        streamable_http_client(url, http_client=client) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        result = await session.call_tool("notebook_read", {"path": path})
        assert not result.is_error, result
        return " ".join(getattr(part, "text", "") for part in result.content)


def from_palette(page: Any, label: str) -> None:
    """Run the command labelled ``label`` from JupyterLab's command palette, checking it is filed under
    "Agents". The palette is modal: it closes when focus leaves it, and the page still moves focus for a
    while after it loads (restoring its layout, the sidebar): it is opened again then, for up to a minute."""
    deadline = time.monotonic() + 60
    palette = page.locator(".jp-ModalCommandPalette .lm-CommandPalette")
    while True:
        page.evaluate("() => window.jupyterapp.commands.execute('apputils:activate-command-palette')")
        try:
            palette.locator("input").fill(label, timeout=5_000)
            item = palette.locator(".lm-CommandPalette-item", has_text=label)
            item.wait_for(timeout=5_000)
            headers = [h.lower() for h in palette.locator(".lm-CommandPalette-header").all_inner_texts()]
            if headers:  # (none: it closed meanwhile)
                assert "agents" in headers, headers
                item.click(timeout=5_000)
                return
        except sync_api.TimeoutError:
            pass
        assert time.monotonic() < deadline, f"the command palette never showed {label!r} for a click"


def test_the_person_connects_an_agent_uses_its_token_and_revokes_it(lab: dict[str, Any], page: Any) -> None:
    base = lab["base"]
    tokens = page.locator(TOKENS)
    assert "No agent tokens yet" in tokens.inner_text()
    assert page.locator(f'{PANEL} button[data-action="connect"]').is_visible()
    for command in ("agents:connect-agent", "agents:revoke-token"):
        assert page.evaluate("(c) => window.jupyterapp.commands.hasCommand(c)", command), command

    # From the command palette, under "Agents".
    from_palette(page, "Connect an Agent")
    form = page.locator(DIALOG)
    form.locator('input[data-field="name"]').wait_for(timeout=20_000)
    assert form.locator('input[data-scope="read"]').is_checked()
    assert not form.locator('input[data-scope="edit"]').is_checked()
    assert sorted(form.locator("input[data-ask]").evaluate_all("(boxes) => boxes.map(b => b.value)")) == [
        "edit",
        "execute",
        "kernel",
    ]
    # A name the server refuses: its message, in the form again, what was typed kept.
    form.locator('input[data-field="name"]').fill("my reader!")
    form.locator('textarea[data-field="paths"]').fill("reports/**")
    form.locator('select[data-field="expires"]').select_option("3600")
    form.locator("button.jp-mod-accept").click()
    problem = page.locator(f'{DIALOG} .jp-AgentTokens-problem[role="alert"]')
    problem.wait_for(timeout=20_000)
    assert "'name' is 1 to 64 letters" in problem.inner_text(), problem.inner_text()
    # (the form is drawn anew around the message: its fields are asked until they hold what was typed)
    sync_api.expect(page.locator(f'{DIALOG} textarea[data-field="paths"]')).to_have_value("reports/**")
    sync_api.expect(page.locator(f'{DIALOG} select[data-field="expires"]')).to_have_value("3600")
    page.locator(f'{DIALOG} input[data-field="name"]').fill("reader")
    page.locator(f"{DIALOG} button.jp-mod-accept").click()

    # Shown once, with the configuration for this server as the page reaches it.
    shown = page.locator(f'{DIALOG} [data-snippet="token"] pre')
    shown.wait_for(timeout=20_000)
    token = shown.inner_text()
    assert token.startswith("jat_"), token
    page.locator(f'{DIALOG} button[data-copy="token"]').click()
    assert page.evaluate("() => navigator.clipboard.readText()") == token
    snippet = {
        kind: page.locator(f'{DIALOG} [data-snippet="{kind}"] pre').inner_text()
        for kind in ("cli", "mcp", "claude-code", "vscode", "codex", "claude-desktop", "curl")
    }
    page.locator(f'{DIALOG} button[data-copy="mcp"]').click()
    assert page.evaluate("() => navigator.clipboard.readText()") == snippet["mcp"]
    facts = page.locator(f"{DIALOG} .jp-AgentTokens-facts").inner_text()
    assert "agent:reader" in facts and "reports/**" in facts and "scopes: read" in facts, facts
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "connect_agent.png"))

    nowhere = lab["root"].parent / "empty-runtime"
    # The curl line, pasted into a shell: the server answers the agent's identity.
    answered = shell(snippet["curl"] + " -s", nowhere)
    assert answered.returncode == 0, answered.stderr
    assert json.loads(answered.stdout)["identity"]["username"] == "agent:reader", answered.stdout
    # The export lines give `jupyter agent` the server and the token: it reads inside the paths...
    cli = f"{sys.executable} -m jupyter_agent_tools.cli"
    read = shell(f"{snippet['cli']}\n{cli} nb show {REPORT}", nowhere)
    assert read.returncode == 0 and "q3 revenue" in read.stdout, (read.stdout, read.stderr)
    # ... and cannot edit: read-only (exit 4, a scope the token lacks).
    edit = shell(f"{snippet['cli']}\n{cli} nb insert {REPORT} --at 0 --content 'x = 1'", nowhere)
    assert edit.returncode == 4 and "edit" in edit.stderr, (edit.returncode, edit.stderr)
    # The MCP JSON connects the official MCP client.
    server = json.loads(snippet["mcp"])["mcpServers"]["jupyter"]
    assert server["type"] == "http" and server["url"] == f"{base}/api/agent/mcp", server
    with ThreadPoolExecutor(1) as pool:  # (this thread's event loop is Playwright's)
        read_by_mcp = pool.submit(asyncio.run, mcp_read(server["url"], server["headers"], REPORT)).result(120)
    assert "q3 revenue" in read_by_mcp, read_by_mcp
    # Codex's lines: the shell part sets the variable its TOML table names, sent as a Bearer token;
    # VS Code's servers entry has the same URL and header. Both reach the server as the agent.
    shell_part, table = snippet["codex"].split("\n\n")
    exported = shell(f'{shell_part}\nprintf %s "$JUPYTER_AGENT_TOKEN"', nowhere).stdout
    codex = tomllib.loads(table)["mcp_servers"]["jupyter"]
    assert exported == token and codex["url"] == server["url"], (codex, exported)
    bearer = {"Authorization": f"Bearer {exported}"}
    vscode = json.loads(snippet["vscode"])["servers"]["jupyter"]
    assert (vscode["url"], vscode["headers"]) == (server["url"], server["headers"]), vscode
    with ThreadPoolExecutor(1) as pool:
        read_by_codex = pool.submit(asyncio.run, mcp_read(codex["url"], bearer, REPORT)).result(120)
    assert "q3 revenue" in read_by_codex, read_by_codex
    desktop = json.loads(snippet["claude-desktop"])["mcpServers"]["jupyter"]
    assert desktop["env"] == {"JUPYTER_AGENT_URL": base, "JUPYTER_AGENT_TOKEN": token}, desktop
    # Over HTTP: inside the paths it reads, outside them 404, an edit 403.
    assert as_agent(lab, token, "GET", f"api/agent/notebooks/{REPORT}")[0] == 200
    assert as_agent(lab, token, "GET", "api/agent/notebooks/secret.ipynb")[0] == 404
    status, refused = as_agent(
        lab,
        token,
        "POST",
        f"api/agent/notebooks/{REPORT}",
        {"action": "insert", "cell_index": 0, "content": "x"},
    )
    assert status == 403 and refused["reason"] == "Missing scope", (status, refused)

    page.locator(f"{DIALOG} button.jp-mod-accept").click()
    page.locator(DIALOG).wait_for(state="detached", timeout=10_000)

    # Listed in the panel; shown again, the panel reads the list again: the token's last use is there.
    row = page.locator(f'{TOKENS} [data-token="reader"]')
    row.wait_for(timeout=20_000)
    listed = row.inner_text()
    assert "active" in listed and "scopes: read" in listed and "paths: reports/**" in listed, listed
    assert "expires" in listed and "never used" in listed, listed
    page.locator(TAB).click()  # hidden
    page.locator(TAB).click()  # shown again
    page.locator(f'{TOKENS} [data-token="reader"]', has_text="last used").wait_for(timeout=20_000)

    # Revoke asks first; then the token is refused.
    row.locator('button[data-action="revoke"]').click()
    confirm = page.locator(DIALOG)
    confirm.wait_for(timeout=10_000)
    assert "Revoke the agent token 'reader'?" in confirm.inner_text()
    confirm.locator("button.jp-mod-warn").click()
    page.locator(f'{TOKENS} [data-token="reader"][data-status="revoked"]').wait_for(timeout=20_000)
    assert page.locator(f'{TOKENS} [data-token="reader"] button[data-action="revoke"]').count() == 0
    assert (
        "Revoked the agent token 'reader'"
        in page.locator(f"{PANEL} .jp-AgentActivity-notice.jp-mod-ok").inner_text()
    )
    status, answer = as_agent(lab, token, "GET", f"api/agent/notebooks/{REPORT}")
    assert status == 403 and "revoked" in answer["message"], (status, answer)
    assert shell(snippet["curl"] + " -s -o /dev/null -w '%{http_code}'", nowhere).stdout == "403"


def test_without_agent_tokens_the_panel_says_the_servers_message(
    tmp_path_factory: pytest.TempPathFactory, playwright: Any
) -> None:
    tmp = tmp_path_factory.mktemp("panel-no-tokens")
    with running_lab(tmp, rtc=False) as lab:
        browser, page = opened(playwright, lab)
        try:
            status, answer = http("GET", f"{lab['base']}/api/agent/tokens", lab["token"])
            assert status == 409, (status, answer)
            page.locator(TOKENS, has_text="Agent tokens are not enabled").wait_for(timeout=20_000)
            assert answer["message"] in page.locator(TOKENS).inner_text()
            # (wrapped within the panel: its long configuration class names do not run out of it)
            assert page.locator(f"{TOKENS} .jp-AgentActivity-empty").evaluate(
                "(node) => node.scrollWidth <= node.clientWidth"
            )
            assert page.locator(f"{PANEL} [data-token]").count() == 0
            assert not page.locator(f'{PANEL} button[data-action="connect"]').is_visible()
        finally:
            browser.close()

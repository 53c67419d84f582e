"""The Agents panel (the package's JupyterLab extension, frontend/) in a real browser.

One real ``jupyter lab`` (real-time collaboration, this extension, real kernels; its state in a private
temporary directory) and one headless Debian Chromium page for the module, with a notebook open and the
panel shown. Agents act through the HTTP routes; the panel must show it live, from the server's event bus
(``/api/events/subscribe``), and its buttons must act:

- an agent's edit of the open notebook lists the change and marks the cell (class ``jp-agent-changed``, a
  tooltip saying who, via which door), until the person edits the cell; Diff shows it; Open selects it;
- an agent's eval shows as a session and a run in progress (its cell, its elapsed time) while it runs;
  **Interrupt** stops it; **Stop** shuts the session down;
- **Undo** restores the cell, in the live view and in the file, and its message clears by itself; an undo
  the server refuses (409: the cell changed since) is shown in the change's row, readably;
- a notebook run shows the cell it runs, in the panel and in the open notebook (not in JupyterLab's
  "edited since run" orange); **Interrupt** stops it;
- the commands (`agents:*`) are in the command palette and act as the buttons;
- Notebook 7's notebook view has the panel and the marks too;
- a cell whose change event reached the page before the cell itself is marked when it arrives;
- after the server restarts, the panel connects again and is live, and the cell an agent inserted just
  before the stop is in the notebook once;
- screenshots of the panel are saved (``test-artifacts/panel.png``, ``panel_undo_refused.png``; the ones
  in docs/ come from here).

The DOM hooks used here are the ones docs/panel.md documents.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import nbformat
import pytest
from browser import ARTIFACTS, http, launch, needs_chromium, running_lab, wait_until
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

pytest.importorskip("jupyterlab", reason="jupyterlab is not installed")
pytest.importorskip("jupyter_server_ydoc", reason="jupyter-collaboration is not installed")
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")

pytestmark = [needs_chromium, pytest.mark.timeout(180)]

PANEL = "#jp-agent-activity"
NOTEBOOK = "analysis.ipynb"
ORIGINAL = "total = sum(range(10))"


@pytest.fixture
def jp_asyncio_loop() -> None:
    """No in-process server here: pytest-jupyter's loop per test would take (and close) the event loop
    of the module's Playwright, which runs in this thread."""


@pytest.fixture
def jp_server_cleanup() -> None:
    """(Nothing to clean up: the server is a subprocess.)"""


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("panel")
    with running_lab(tmp) as running:
        first = new_code_cell(ORIGINAL)
        first["id"] = "total"
        nb = new_notebook(
            cells=[new_markdown_cell("# Analysis"), first, new_code_cell("print(total)")],
            metadata={
                "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
                "language_info": {"name": "python"},
            },
        )
        nbformat.write(nb, str(running["root"] / NOTEBOOK))
        running["tmp"] = tmp
        yield running


@pytest.fixture(scope="module")
def page(lab: dict[str, Any]) -> Iterator[Any]:
    """The notebook open in JupyterLab (joined to its collaborative room), the Agents panel shown and
    connected to the event bus."""
    with sync_api.sync_playwright() as playwright:
        browser = launch(playwright)
        try:
            page = browser.new_context(viewport={"width": 1400, "height": 860}).new_page()
            synced: list[str] = []

            def on_websocket(ws: Any) -> None:
                if "/api/collaboration/room/json:notebook:" in ws.url:
                    ws.on("framereceived", lambda _frame: synced.append(ws.url))

            page.on("websocket", on_websocket)
            page.goto(f"{lab['base']}/lab/tree/{NOTEBOOK}?reset&token={lab['token']}", timeout=90_000)
            page.wait_for_function(
                f"() => document.querySelector('.jp-Notebook')?.innerText.includes({ORIGINAL!r})",
                timeout=90_000,
            )
            wait_until(page, lambda: synced, 60, "the notebook never joined its collaborative room")
            # The panel is a left-sidebar tab: show it, then wait for its live connection.
            page.locator('.jp-SideBar [data-id="jp-agent-activity"]').click()
            page.wait_for_selector(f'{PANEL}[data-connected="true"]', state="visible", timeout=30_000)
            yield page
        finally:
            browser.close()


def agent(lab: dict[str, Any], method: str, route: str, body: Any = None, timeout: float = 60) -> Any:
    status, answer = http(method, f"{lab['base']}/api/agent/{route}", lab["token"], body, timeout)
    assert status == 200, (status, answer)
    return answer


def cell(page: Any, index: int) -> Any:
    return page.locator(".jp-Notebook .jp-Cell").nth(index)


def file_source(lab: dict[str, Any], index: int, expected: str, timeout: float = 30) -> str:
    """The source of a cell in the notebook file, once it is ``expected`` (the room saves it)."""
    deadline = time.monotonic() + timeout
    source = None
    while time.monotonic() < deadline:
        try:  # the room's save writes in place: the file may be caught half written
            source = nbformat.read(str(lab["root"] / NOTEBOOK), as_version=4).cells[index].source
        except Exception as e:
            source = repr(e)
        if source == expected:
            return source
        time.sleep(0.1)
    raise AssertionError(f"the file's cell {index} is {source!r}, never {expected!r}")


def file_sources(lab: dict[str, Any], ready: Any, timeout: float = 30) -> list[str]:
    """The sources of the notebook file's cells, once ``ready(sources)``."""
    deadline = time.monotonic() + timeout
    sources: Any = None
    while time.monotonic() < deadline:
        try:  # the room's save writes in place: the file may be caught half written
            sources = [c.source for c in nbformat.read(str(lab["root"] / NOTEBOOK), as_version=4).cells]
        except Exception as e:
            sources = repr(e)
        if isinstance(sources, list) and ready(sources):
            return sources
        time.sleep(0.1)
    raise AssertionError(f"the file's cells never got ready: {sources!r}")


def test_an_agent_edit_is_listed_live_and_marks_the_cell(lab: dict[str, Any], page: Any) -> None:
    edited = "total = sum(range(100))  # the agent's"
    before = agent(lab, "GET", f"notebooks/{NOTEBOOK}")["cells"][1]["source"]
    answer = agent(
        lab, "POST", f"notebooks/{NOTEBOOK}", {"action": "edit", "cell_id": "total", "content": edited}
    )
    change_id = answer["change_id"]
    row = page.locator(f'{PANEL} [data-change-id="{change_id}"]')
    row.wait_for(timeout=20_000)
    text = row.inner_text()
    assert NOTEBOOK in text and "via http" in text and "total (edited)" in text, text
    assert {b.get_attribute("data-action") for b in row.locator("button").all()} == {"open", "diff", "undo"}
    # The live view shows the agent's text, and the cell carries the mark, with who and which door.
    mark = f'.jp-Notebook .jp-Cell.jp-agent-changed[data-agent-change-id="{change_id}"]'
    marked = page.locator(mark)
    marked.wait_for(timeout=20_000)
    page.wait_for_function(
        "([mark, t]) => document.querySelector(mark)?.innerText.includes(t)",
        arg=[mark, "range(100)"],
        timeout=20_000,
    )
    tooltip = marked.get_attribute("title") or ""
    assert tooltip.startswith("Changed by the server's owner") and "via http" in tooltip, tooltip
    assert marked.count() == 1 and cell(page, 1).get_attribute("data-agent-change-id") == change_id
    # Diff shows the change's before and after, readably.
    row.locator('button[data-action="diff"]').click()
    dialog = page.locator(".jp-Dialog")
    dialog.wait_for(timeout=10_000)
    shown = dialog.inner_text()
    assert f"-{before}" in shown and f"+{edited}" in shown, shown
    dialog.locator("button.jp-mod-accept").click()
    dialog.wait_for(state="detached", timeout=10_000)
    # Open selects the changed cell in its notebook (the first cell was the active one).
    assert "range(100)" not in page.locator(".jp-Notebook .jp-Cell.jp-mod-active").inner_text()
    row.locator('button[data-action="open"]').click()
    page.wait_for_function(
        "() => document.querySelector('.jp-Notebook .jp-mod-active')?.innerText.includes('range(100)')",
        timeout=10_000,
    )


def test_an_agent_eval_shows_live_and_interrupt_stops_it(lab: dict[str, Any], page: Any) -> None:
    started, flag = lab["tmp"] / "started", lab["tmp"] / "never"
    code = (
        f"import os, pathlib, time\npathlib.Path({str(started)!r}).touch()\n"
        f"while not os.path.exists({str(flag)!r}):\n    time.sleep(0.05)\nprint('done')"
    )
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(
            agent, lab, "POST", "eval", {"session": "analyst", "cells": [{"code": code}], "timeout": 120}, 150
        )
        try:
            run = page.locator(f'{PANEL} [data-run="analyst"]')
            run.wait_for(timeout=60_000)
            session = page.locator(f'{PANEL} [data-session="analyst"]')
            assert "busy" in session.inner_text() and "the server's owner" in session.inner_text()
            assert "eval: analyst" in run.inner_text()
            page.wait_for_timeout(1100)  # the elapsed time ticks
            assert " s" in run.locator(".jp-AgentActivity-elapsed").inner_text()
            deadline = time.monotonic() + 60
            while not started.exists():  # the kernel runs the cell (its start is over)
                assert time.monotonic() < deadline and not running.done(), "the eval never started its cell"
                time.sleep(0.05)
            run.filter(has_text="running cell 1 of 1").wait_for(timeout=20_000)
            ARTIFACTS.mkdir(exist_ok=True)
            cell(page, 2).locator(".jp-InputPrompt").click()  # another cell active: the mark shows plainly
            page.screenshot(path=str(ARTIFACTS / "panel.png"))
            run.locator('button[data-action="interrupt"]').click()
            answer = running.result(timeout=60)
        finally:
            flag.touch()
    assert answer["cancelled"] is True and answer["cells"][0]["status"] == "cancelled", json.dumps(answer)[
        :2000
    ]
    run.wait_for(state="detached", timeout=20_000)  # no longer in progress
    assert "busy" not in page.locator(f'{PANEL} [data-session="analyst"]').inner_text()
    # Stop (after a confirmation) shuts the session down: gone from the server's list and from the panel.
    page.locator(f'{PANEL} [data-session="analyst"] button[data-action="stop"]').click()
    page.locator(".jp-Dialog button.jp-mod-accept").click()
    page.locator(f'{PANEL} [data-session="analyst"]').wait_for(state="detached", timeout=20_000)
    assert "analyst" not in [s["name"] for s in agent(lab, "GET", "sessions")["sessions"]]


def test_undo_in_the_panel_restores_the_cell_live_and_in_the_file(lab: dict[str, Any], page: Any) -> None:
    # The test's own edit (the module's tests share one lab, but none relies on another having run).
    before = agent(lab, "GET", f"notebooks/{NOTEBOOK}")["cells"][1]["source"]
    body = {"action": "edit", "cell_id": "total", "content": "total = 'to be undone'"}
    edit_id = agent(lab, "POST", f"notebooks/{NOTEBOOK}", body)["change_id"]
    page.wait_for_function(
        "() => document.querySelectorAll('.jp-Notebook .jp-Cell')[1]?.innerText.includes('to be undone')",
        timeout=20_000,
    )
    # Every success notice the panel shows, recorded in the page: it clears by itself after a few
    # seconds, which a loaded machine can spend waiting for the cell below.
    page.evaluate(
        """() => {
            window.__agentNotices = [];
            const root = document.getElementById('jp-agent-activity');
            new MutationObserver(() => root.querySelectorAll('.jp-AgentActivity-notice.jp-mod-ok')
                .forEach(n => n.innerText && window.__agentNotices.push(n.innerText)))
                .observe(root, {subtree: true, childList: true, characterData: true, attributes: true});
        }"""
    )
    page.locator(f'{PANEL} [data-change-id="{edit_id}"] button[data-action="undo"]').click()
    page.wait_for_function(
        "(t) => { const cell = document.querySelectorAll('.jp-Notebook .jp-Cell')[1]; "
        "return cell?.innerText.includes(t) && !cell.innerText.includes('to be undone'); }",
        arg=before,
        timeout=20_000,
    )
    # The undo's message shows, then clears by itself (it said what happened; it is not a state).
    page.wait_for_function(
        "(t) => window.__agentNotices.some(n => n.includes(t))", arg=f"Undid change {edit_id}", timeout=20_000
    )
    page.locator(f"{PANEL} .jp-AgentActivity-notice.jp-mod-ok").wait_for(state="hidden", timeout=15_000)
    # The undo is itself a change, listed live.
    undo = page.locator(f'{PANEL} [data-change-id="{int(edit_id) + 1}"]')
    undo.wait_for(timeout=20_000)
    assert f"undo {edit_id}" in undo.inner_text()
    assert file_source(lab, 1, before) == before


def test_a_refused_undo_says_why_and_an_edit_ends_the_mark(lab: dict[str, Any], page: Any) -> None:
    answer = agent(
        lab, "POST", f"notebooks/{NOTEBOOK}", {"action": "edit", "cell_id": "total", "content": "x = 1"}
    )
    change_id = answer["change_id"]
    page.locator(f'{PANEL} [data-change-id="{change_id}"]').wait_for(timeout=20_000)
    marked = cell(page, 1)
    page.wait_for_function(
        "() => document.querySelectorAll('.jp-Notebook .jp-Cell')[1]?.matches('.jp-agent-changed') && "
        "document.querySelectorAll('.jp-Notebook .jp-Cell')[1]?.innerText.includes('x = 1')",
        timeout=20_000,
    )
    # The person edits the cell: the mark goes, and the server's live document has the edit.
    marked.locator(".cm-content").click()
    page.keyboard.press("End")
    page.keyboard.type("  # mine")
    assert "jp-agent-changed" not in (marked.get_attribute("class") or "")
    deadline = time.monotonic() + 20
    while "# mine" not in agent(lab, "GET", f"notebooks/{NOTEBOOK}")["cells"][1]["source"]:
        assert time.monotonic() < deadline, "the person's edit never reached the server"
        time.sleep(0.1)
    # Undo of the agent's change: 409, shown in its row, naming the cell and why; nothing written.
    row = page.locator(f'{PANEL} [data-change-id="{change_id}"]')
    row.locator('button[data-action="undo"]').click()
    problem = row.locator(".jp-AgentActivity-problem")
    problem.wait_for(timeout=20_000)
    text = problem.inner_text()
    assert text.startswith(f"Cannot undo. Change {change_id} of {NOTEBOOK} cannot be undone"), text
    assert "cell total: its source changed since" in text, text
    assert "x = 1  # mine" in cell(page, 1).inner_text()
    page.screenshot(path=str(ARTIFACTS / "panel_undo_refused.png"))


def test_a_notebook_run_shows_its_running_cell_and_interrupt_stops_it(lab: dict[str, Any], page: Any) -> None:
    flag = lab["tmp"] / "never-run"
    code = f"import os, time\nwhile not os.path.exists({str(flag)!r}):\n    time.sleep(0.05)"
    agent(lab, "POST", f"notebooks/{NOTEBOOK}", {"action": "insert", "content": code, "cell_id": "wait"})
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(
            agent, lab, "POST", f"notebooks/{NOTEBOOK}/run", {"cell_ids": ["wait"], "timeout": 120}, 150
        )
        try:
            # The run is in progress, at its cell; the cell in the open notebook shows it runs.
            run = page.locator(f"{PANEL} [data-run]", has_text="running cell wait")
            run.wait_for(timeout=60_000)
            assert NOTEBOOK in run.inner_text()
            page.locator(".jp-Notebook .jp-Cell.jp-agent-running").wait_for(timeout=20_000)
            assert "time.sleep" in page.locator(".jp-Notebook .jp-Cell.jp-agent-running").inner_text()
            # Its border is not JupyterLab's own orange for a cell edited since it ran.
            border, orange = page.evaluate(
                "() => { const probe = document.createElement('div'); "
                "probe.style.color = 'var(--jp-warn-color1)'; document.body.append(probe); "
                "const orange = getComputedStyle(probe).color; probe.remove(); return [getComputedStyle("
                "document.querySelector('.jp-Notebook .jp-Cell.jp-agent-running')).boxShadow, orange]; }"
            )
            assert border and orange not in border, (border, orange)
            run.locator('button[data-action="interrupt"]').click()
            answer = running.result(timeout=60)
        finally:
            flag.touch()
    (result,) = answer["cells"]
    # the person's Interrupt is not the agent's error: the cell is cancelled, saying who stopped it
    assert result["status"] == "cancelled" and "Interrupted from outside this call" in json.dumps(result), (
        answer
    )
    run.wait_for(state="detached", timeout=20_000)
    page.locator(".jp-Notebook .jp-Cell.jp-agent-running").wait_for(state="detached", timeout=20_000)


def test_the_commands_are_in_the_palette_and_act(lab: dict[str, Any], page: Any) -> None:
    """The panel's actions are JupyterLab commands, in the command palette under "Agents"; a command run
    there acts as the panel's button (here: Undo of the newest change of the current notebook)."""
    commands = page.evaluate(
        "() => window.jupyterapp.commands.listCommands().filter(c => c.startsWith('agents:')).sort()"
    )
    assert commands == [
        "agents:approve",
        "agents:connect-agent",
        "agents:deny",
        "agents:diff",
        "agents:interrupt",
        "agents:open-approval",
        "agents:open-change",
        "agents:open-panel",
        "agents:revoke-token",
        "agents:share-focus",
        "agents:stop",
        "agents:undo",
    ], commands
    body = {"action": "edit", "cell_id": "total", "content": "total = 'by command'"}
    change_id = agent(lab, "POST", f"notebooks/{NOTEBOOK}", body)["change_id"]
    page.locator(f'{PANEL} [data-change-id="{change_id}"]').wait_for(timeout=20_000)
    cell(page, 1).locator(".jp-InputPrompt").click()  # the notebook is the current widget
    page.keyboard.press("Control+Shift+c")
    palette = page.locator(".lm-CommandPalette")
    palette.locator("input").fill("Undo Agent Change")
    item = palette.locator(".lm-CommandPalette-item", has_text=f"Undo Agent Change {change_id}")
    item.wait_for(timeout=10_000)
    headers = [h.lower() for h in palette.locator(".lm-CommandPalette-header").all_inner_texts()]
    assert "agents" in headers, headers
    item.click()
    page.locator(f'{PANEL} [data-change-id="{int(change_id) + 1}"]', has_text=f"undo {change_id}").wait_for(
        timeout=20_000
    )
    page.wait_for_function(
        "() => !document.querySelectorAll('.jp-Notebook .jp-Cell')[1]?.innerText.includes('by command')",
        timeout=20_000,
    )


def test_notebook_7_has_the_panel_and_the_marks(lab: dict[str, Any], page: Any) -> None:
    """The same extension in Notebook 7's notebook view (the same server serves it)."""
    pytest.importorskip("notebook", reason="Notebook 7 is not installed")
    nb7 = page.context.new_page()
    try:
        nb7.goto(f"{lab['base']}/notebooks/{NOTEBOOK}", timeout=90_000)
        nb7.wait_for_selector(f'{PANEL}[data-connected="true"]', state="attached", timeout=60_000)
        nb7.wait_for_function(
            "() => document.querySelector('.jp-Notebook')?.innerText.includes('print(total)')", timeout=60_000
        )
        answer = agent(lab, "POST", f"notebooks/{NOTEBOOK}", {"action": "insert", "content": "seen_in = 7"})
        nb7.wait_for_selector(
            f'{PANEL} [data-change-id="{answer["change_id"]}"]', state="attached", timeout=20_000
        )
        nb7.locator(".jp-Notebook .jp-Cell.jp-agent-changed", has_text="seen_in = 7").wait_for(timeout=20_000)
    finally:
        nb7.close()


def test_a_cell_that_arrives_after_its_change_event_is_marked(lab: dict[str, Any], page: Any) -> None:
    """The ledger's event of an insert can reach the page before the room's update that brings the cell
    (the order a loaded machine can produce): the mark is drawn when the cell arrives. Forced here: a
    second page's room messages from the server are held until the change is listed in its panel."""
    held: list[Any] = []
    hold = [False]

    def relay(ws: Any) -> None:
        server = ws.connect_to_server()
        ws.on_message(server.send)
        server.on_message(lambda message: held.append(message) if hold[0] else ws.send(message))
        relays.append(ws)

    relays: list[Any] = []
    second = page.context.new_page()
    try:
        second.route_web_socket(re.compile(r"/api/collaboration/room/"), relay)
        second.goto(f"{lab['base']}/lab/tree/{NOTEBOOK}?reset&token={lab['token']}", timeout=90_000)
        second.wait_for_function(
            "() => document.querySelector('.jp-Notebook')?.innerText.includes('print(total)')", timeout=60_000
        )
        second.locator('.jp-SideBar [data-id="jp-agent-activity"]').click()
        second.wait_for_selector(f'{PANEL}[data-connected="true"]', state="visible", timeout=30_000)
        hold[0] = True
        body = {"action": "insert", "content": "arrived_late = 1", "cell_id": "late"}
        change_id = agent(lab, "POST", f"notebooks/{NOTEBOOK}", body)["change_id"]
        second.locator(f'{PANEL} [data-change-id="{change_id}"]').wait_for(timeout=20_000)
        wait_until(second, lambda: held, 20, "the room's update of the insert never reached the relay")
        assert "arrived_late" not in second.locator(".jp-Notebook").inner_text()  # the cell is not there yet
        hold[0] = False
        for message in held:
            relays[-1].send(message)
        mark = f'.jp-Notebook .jp-Cell.jp-agent-changed[data-agent-change-id="{change_id}"]'
        second.locator(mark, has_text="arrived_late = 1").wait_for(timeout=20_000)
    finally:
        second.close()


def test_the_panel_reconnects_after_a_server_restart(lab: dict[str, Any], page: Any) -> None:
    # Every state the panel's connection goes through, recorded in the page.
    page.evaluate(
        """() => {
            window.__agentConnection = [];
            const root = document.getElementById('jp-agent-activity');
            new MutationObserver(() => window.__agentConnection.push(root.dataset.connected))
                .observe(root, {attributes: true, attributeFilter: ['data-connected']});
        }"""
    )
    # On reconnecting the panel reads the changes list; its answer is held back here until a newer
    # change has arrived as an event, the order a loaded machine can produce: the late list must not
    # drop that change.
    held: list[tuple[Any, Any]] = []

    def hold(route: Any) -> None:
        held.append((route, route.fetch()))  # read from the server now, handed to the page later

    agent(lab, "POST", f"notebooks/{NOTEBOOK}", {"action": "insert", "content": "before = 'restart'"})
    page.route("**/api/agent/changes?*", hold)
    try:
        lab["restart"]()
        page.wait_for_function(
            "() => window.__agentConnection.includes('false') && "
            "document.getElementById('jp-agent-activity').dataset.connected === 'true'",
            timeout=60_000,
        )
        wait_until(page, lambda: held, 30, "the panel did not read the changes on reconnecting")
        # Live again: a change made now is listed (and the ledger kept the earlier ones across the restart).
        body = {"action": "insert", "content": "after = 'restart'"}
        answer = agent(lab, "POST", f"notebooks/{NOTEBOOK}", body)
        row = page.locator(f'{PANEL} [data-change-id="{answer["change_id"]}"]')
        row.wait_for(timeout=20_000)  # from the event
        for route, response in held:
            # the list read before the change reaches the page now, with one row more that shows it was
            # rendered (a copy of its newest entry under another id)
            listing = response.json()
            listing["changes"].insert(0, {**listing["changes"][0], "id": "held-list"})
            route.fulfill(response=response, json=listing)
        page.locator(f'{PANEL} [data-change-id="held-list"]').wait_for(timeout=20_000)
        assert row.is_visible(), "the list read before the change dropped it"
        # The cell inserted just before the stop is in the notebook once: had the room's Y store lost it
        # while the autosave wrote the file, the restarted room would reload the file beside the page's
        # own copy of the cell (twice, one id).
        page.locator(".jp-Notebook .jp-Cell", has_text="after = 'restart'").wait_for(timeout=30_000)
        sources = file_sources(lab, lambda s: "after = 'restart'" in s)
        time.sleep(2)  # the page's copy would reach the room and the room's next save the file
        sources = file_sources(lab, lambda s: "after = 'restart'" in s)
        assert sources.count("before = 'restart'") == 1, sources
    finally:
        page.unroute("**/api/agent/changes?*")
        # JupyterLab's own "Server Connection Error" dialog, from its requests while the server was down,
        # would stand over the page for the module's next tests.
        lost = page.locator(".jp-Dialog", has_text="Server Connection Error")
        if lost.count():
            lost.locator("button").last.click()
            lost.wait_for(state="detached", timeout=10_000)

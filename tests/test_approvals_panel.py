"""The person's side of the approval gate (issue 38) in a real browser: the Agents panel's "Waiting for you".

One real ``jupyter lab`` with agent tokens on and every agent asking before it executes
(``c.ApprovalPolicy.rules``), real kernels, one headless Debian Chromium page with a notebook open and the
panel shown. Agents are real agent tokens calling the HTTP routes from a thread; the person is the page:

- an agent's eval waits: the request is listed with its agent, action and code in full, the panel's
  sidebar tab shows a badge with the count, a JupyterLab notification says who wants what (its Review
  opens the panel); **Approve** → the eval answers 200 with its output, and the row, badge and
  notification go;
- a notebook run's cells are marked in the open notebook (``jp-agent-pending``) while it waits
  (screenshot ``test-artifacts/approvals.png``, the one in docs/);
- **Deny** with a reason → the eval answers 403 with that reason;
- **Approve for 10 minutes** → 200, and the agent's next same request is approved at once (no row);
- ``agents:approve`` from the command palette shows the oldest request in full, then approves it.

The DOM hooks used here are the ones docs/panel.md documents.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import nbformat
import pytest
from browser import ARTIFACTS, http, launch, needs_chromium, running_lab
from nbformat.v4 import new_code_cell, new_notebook

pytest.importorskip("jupyterlab", reason="jupyterlab is not installed")
pytest.importorskip("jupyter_server_ydoc", reason="jupyter-collaboration is not installed")
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")

pytestmark = [needs_chromium, pytest.mark.timeout(240)]

PANEL = "#jp-agent-activity"
TAB = '.jp-SideBar [data-id="jp-agent-activity"]'
WAITING = f'{PANEL} [data-section="waiting-for-you"]'
NOTEBOOK = "report.ipynb"


@pytest.fixture
def jp_asyncio_loop() -> None:
    """No in-process server here: pytest-jupyter's loop per test would take (and close) the event loop
    of the module's Playwright, which runs in this thread."""


@pytest.fixture
def jp_server_cleanup() -> None:
    """(Nothing to clean up: the server is a subprocess.)"""


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("approvals-panel")
    config = {
        "ServerApp": {
            "identity_provider_class": "jupyter_agent_tools.auth.AgentIdentityProvider",
            "authorizer_class": "jupyter_agent_tools.auth.AgentAuthorizer",
        },
        "ApprovalPolicy": {
            "rules": [
                {"who": "agent:*", "actions": ["execute"], "decision": "ask"},
                {"who": "agent:editor", "actions": ["edit"], "decision": "ask"},
            ]
        },
    }
    with running_lab(tmp, config=config) as running:
        cells = [
            new_code_cell("rows = [3, 4, 5]", id="load"),
            new_code_cell("print('total', sum(rows))", id="total"),
            new_code_cell("print('not asked about')", id="other"),
        ]
        nb = new_notebook(
            cells=cells,
            metadata={
                "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
                "language_info": {"name": "python"},
            },
        )
        nbformat.write(nb, str(running["root"] / NOTEBOOK))
        yield running


@pytest.fixture(scope="module")
def page(lab: dict[str, Any]) -> Iterator[Any]:
    """The notebook open in JupyterLab, the Agents panel shown and connected to the event bus."""
    with sync_api.sync_playwright() as playwright:
        browser = launch(playwright)
        try:
            page = browser.new_context(viewport={"width": 1400, "height": 860}).new_page()
            page.goto(f"{lab['base']}/lab/tree/{NOTEBOOK}?reset&token={lab['token']}", timeout=90_000)
            page.wait_for_function(
                "() => document.querySelector('.jp-Notebook')?.innerText.includes('not asked about')",
                timeout=90_000,
            )
            page.locator(TAB).click()
            page.wait_for_selector(f'{PANEL}[data-connected="true"]', state="visible", timeout=30_000)
            yield page
        finally:
            browser.close()


def agent_token(lab: dict[str, Any], name: str) -> str:
    """A new agent token (read, edit, execute), made with the server's own token."""
    body = {"name": name, "scopes": ["read", "edit", "execute"]}
    status, answer = http("POST", f"{lab['base']}/api/agent/tokens", lab["token"], body)
    assert status == 201, answer
    return str(answer["token"])


def as_agent(pool: ThreadPoolExecutor, lab: dict[str, Any], token: str, route: str, body: Any) -> Future[Any]:
    """The agent's request, from a thread (it waits for the person): a future of (status, answer)."""
    return pool.submit(http, "POST", f"{lab['base']}/api/agent/{route}", token, body, 150)


def waiting_row(page: Any, has_text: str) -> tuple[Any, str]:
    """The row of "Waiting for you" that shows ``has_text``, once it is there, and its request's id."""
    row = page.locator(f"{WAITING} [data-approval-id]", has_text=has_text)
    row.wait_for(timeout=60_000)
    return row, str(row.get_attribute("data-approval-id"))


def badge(page: Any) -> str | None:
    """The count the sidebar tab's badge shows (the CSS content of its ::before), None without one."""
    return page.evaluate(  # type: ignore[no-any-return]
        """(tab) => { const node = document.querySelector(tab);
            if (!node.dataset.agentPending) { return null; }
            return getComputedStyle(node, '::before').content.replace(/"/g, ''); }""",
        TAB,
    )


def settled(lab: dict[str, Any], path: str = NOTEBOOK) -> None:
    """Wait until the notebook's file stops changing: opening it starts its kernel, whose language_info
    the page writes into the file (a run approved on the notebook as it was before is then refused, 409)."""
    url = f"{lab['base']}/api/contents/{path}?content=0&hash=1"
    deadline = time.monotonic() + 60
    last = None
    while (current := http("GET", url, lab["token"])[1]["hash"]) != last:
        assert time.monotonic() < deadline, "the notebook's file never stopped changing"
        last = current
        time.sleep(1.5)


def toast(page: Any, text: str) -> Any:
    return page.locator(".Toastify__toast", has_text=text)


def test_an_eval_waits_in_the_panel_and_approve_runs_it(lab: dict[str, Any], page: Any) -> None:
    token = agent_token(lab, "ci-bot")
    code = "print('approved', 6 * 7)"
    body = {"session": "gate", "cells": [{"code": code}], "approval_wait": 120}
    with ThreadPoolExecutor(1) as pool:
        call = as_agent(pool, lab, token, "eval", body)
        row, approval_id = waiting_row(page, code)
        text = row.inner_text()
        assert "agent:ci-bot" in text and "execute" in text and "run 1 cell in session 'gate'" in text, text
        # where and how it runs, then the cell's code
        shown = [c.strip() for c in row.locator("pre.jp-AgentActivity-code").all_inner_texts()]
        assert shown == ['session: "gate"', code], shown
        assert [b.get_attribute("data-action") for b in row.locator("button").all()] == [
            "approve",
            "approve-for",
            "deny",
        ]
        # The section is at the top of the panel; the sidebar tab shows the count, visibly.
        sections = page.locator(f"{PANEL} [data-section]").evaluate_all(
            "(s) => s.map(n => n.dataset.section)"
        )
        assert sections[0] == "waiting-for-you", sections
        assert badge(page) == "1"
        assert "1 request waiting for you" in (page.locator(TAB).get_attribute("title") or "")
        notice = toast(page, "agent:ci-bot wants to run 1 cell in session 'gate'")
        notice.wait_for(timeout=20_000)
        assert notice.locator("button", has_text="Review").count() == 1
        assert not call.done()  # nothing ran: it waits for the person
        row.locator('button[data-action="approve"]').click()
        status, answer = call.result(timeout=90)
    assert status == 200 and "approved 42" in answer["cells"][0]["output"], answer
    row.wait_for(state="detached", timeout=20_000)
    assert page.locator(WAITING).is_hidden()
    assert badge(page) is None
    notice.wait_for(state="detached", timeout=20_000)  # decided: its notification goes
    decided = http("GET", f"{lab['base']}/api/agent/approvals/{approval_id}", lab["token"])[1]
    assert decided["state"] == "approved" and decided["decided_by"], decided


def test_a_waiting_notebook_run_marks_its_cells_and_review_shows_it(lab: dict[str, Any], page: Any) -> None:
    token = agent_token(lab, "report-bot")
    settled(lab)
    body = {"cell_ids": ["load", "total"], "approval_wait": 120}
    with ThreadPoolExecutor(1) as pool:
        call = as_agent(pool, lab, token, "notebooks/report.ipynb/run", body)
        row, approval_id = waiting_row(page, "agent:report-bot")
        codes = row.locator("pre.jp-AgentActivity-code").all_inner_texts()
        assert [c.strip() for c in codes] == ["rows = [3, 4, 5]", "print('total', sum(rows))"], codes
        assert NOTEBOOK in row.inner_text()
        # The two cells waiting are marked in the open notebook; the third is not.
        pending = page.locator(
            f'.jp-Notebook .jp-Cell.jp-agent-pending[data-agent-approval-id="{approval_id}"]'
        )
        pending.nth(1).wait_for(timeout=20_000)
        assert pending.count() == 2 and "not asked about" not in " ".join(pending.all_inner_texts())
        notice = toast(page, f"agent:report-bot wants to run 2 cells in {NOTEBOOK}")
        notice.wait_for(timeout=20_000)
        assert badge(page) == "1"
        ARTIFACTS.mkdir(exist_ok=True)
        page.locator(".jp-Notebook .jp-Cell").nth(2).locator(".jp-InputPrompt").click()
        page.wait_for_function(  # the notification has slid in
            "(t) => [...document.querySelectorAll('.Toastify__toast')].some(n => n.innerText.includes(t) "
            "&& n.getBoundingClientRect().right <= window.innerWidth)",
            arg="agent:report-bot",
            timeout=10_000,
        )
        page.screenshot(path=str(ARTIFACTS / "approvals.png"))
        # Review, with another sidebar panel shown, brings the Agents panel back.
        page.locator('.jp-SideBar [data-id="filebrowser"]').click()
        page.locator(PANEL).wait_for(state="hidden", timeout=10_000)
        notice.locator("button", has_text="Review").click()
        page.locator(PANEL).wait_for(state="visible", timeout=10_000)
        assert not call.done()
        row.locator('button[data-action="approve"]').click()
        status, answer = call.result(timeout=90)
    assert status == 200, answer
    assert "total 12" in json.dumps(answer), answer
    pending.first.wait_for(state="detached", timeout=20_000)  # decided: the marks go
    assert page.locator(".jp-Notebook .jp-Cell.jp-agent-pending").count() == 0


def test_deny_with_a_reason_tells_the_agent(lab: dict[str, Any], page: Any) -> None:
    token = agent_token(lab, "denied-bot")
    code = "import os; os.remove('prod.db')"
    body = {"session": "risky", "cells": [{"code": code}], "approval_wait": 120}
    with ThreadPoolExecutor(1) as pool:
        call = as_agent(pool, lab, token, "eval", body)
        row, approval_id = waiting_row(page, code)
        row.locator('input[data-field="reason"]').fill("not on prod data")
        row.locator('button[data-action="deny"]').click()
        status, answer = call.result(timeout=90)
    assert status == 403, answer
    assert answer["reason"] == "approval_denied" and str(answer["approval_id"]) == approval_id, answer
    assert "not on prod data" in answer["message"], answer
    row.wait_for(state="detached", timeout=20_000)
    assert badge(page) is None


def test_a_waiting_edit_shows_its_diff_and_a_denial_leaves_the_cell(lab: dict[str, Any], page: Any) -> None:
    token = agent_token(lab, "editor")
    body = {
        "action": "edit",
        "cell_id": "other",
        "content": "print('edited by the agent')",
        "approval_wait": 120,
    }
    with ThreadPoolExecutor(1) as pool:
        call = as_agent(pool, lab, token, f"notebooks/{NOTEBOOK}", body)
        row, approval_id = waiting_row(page, "agent:editor")
        assert "edit" in row.inner_text() and "cell other: edited" in row.inner_text(), row.inner_text()
        diff = row.locator("pre.jp-AgentActivity-diffText")
        assert diff.locator(".jp-mod-removed", has_text="-print('not asked about')").count() == 1
        assert diff.locator(".jp-mod-added", has_text="+print('edited by the agent')").count() == 1
        marked = page.locator(f'.jp-Cell.jp-agent-pending[data-agent-approval-id="{approval_id}"]')
        marked.wait_for(timeout=20_000)
        assert marked.count() == 1 and "not asked about" in marked.inner_text()
        row.locator('button[data-action="deny"]').click()  # no reason given
        status, answer = call.result(timeout=90)
    assert status == 403 and answer["reason"] == "approval_denied", answer
    marked.wait_for(state="detached", timeout=20_000)
    assert "edited by the agent" not in page.locator(".jp-Notebook").inner_text()


def test_approve_for_10_minutes_approves_the_next_same_request_at_once(
    lab: dict[str, Any], page: Any
) -> None:
    token = agent_token(lab, "nightly")
    # Every request row the panel ever shows from now on, recorded in the page.
    page.evaluate(
        """() => {
            window.__approvalRows = [];
            new MutationObserver(() => document.querySelectorAll('[data-approval-id]').forEach(row => {
                if (!window.__approvalRows.includes(row.dataset.approvalId)) {
                    window.__approvalRows.push(row.dataset.approvalId);
                }
            })).observe(document.getElementById('jp-agent-activity'), {childList: true, subtree: true});
        }"""
    )
    body = {"session": "nightly", "cells": [{"code": "n = 1\nprint('first', n)"}], "approval_wait": 120}
    with ThreadPoolExecutor(1) as pool:
        call = as_agent(pool, lab, token, "eval", body)
        row, approval_id = waiting_row(page, "print('first', n)")
        row.locator('button[data-action="approve-for"]').click()
        status, answer = call.result(timeout=90)
        assert status == 200 and "first 1" in answer["cells"][0]["output"], answer
        row.wait_for(state="detached", timeout=20_000)
        again = {**body, "cells": [{"code": "print('second', n + 1)"}], "approval_wait": 5}
        status, answer = as_agent(pool, lab, token, "eval", again).result(timeout=90)
    assert status == 200 and "second 2" in answer["cells"][0]["output"], answer
    granted = http("GET", f"{lab['base']}/api/agent/approvals/{approval_id}", lab["token"])[1]
    assert granted["state"] == "approved" and granted["for_seconds"] == 600, granted
    recent = http("GET", f"{lab['base']}/api/agent/approvals", lab["token"])[1]["recent"]
    second = next(a for a in recent if a["agent"] == "agent:nightly" and a["id"] != granted["id"])
    assert second["state"] == "approved" and "for 600 s" in second["decided_by"], second
    page.wait_for_timeout(500)  # (its approved event reached the page by now)
    assert page.evaluate("() => window.__approvalRows") == [approval_id]  # never a row for the second
    assert page.locator(f"{WAITING} [data-approval-id]").count() == 0


def test_approve_from_the_command_palette_shows_the_request_first(lab: dict[str, Any], page: Any) -> None:
    commands = page.evaluate(
        "() => window.jupyterapp.commands.listCommands().filter(c => c.startsWith('agents:')).sort()"
    )
    assert {"agents:approve", "agents:deny"} <= set(commands), commands
    token = agent_token(lab, "palette-bot")
    code = "print('from the palette')"
    with ThreadPoolExecutor(1) as pool:
        call = as_agent(
            pool, lab, token, "eval", {"session": "p", "cells": [{"code": code}], "approval_wait": 120}
        )
        _row, approval_id = waiting_row(page, code)
        page.locator(".jp-Notebook .jp-Cell").nth(0).locator(".jp-InputPrompt").click()
        page.keyboard.press("Control+Shift+c")
        palette = page.locator(".lm-CommandPalette")
        palette.locator("input").fill("Approve Agent Request")
        item = palette.locator(".lm-CommandPalette-item", has_text=f"Approve Agent Request {approval_id}")
        item.wait_for(timeout=10_000)
        item.click()
        dialog = page.locator(".jp-Dialog")
        dialog.wait_for(timeout=10_000)
        assert code in dialog.inner_text()
        assert not call.done()
        dialog.locator("button.jp-mod-accept").click()
        status, answer = call.result(timeout=90)
    assert status == 200 and "from the palette" in answer["cells"][0]["output"], answer


def test_a_url_naming_a_request_opens_the_panel_at_it(lab: dict[str, Any], page: Any) -> None:
    # What an MCP client opens for its URL elicitation (2026-07-28): JupyterLab at one request.
    token = agent_token(lab, "url-bot")
    body = {"session": "u", "cells": [{"code": "print('opened by a URL')"}], "approval_wait": 0}
    status, answer = http("POST", f"{lab['base']}/api/agent/eval", token, body)
    assert status == 202, answer
    approval_id = answer["approval_id"]
    opened = page.context.new_page()
    try:
        # (JupyterLab is open in this browser already: the page moves to a workspace of its own first)
        opened.goto(f"{lab['base']}/lab?agent-approval={approval_id}", timeout=90_000)
        row = opened.locator(f'{WAITING} [data-approval-id="{approval_id}"].jp-mod-revealed')
        row.wait_for(timeout=60_000)
        assert row.is_visible() and "opened by a URL" in row.inner_text()
        assert opened.locator(f"{PANEL}").is_visible()  # the panel is the sidebar's shown widget
        assert opened.locator(f"{WAITING} .jp-mod-revealed").count() == 1
    finally:
        opened.close()
    decided = http(
        "POST", f"{lab['base']}/api/agent/approvals/{approval_id}", lab["token"], {"decision": "deny"}
    )
    assert decided[0] == 200, decided

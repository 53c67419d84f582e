"""Share my focus in a real browser: a ``jupyter lab`` (agent tokens on) without real-time collaboration
(as most users run) and one with it, and a headless Debian Chromium page on each. The person turns the
Agents panel's toggle on; the agent's REST read follows the active cell; the panel says who read it; the
agent's ``reveal_cell`` scrolls the sharing tab to the cell and marks it; the toggle off removes the focus at
once; with no tab sharing, an agent's action is a notification the person clicks. The screenshot kept in
docs/ comes from here (``test-artifacts/panel_focus.png``, without collaboration).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import nbformat
import pytest
from browser import ARTIFACTS, http, launch, needs_chromium, running_lab, wait_until
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

pytest.importorskip("jupyterlab", reason="jupyterlab is not installed")
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")

pytestmark = [needs_chromium, pytest.mark.timeout(180)]

PANEL = "#jp-agent-activity"
NOTEBOOK = "focus.ipynb"
AGENT_CLASSES = {
    "identity_provider_class": "jupyter_agent_tools.auth.AgentIdentityProvider",
    "authorizer_class": "jupyter_agent_tools.auth.AgentAuthorizer",
}


@pytest.fixture
def jp_asyncio_loop() -> None:
    """(No in-process server: the module's Playwright owns this thread's loop.)"""


@pytest.fixture
def jp_server_cleanup() -> None:
    """(Nothing to clean up: the server is a subprocess.)"""


@pytest.fixture(scope="module", params=[False, True], ids=["without-rtc", "rtc"])
def lab(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("focus")
    with running_lab(tmp, rtc=request.param, config={"ServerApp": AGENT_CLASSES}) as running:
        running["rtc"] = request.param
        cells = [new_markdown_cell("# Sales", id="title")]
        cells += [new_code_cell(f"step_{n} = {n} * 10", id=f"step{n}") for n in range(1, 4)]
        nb = new_notebook(
            cells=cells,
            metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
        )
        nbformat.write(nb, str(running["root"] / NOTEBOOK))
        status, made = http(
            "POST",
            f"{running['base']}/api/agent/tokens",
            running["token"],
            {"name": "helper", "scopes": ["read"]},
        )
        assert status == 201, made
        running["agent"] = made["token"]
        yield running


def focus(lab: dict[str, Any]) -> tuple[int, Any]:
    return http("GET", f"{lab['base']}/api/agent/focus", lab["agent"])


def test_share_my_focus_follows_the_cell_and_an_agent_reveals_one(lab: dict[str, Any]) -> None:
    assert focus(lab)[0] == 403  # off by default
    with sync_api.sync_playwright() as playwright:
        browser = launch(playwright)
        try:
            page = browser.new_context(viewport={"width": 1400, "height": 860}).new_page()
            page.goto(f"{lab['base']}/lab/tree/{NOTEBOOK}?reset&token={lab['token']}", timeout=90_000)
            page.wait_for_function(
                "() => document.querySelector('.jp-Notebook')?.innerText.includes('step_3')", timeout=90_000
            )
            page.locator('.jp-SideBar [data-id="jp-agent-activity"]').click()
            page.wait_for_selector(f'{PANEL}[data-connected="true"]', state="visible", timeout=30_000)
            assert focus(lab)[0] == 403  # the page is open, sharing is not on

            # the person turns it on, and moves to the third cell: the agent follows
            page.locator(f'{PANEL} input[data-field="share-focus"]').check()
            page.wait_for_selector(f'{PANEL}[data-sharing-focus="true"]', timeout=10_000)
            page.locator(".jp-Notebook .jp-Cell").nth(2).click()
            seen: dict[str, Any] = {}

            def on_cell() -> bool:
                status, answer = focus(lab)
                seen.update(answer if status == 200 else {})
                return status == 200 and (answer.get("cell") or {}).get("id") == "step2"

            wait_until(page, on_cell, 10, f"the agent never read the active cell: {seen}")
            assert seen["path"] == NOTEBOOK and seen["cell"]["source"] == "step_2 = 2 * 10", seen
            # the person types and selects in the cell: the agent reads the new source and the selection
            page.locator(".jp-Notebook .jp-Cell").nth(2).locator(".cm-content").click()
            page.keyboard.press("End")
            page.keyboard.type(" + 1")
            page.keyboard.press("Shift+Home")

            def typed() -> bool:
                status, answer = focus(lab)
                seen.update(answer if status == 200 else {})
                return status == 200 and (answer.get("selection") or {}).get("text") == "step_2 = 2 * 10 + 1"

            wait_until(page, typed, 10, f"the agent never read the edit and the selection: {seen}")
            assert seen["cell"]["source"] == "step_2 = 2 * 10 + 1", seen
            status_line = page.locator(f"{PANEL} .jp-AgentFocus-status")
            wait_until(
                page,
                lambda: "Read by agent:helper" in status_line.inner_text(),
                10,
                f"the panel never said who read it: {status_line.inner_text()!r}",
            )

            # the agent points at the last cell: the sharing tab scrolls to it, selects it and marks it
            status, answer = http(
                "POST",
                f"{lab['base']}/api/agent/focus/actions",
                lab["agent"],
                {"action": "reveal_cell", "path": NOTEBOOK, "cell_id": "step3", "message": "this one"},
            )
            assert status == 200 and answer["delivered"] == "tab", answer
            revealed = page.locator(".jp-Notebook .jp-Cell.jp-AgentFocus-revealed")
            revealed.wait_for(timeout=10_000)
            assert (
                "step_3" in revealed.inner_text()
                and revealed.get_attribute("data-agent-revealed") == "agent:helper"
            )
            page.wait_for_function(
                "() => document.querySelector('.jp-Notebook .jp-mod-active')?.innerText.includes('step_3')",
                timeout=10_000,
            )
            if not lab["rtc"]:
                ARTIFACTS.mkdir(exist_ok=True)
                page.screenshot(path=str(ARTIFACTS / "panel_focus.png"))

            # off: gone at once; an agent's action then is a notification the person clicks
            page.locator(f'{PANEL} input[data-field="share-focus"]').uncheck()
            wait_until(page, lambda: focus(lab)[0] == 403, 5, "the focus stayed after the toggle went off")
            status, answer = http(
                "POST",
                f"{lab['base']}/api/agent/focus/actions",
                lab["agent"],
                {"action": "reveal_cell", "path": NOTEBOOK, "cell_id": "step1"},
            )
            assert status == 200 and answer["delivered"] == "notification", answer
            toast = page.locator(".Toastify__toast", has_text="agent:helper points at cell step1")
            toast.wait_for(timeout=10_000)
            assert page.locator(".jp-Notebook .jp-mod-active").inner_text().count("step_1") == 0
            toast.get_by_role("button", name="Show").click()
            page.wait_for_function(
                "() => document.querySelector('.jp-Notebook .jp-mod-active')?.innerText.includes('step_1')",
                timeout=10_000,
            )
        finally:
            browser.close()

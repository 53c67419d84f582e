"""End to end in a real browser: JupyterLab with real-time collaboration shows an agent's edit live.

A real ``jupyter lab`` process (jupyter-collaboration's server and frontend extensions, our extension)
serves a notebook that headless Debian Chromium, driven by Playwright, has open. The person types into a
cell and, right after, the agent inserts a cell through ``POST /api/agent/notebooks/{path}``: the cell's
text must appear in the page with no reload, the person's typing must survive, and the room must save both.
A screenshot is saved as ``test-artifacts/rtc_live_insert.png``. The agent also runs a cell of the open
notebook through ``POST /api/agent/notebooks/{path}/run``: its output shows in the page while the cell
still runs, then in full with the execution count (``rtc_agent_run_streaming.png``, ``rtc_agent_run.png``).

Chromium comes from the system (``apt-get install chromium``, done by ``python3 dev.py test`` when run as
root); Playwright's own browser download is never used. The test is skipped only when no Chromium exists.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import nbformat
import pytest
from browser import ARTIFACTS, http, launch, needs_chromium, running_lab, wait_until
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

pytest.importorskip("jupyterlab", reason="jupyterlab (from jupyter-collaboration) is not installed")
pytest.importorskip("jupyter_server_ydoc", reason="jupyter-collaboration is not installed")
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")

INSERTED = "inserted by the agent"

pytestmark = needs_chromium


@pytest.fixture
def lab(tmp_path: Path):
    """A ``jupyter lab`` subprocess on 127.0.0.1 with a token, all its state under ``tmp_path``."""
    with running_lab(tmp_path) as running:
        yield running


def test_jupyterlab_shows_agent_insert_live(lab: dict[str, Any], tmp_path: Path) -> None:
    nb = new_notebook(
        cells=[new_markdown_cell("# Shared notebook"), new_code_cell("value = 1")],
        metadata={
            "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
            "language_info": {"name": "python"},
        },
    )
    nbformat.write(nb, str(lab["root"] / "shared.ipynb"))
    base, token = lab["base"], lab["token"]
    ARTIFACTS.mkdir(exist_ok=True)

    with sync_api.sync_playwright() as playwright:
        browser = launch(playwright)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            synced: list[str] = []

            def on_websocket(ws: Any) -> None:
                if "/api/collaboration/room/json:notebook:" in ws.url:
                    # The room sends its content only once it is loaded: a frame means it is live.
                    ws.on("framereceived", lambda _frame: synced.append(ws.url))

            page.on("websocket", on_websocket)
            page.goto(f"{base}/lab/tree/shared.ipynb?reset&token={token}", timeout=90_000)
            page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=90_000)
            page.wait_for_function(
                "() => document.querySelector('.jp-Notebook')?.innerText.includes('value = 1')",
                timeout=60_000,
            )
            wait_until(page, lambda: synced, 60, "the notebook never joined its collaborative room")
            page.evaluate("() => { window.__agentToolsMarker = 'not reloaded'; }")
            cells_before = page.locator(".jp-Notebook .jp-Cell").count()
            # The person types into the code cell (unsaved) right before the agent's request.
            page.locator(".jp-Notebook .jp-Cell").nth(1).locator(".cm-content").click()
            page.keyboard.press("End")
            page.keyboard.type("23")

            status, answer = http(
                "POST",
                f"{base}/api/agent/notebooks/shared.ipynb",
                token,
                body={"action": "insert", "cell_index": 1, "content": f"print('{INSERTED}')"},
            )
            assert status == 200, answer

            page.wait_for_function(
                f"() => document.querySelector('.jp-Notebook')?.innerText.includes({INSERTED!r})",
                timeout=30_000,
            )
            assert page.evaluate("() => window.__agentToolsMarker") == "not reloaded"
            assert page.locator(".jp-Notebook .jp-Cell").count() == cells_before + 1
            second = page.locator(".jp-Notebook .jp-Cell").nth(1).inner_text()
            assert INSERTED in second
            assert "value = 123" in page.locator(".jp-Notebook .jp-Cell").nth(2).inner_text()
            page.screenshot(path=str(ARTIFACTS / "rtc_live_insert.png"))
        finally:
            browser.close()

    # The room saves the live document, with the person's typing and the agent's cell, to the file.
    deadline = time.monotonic() + 30
    while True:
        try:  # the contents manager writes in place: the file may be caught half written
            saved = nbformat.read(str(lab["root"] / "shared.ipynb"), as_version=4)
            sources = [c.source for c in saved.cells]
        except Exception as e:
            sources = [repr(e)]
        if sources == ["# Shared notebook", f"print('{INSERTED}')", "value = 123"]:
            break
        assert time.monotonic() < deadline, f"the file never got both edits: {sources}"
        time.sleep(0.1)


def test_jupyterlab_shows_agent_run_outputs_live(lab: dict[str, Any], tmp_path: Path) -> None:
    """The agent runs a cell of the notebook a person has open: its first line shows in the page while
    the cell still runs (it waits on a file the test creates), then the whole output and the count."""
    flag = tmp_path / "run.flag"
    source = (
        "import os, time\n"
        "print('agent run: first line', flush=True)\n"
        f"while not os.path.exists({str(flag)!r}):\n"
        "    time.sleep(0.02)\n"
        "print('agent run: second line')"
    )
    cell = new_code_cell(source)
    cell["id"] = "run-me"
    nb = new_notebook(
        cells=[new_markdown_cell("# Run by the agent"), cell],
        metadata={
            "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
            "language_info": {"name": "python"},
        },
    )
    nbformat.write(nb, str(lab["root"] / "run.ipynb"))
    base, token = lab["base"], lab["token"]
    ARTIFACTS.mkdir(exist_ok=True)
    outputs_js = (
        "() => document.querySelectorAll('.jp-Notebook .jp-Cell')[1]"
        "?.querySelector('.jp-OutputArea')?.innerText ?? ''"
    )

    with sync_api.sync_playwright() as playwright:
        browser = launch(playwright)
        pool = ThreadPoolExecutor(1)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            synced: list[str] = []

            def on_websocket(ws: Any) -> None:
                if "/api/collaboration/room/json:notebook:" in ws.url:
                    ws.on("framereceived", lambda _frame: synced.append(ws.url))

            page.on("websocket", on_websocket)
            page.goto(f"{base}/lab/tree/run.ipynb?reset&token={token}", timeout=90_000)
            page.wait_for_function(
                "() => document.querySelector('.jp-Notebook')?.innerText.includes('agent run: first line')",
                timeout=90_000,
            )  # the source is shown
            wait_until(page, lambda: synced, 60, "the notebook never joined its collaborative room")
            assert page.evaluate(outputs_js) == ""

            running = pool.submit(
                http,
                "POST",
                f"{base}/api/agent/notebooks/run.ipynb/run",
                token,
                {"cell_ids": ["run-me"]},
                120,
            )
            try:
                page.wait_for_function(
                    f"() => ({outputs_js})().includes('agent run: first line')", timeout=60_000
                )
                assert not running.done()  # the cell still waits on the flag
                assert "second line" not in page.evaluate(outputs_js)
                page.screenshot(path=str(ARTIFACTS / "rtc_agent_run_streaming.png"))
            finally:
                flag.touch()
            status, answer = running.result(timeout=120)
            assert status == 200, answer
            (result,) = answer["cells"]
            assert result["status"] == "complete" and result["outputs_written"]
            page.wait_for_function(
                f"() => ({outputs_js})().includes('agent run: second line')", timeout=30_000
            )
            shown = page.evaluate(outputs_js)
            assert shown.index("agent run: first line") < shown.index("agent run: second line")
            count = result["execution_count"]
            prompt = page.locator(".jp-Notebook .jp-Cell").nth(1).locator(".jp-InputPrompt")
            page.wait_for_function(
                "(c) => document.querySelectorAll('.jp-Notebook .jp-Cell')[1]"
                "?.querySelector('.jp-InputPrompt')?.innerText.includes(c)",
                arg=f"[{count}]",
                timeout=30_000,
            )
            assert f"[{count}]" in prompt.inner_text()
            page.screenshot(path=str(ARTIFACTS / "rtc_agent_run.png"))
        finally:
            flag.touch()
            pool.shutdown(wait=True)
            browser.close()

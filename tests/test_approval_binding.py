"""An approved notebook run runs what the person approved, and nothing else (issue 41).

Through the real doors (``/api/agent/notebooks/{path}/run`` and the MCP tool ``notebook_run``, both protocol
eras): a run is bound to the cells the person saw (by id and source hash), a run with ``ops`` compares the
plan the person saw with the plan the same ops make on the notebook now, and its ops are edits: decided
for ``edit`` as well as ``execute``, shown as a diff. Agents are real agent tokens; the person is the
server's own token (the fixtures of tests/test_approvals.py).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import nbformat
import pytest
import test_approvals
from mcp import types
from nbformat.v4 import new_code_cell, new_notebook
from test_approvals import (
    ASK_EXECUTE,
    approval_id,
    legacy_mcp,
    modern_mcp_opening_urls,
    notebook,
    pending_approval,
)

# The fixtures of tests/test_approvals.py: the server with a test's rules, the person, agents, MCP's URL.
jp_server_config = test_approvals.jp_server_config
http, agent, mcp_url = test_approvals.http, test_approvals.agent, test_approvals.mcp_url

pytestmark = pytest.mark.timeout(300)

SNEAK = "open('sneaked.txt', 'w').write('ran')"  # a cell the person never saw
ASK_EDIT_REPORTS = {"who": "agent:*", "actions": ["edit"], "paths": ["reports/**"], "decision": "ask"}


async def approve(http: Any, request_id: int) -> None:
    status, answer, _ = await http("POST", f"api/agent/approvals/{request_id}", {"decision": "approve"})
    assert status == 200, answer


async def insert(bot: Any, at: int, content: str, cell_id: str) -> None:
    """The agent inserts a cell (an edit, not asked for under these rules) while its run waits."""
    op = {"action": "insert", "cell_index": at, "content": content, "cell_id": cell_id}
    status, answer, _ = await bot("POST", "api/agent/notebooks/nb.ipynb", op)
    assert status == 200, answer


async def test_a_run_all_approved_does_not_run_a_cell_inserted_since(
    http: Any, agent: Any, jp_root_dir: Path
) -> None:
    notebook(jp_root_dir)
    bot = await agent()
    call = asyncio.ensure_future(bot("POST", "api/agent/notebooks/nb.ipynb/run", {"all": True}))
    request = await pending_approval(http)
    assert [c["id"] for c in request["details"]["cells"]] == ["c1", "c2"]
    await insert(bot, 2, SNEAK, "sneak")
    await approve(http, request["id"])
    status, answer, _ = await call
    assert status == 409, answer
    assert answer["cells"] == ["sneak"] and "sneak" in answer["message"], answer
    assert not (jp_root_dir / "sneaked.txt").exists()


async def test_a_run_by_index_approved_does_not_run_the_cell_now_at_that_index(
    http: Any, agent: Any, jp_root_dir: Path
) -> None:
    notebook(jp_root_dir)
    bot = await agent()
    call = asyncio.ensure_future(bot("POST", "api/agent/notebooks/nb.ipynb/run", {"cell_indices": [0]}))
    request = await pending_approval(http)
    assert [c["id"] for c in request["details"]["cells"]] == ["c1"]
    await insert(bot, 0, SNEAK, "sneak")
    await approve(http, request["id"])
    status, answer, _ = await call
    assert status == 409, answer
    assert set(answer["cells"]) == {"c1", "sneak"}, answer
    assert not (jp_root_dir / "sneaked.txt").exists()
    # By id, the approved cell is the same cell wherever it moved: the run goes on, with it alone.
    call = asyncio.ensure_future(bot("POST", "api/agent/notebooks/nb.ipynb/run", {"cell_ids": ["c1"]}))
    request = await pending_approval(http)
    await insert(bot, 0, "print('not approved')", "other")
    await approve(http, request["id"])
    status, answer, _ = await call
    assert status == 200, answer
    assert [(c["cell_id"], c["index"]) for c in answer["cells"]] == [("c1", 2)], answer
    assert not (jp_root_dir / "sneaked.txt").exists()


@pytest.mark.rules(ASK_EXECUTE, wait=0.2)
async def test_a_detached_run_approved_later_runs_only_the_approved_cells(
    http: Any, agent: Any, jp_root_dir: Path
) -> None:
    notebook(jp_root_dir)
    bot = await agent()
    status, started, _ = await bot("POST", "api/agent/notebooks/nb.ipynb/run", {"all": True})
    assert status == 202 and started["approval_id"], started
    await insert(bot, 1, SNEAK, "sneak")
    await approve(http, started["approval_id"])
    status, run, _ = await bot("GET", f"api/agent/runs/{started['run_id']}?wait=60")
    assert status == 200 and run["state"] == "error", run
    assert "sneak" in run["message"] and run["cells_started"] == 0, run
    assert not (jp_root_dir / "sneaked.txt").exists()


async def test_an_approved_insert_and_run_runs(http: Any, agent: Any, jp_root_dir: Path) -> None:
    path = notebook(jp_root_dir)
    bot = await agent()
    ops = [{"action": "insert", "cell_index": 2, "content": "print('inserted ran')", "cell_id": "added"}]
    call = asyncio.ensure_future(bot("POST", "api/agent/notebooks/nb.ipynb/run", {"ops": ops}))
    request = await pending_approval(http)
    assert [(c["id"], c["new"]) for c in request["details"]["cells"]] == [("added", True)]
    await approve(http, request["id"])
    status, answer, _ = await call
    assert status == 200, answer
    assert [c["cell_id"] for c in answer["cells"]] == ["added"], answer
    assert answer["cells"][0]["output"] == "inserted ran\n"
    assert [c.id for c in nbformat.read(str(path), as_version=4).cells] == ["c1", "c2", "added"]


async def test_an_approved_edit_and_run_runs_and_a_cell_changed_meanwhile_refuses_it(
    http: Any, agent: Any, jp_root_dir: Path
) -> None:
    path = notebook(jp_root_dir)
    bot = await agent()
    body = {
        "ops": [{"action": "edit", "cell_id": "c2", "content": "print('edited ran')"}],
        "cell_ids": ["c2"],
    }
    call = asyncio.ensure_future(bot("POST", "api/agent/notebooks/nb.ipynb/run", body))
    request = await pending_approval(http)
    await approve(http, request["id"])
    status, answer, _ = await call
    assert status == 200, answer
    assert answer["cells"][0]["output"] == "edited ran\n", answer
    # The same edit-and-run again, but the cell the ops edit changes before the person approves.
    body["ops"] = [{"action": "edit", "cell_id": "c1", "content": "x = 7"}]
    call = asyncio.ensure_future(bot("POST", "api/agent/notebooks/nb.ipynb/run", body))
    request = await pending_approval(http)
    nb = nbformat.read(str(path), as_version=4)
    nb.cells[0].source = "x = 1000"
    nbformat.write(nb, str(path))
    before = path.read_bytes()
    await approve(http, request["id"])
    status, answer, _ = await call
    assert status == 409 and "c1" in answer["cells"], answer
    assert path.read_bytes() == before  # nothing ran, nothing was written


def reports_notebook(root: Path) -> Path:
    (root / "reports").mkdir()
    path = root / "reports" / "nb.ipynb"
    cells = [new_code_cell("x = 6", id="c1"), new_code_cell("print(x * 7)", id="c2")]
    nbformat.write(new_notebook(cells=cells), str(path))
    return path


RUN_WITH_OPS = {
    "ops": [
        {"action": "delete", "cell_id": "c1"},
        {"action": "edit", "cell_id": "c2", "content": "print('rewritten')"},
    ],
    "cell_ids": ["c2"],
}


@pytest.mark.rules([ASK_EDIT_REPORTS])
async def test_a_run_with_ops_asks_under_an_edit_rule_and_shows_its_diff(
    http: Any, agent: Any, jp_root_dir: Path
) -> None:
    path = reports_notebook(jp_root_dir)
    bot = await agent()
    plain = await bot("POST", "api/agent/notebooks/reports/nb.ipynb/run", {"all": True})
    assert plain[0] == 200, plain  # a run without ops edits nothing: not asked
    body = {**RUN_WITH_OPS, "approval_wait": 0}
    status, pending, _ = await bot("POST", "api/agent/notebooks/reports/nb.ipynb/run", body)
    assert status == 202 and pending["approval_id"], pending
    assert [c.id for c in nbformat.read(str(path), as_version=4).cells] == ["c1", "c2"]  # not yet
    shown = (await http("GET", f"api/agent/approvals/{pending['approval_id']}"))[1]
    assert shown["details"]["actions"] == ["execute", "edit"], shown["details"]
    diffs = {c["id"]: c for c in shown["details"]["edit"]["cells"]}
    assert "-x = 6" in diffs["c1"]["diff"] and "+print('rewritten')" in diffs["c2"]["diff"], diffs
    assert [c["source"] for c in shown["details"]["cells"]] == ["print('rewritten')"]
    await approve(http, pending["approval_id"])
    status, run, _ = await bot("GET", f"api/agent/runs/{pending['run_id']}?wait=60")
    assert status == 200 and run["state"] == "complete", run
    assert run["result"]["cells"][0]["output"] == "rewritten\n", run
    assert [c.id for c in nbformat.read(str(path), as_version=4).cells] == ["c2"]


@pytest.mark.rules([{**ASK_EDIT_REPORTS, "decision": "deny"}])
async def test_a_run_with_ops_is_refused_under_an_edit_deny_rule(
    http: Any, agent: Any, jp_root_dir: Path
) -> None:
    path = reports_notebook(jp_root_dir)
    before = path.read_bytes()
    bot = await agent()
    status, answer, _ = await bot("POST", "api/agent/notebooks/reports/nb.ipynb/run", RUN_WITH_OPS)
    assert status == 403 and answer["reason"] == "approval_denied" and "'edit'" in answer["message"], answer
    assert path.read_bytes() == before


@pytest.mark.rules([])
async def test_a_token_asking_both_raises_one_request_for_a_run_with_ops(
    http: Any, jp_root_dir: Path
) -> None:
    reports_notebook(jp_root_dir)
    token = {"name": "careful", "scopes": ["read", "edit", "execute"], "ask": ["execute", "edit"]}
    made = (await http("POST", "api/agent/tokens", token))[1]
    body = {**RUN_WITH_OPS, "approval_wait": 0}
    status, pending, _ = await http(
        "POST", "api/agent/notebooks/reports/nb.ipynb/run", body, token=made["token"]
    )
    assert status == 202, pending
    listing = (await http("GET", "api/agent/approvals"))[1]["pending"]
    assert [p["id"] for p in listing] == [pending["approval_id"]]
    assert listing[0]["details"]["actions"] == ["execute", "edit"]
    assert {c["id"] for c in listing[0]["details"]["edit"]["cells"]} == {"c1", "c2"}
    # An "approve for" grant of a plain run does not cover the edits of a later run with ops.
    plain = {"all": True, "approval_wait": 0}
    status, asked, _ = await http(
        "POST", "api/agent/notebooks/reports/nb.ipynb/run", plain, token=made["token"]
    )
    assert status == 202, asked
    grant = {"decision": "approve", "for_seconds": 600}
    assert (await http("POST", f"api/agent/approvals/{asked['approval_id']}", grant))[0] == 200
    status, again, _ = await http(
        "POST", "api/agent/notebooks/reports/nb.ipynb/run", body, token=made["token"]
    )
    assert status == 202 and again["approval_id"] not in (pending["approval_id"], asked["approval_id"]), again


# ------------------------------------------------------------------------------------------------- MCP


@pytest.mark.rules(ASK_EXECUTE, wait=0.3)
async def test_an_mcp_run_pending_then_approved_runs_only_the_approved_cells(
    http: Any, agent: Any, mcp_url: str, jp_root_dir: Path
) -> None:
    notebook(jp_root_dir)
    bot = await agent()
    async with legacy_mcp(mcp_url, bot.token) as session:
        result = await session.call_tool("notebook_run", {"path": "nb.ipynb", "all": True})
        assert not result.is_error and "waits for the person" in result.content[0].text, result
        run = result.structured_content
        await insert(bot, 2, SNEAK, "sneak")
        await approve(http, run["approval_id"])
        status = await session.call_tool("run_status", {"run_id": run["run_id"], "wait": 60})
        assert "sneak" in status.content[0].text, status
    assert not (jp_root_dir / "sneaked.txt").exists()


@pytest.mark.rules(ASK_EXECUTE, wait=0.2)
async def test_a_2026_retry_runs_only_the_approved_cells(
    http: Any, agent: Any, mcp_url: str, jp_root_dir: Path
) -> None:
    notebook(jp_root_dir)
    bot = await agent()

    async def insert_then_approve(_context: Any, params: Any) -> Any:
        await insert(bot, 0, SNEAK, "sneak")  # the agent's own edit while the person looks
        await approve(http, approval_id(params))
        return types.ElicitResult(action="accept")

    async with modern_mcp_opening_urls(mcp_url, bot.token, insert_then_approve) as client:
        result = await client.call_tool("notebook_run", {"path": "nb.ipynb", "cell_indices": [0]})
    assert result.is_error and "sneak" in result.content[0].text, result
    assert not (jp_root_dir / "sneaked.txt").exists()


@pytest.mark.rules([*ASK_EXECUTE, ASK_EDIT_REPORTS])
async def test_an_mcp_insert_and_run_asks_once_for_both_and_runs_once_approved(
    http: Any, agent: Any, mcp_url: str, jp_root_dir: Path
) -> None:
    path = reports_notebook(jp_root_dir)
    bot = await agent()
    ops = [{"action": "insert", "cell_index": 2, "content": "print('inserted ran')", "cell_id": "added"}]
    async with legacy_mcp(mcp_url, bot.token) as session:
        call = asyncio.ensure_future(
            session.call_tool("notebook_run", {"path": "reports/nb.ipynb", "ops": ops})
        )
        request = await pending_approval(http)
        assert request["details"]["actions"] == ["execute", "edit"], request["details"]
        assert "+print('inserted ran')" in request["details"]["edit"]["cells"][0]["diff"]
        await approve(http, request["id"])
        result = await call
    assert not result.is_error and "inserted ran" in result.content[0].text, result
    assert [c.id for c in nbformat.read(str(path), as_version=4).cells] == ["c1", "c2", "added"]
    assert len((await http("GET", "api/agent/approvals"))[1]["recent"]) == 1


def planned(cell_id: str | None, index: int, source: str, new: bool = False) -> dict[str, Any]:
    return {"id": cell_id, "index": index, "cell_type": "code", "source_hash": source, "new": new}


@pytest.mark.quick
def test_plans_compare_by_id_type_and_source_and_in_order() -> None:
    from jupyter_agent_tools.approvals.gate import changed_cells

    a, b = planned("a", 0, "h1"), planned("b", 1, "h2")
    assert changed_cells([a, b], [planned("a", 3, "h1"), planned("b", 4, "h2")]) == []  # moved together
    assert changed_cells([a, b], [planned("b", 0, "h2"), planned("a", 1, "h1")]) == ["b", "a"]  # reordered
    assert changed_cells([a], [planned("a", 0, "h9")]) == ["a"]  # its source changed
    assert changed_cells([a], [a, planned("c", 1, "h3")]) == ["c"]  # one more
    assert changed_cells([a], [a, planned("a", 1, "h1")]) == ["a"]  # a duplicated id, planned twice
    assert changed_cells([planned(None, 0, "h1")], [planned(None, 1, "h1")]) == ["@0", "@1"]  # no ids
    # a cell the ops insert has an id made from the notebook's hash: its place and source count
    assert changed_cells([planned("x", 2, "h1", True)], [planned("y", 2, "h1", True)]) == []
    assert changed_cells([planned("x", 2, "h1", True)], [planned("x", 1, "h1", True)]) == ["x"]


@pytest.mark.quick
def test_the_cli_shows_a_runs_ops_as_a_diff_then_the_cells_it_runs() -> None:
    from jupyter_agent_tools.cli.commands import approval_text

    shown = approval_text(
        {
            "id": 3,
            "agent": "agent:bot",
            "summary": "run 1 cell in r.ipynb after 2 edits",
            "action": "execute",
            "door": "http",
            "state": "pending",
            "details": {
                "actions": ["execute", "edit"],
                "edit": {
                    "summary": "deleted 1 cell, edited 1 cell",
                    "cells": [
                        {"id": "a", "what": ["deleted"], "diff": "-x = 6"},
                        {"id": "b", "what": ["edited"], "diff": "-y\n+print('rewritten')"},
                    ],
                },
                "cells": [{"id": "b", "index": 0, "source": "print('rewritten')"}],
            },
        }
    )
    assert "(execute and edit, via http)" in shown, shown
    assert shown.index("-x = 6") < shown.index("then runs:") < shown.index("--- cell b:\nprint('rewritten')")

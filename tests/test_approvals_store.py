"""The approvals store under a flood: bounded details, the list's previews, the file's byte cap, ids, the
agent's own history, a safe stop, and what the person is shown (eval settings, control characters).

The quick tests use ApprovalPolicy and ApprovalFile without a server; the route tests a real server.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest

from jupyter_agent_tools.approvals import records
from jupyter_agent_tools.approvals.actions import describe_eval
from jupyter_agent_tools.approvals.records import Approval, ApprovalFile
from jupyter_agent_tools.approvals.service import ApprovalPolicy
from jupyter_agent_tools.auth import AgentAuthorizer, AgentIdentityProvider
from jupyter_agent_tools.cli.commands import approval_text, approvals_text
from jupyter_agent_tools.errors import AgentToolsError, NotFound

KIB = 1024
MIB = 1024 * KIB


def policy(tmp_path: Path, **kwargs: Any) -> ApprovalPolicy:
    return ApprovalPolicy(db_path=str(tmp_path / "approvals.db"), **kwargs)


async def ask(gate: ApprovalPolicy, code: str = "1", agent: str = "agent:bot", **details: Any) -> Approval:
    return await gate.request(
        agent=agent,
        door="http",
        action="execute",
        path=None,
        summary="run 1 cell in session 's'",
        details={"cells": [{"code": code, "title": None}], **details},
    )


async def written(gate: ApprovalPolicy) -> None:
    """Until the worker wrote what was queued before."""
    await gate._run(lambda: None)


@pytest.mark.quick
async def test_a_large_request_keeps_what_fits_and_says_how_much_is_not_shown(tmp_path: Path) -> None:
    gate = policy(tmp_path, max_detail_bytes=64 * KIB)
    await gate.start()
    code = "print('shown')\n" + "#" * MIB + "\nprint('hidden at the end')"
    approval = await ask(gate, code)
    assert records.json_bytes(approval.details) <= 64 * KIB
    shown = approval.details["cells"][0]["code"]
    assert shown.startswith("print('shown')") and "hidden at the end" not in shown
    assert approval.truncated == len(code) - len(shown.split("\n… [truncated")[0])
    assert shown.endswith(f"[truncated: {approval.truncated} bytes not shown]")
    assert "not shown]" in approval.summary  # the notification and every list say it too
    assert approval.to_json()["truncated"] == approval.truncated
    small = await ask(gate, "x = 1")
    assert small.truncated == 0 and small.details["cells"][0]["code"] == "x = 1"
    await written(gate)
    gate.stop()
    again = policy(tmp_path, max_detail_bytes=64 * KIB)
    await again.start()
    assert (await again.get(approval.id)).truncated == approval.truncated  # kept across a restart
    again.stop()


@pytest.mark.quick
async def test_a_request_too_large_even_cut_is_refused_413_saying_to_split_it(tmp_path: Path) -> None:
    gate = policy(tmp_path, max_detail_bytes=4 * KIB)
    await gate.start()
    with pytest.raises(AgentToolsError, match="split it") as refused:
        await gate.request(
            agent="agent:bot",
            door="http",
            action="execute",
            path=None,
            summary="run 500 cells",
            details={"cells": [{"code": f"x{i} = {i}", "title": None} for i in range(500)]},
        )
    assert refused.value.status == 413
    assert gate.pending() == []
    gate.stop()


@pytest.mark.quick
@pytest.mark.parametrize(("name", "value"), [("max_detail_bytes", 100), ("max_bytes", 1000)])
def test_the_bounds_are_validated(tmp_path: Path, name: str, value: int) -> None:
    with pytest.raises(Exception, match=f"ApprovalPolicy.{name}"):
        policy(tmp_path, **{name: value})
    with pytest.raises(Exception, match="at least 8 times"):
        policy(tmp_path, max_detail_bytes=MIB, max_bytes=4 * MIB)


@pytest.mark.quick
async def test_the_list_shows_a_bounded_preview_and_the_request_in_full_is_one_get_away(
    tmp_path: Path,
) -> None:
    gate = policy(tmp_path)
    await gate.start()
    approval = await ask(gate, "a = 1\n" + "b" * 200 * KIB, cwd="/work")
    listed = approval.to_json(preview_only=True)
    assert listed["preview"] is True and records.json_bytes(listed) <= records.PREVIEW_BYTES + 1024
    code = listed["details"]["cells"][0]["code"]
    assert code.startswith("a = 1") and f"GET /api/agent/approvals/{approval.id} shows it in full" in code
    assert listed["details"]["cwd"] == "/work"
    assert approval.to_json()["details"]["cells"][0]["code"] == "a = 1\n" + "b" * 200 * KIB
    assert (await ask(gate, "x")).to_json(preview_only=True)["preview"] is False
    gate.stop()


@pytest.mark.quick
async def test_the_file_stays_within_max_bytes_pruning_decided_requests_never_pending_ones(
    tmp_path: Path,
) -> None:
    gate = policy(tmp_path, max_detail_bytes=64 * KIB, max_bytes=MIB, max_pending_per_agent=1000)
    await gate.start()
    kept = [await ask(gate, "p" * 60 * KIB) for _ in range(3)]
    for _ in range(40):  # 2.4 MB of decided requests through a 1 MiB file
        decided = await ask(gate, "d" * 60 * KIB)
        await gate.decide(decided.id, "deny", by="alice")
        await written(gate)
        assert gate._file.disk_bytes() <= MIB
    assert {a.id for a in kept} <= set(await gate._run(_ids, gate._file))
    with pytest.raises(NotFound):
        await gate.get(kept[-1].id + 1)  # the oldest decided one: pruned
    assert (await gate.get(decided.id)).state == "denied"  # the newest: kept
    gate.stop()


def _ids(file: ApprovalFile) -> list[int]:
    return [row[0] for row in file._db().execute("SELECT id FROM approvals")]


@pytest.mark.quick
async def test_a_file_grown_before_the_cap_is_pruned_and_shrunk_at_start(tmp_path: Path) -> None:
    path = str(tmp_path / "approvals.db")
    old = ApprovalFile(path)  # no bound, no incremental vacuum: as the file of an older version
    for i in range(1, 41):
        row = Approval(
            i, "agent:bot", "http", "execute", None, "run", {"code": "x" * 256 * KIB}, 0, 0, "denied"
        ).row()
        marks = ", ".join("?" * len(row))
        old._db().execute(f"INSERT INTO approvals ({records.COLUMNS}) VALUES ({marks})", row)
    old.close()
    assert os.path.getsize(path) > 10 * MIB
    gate = ApprovalPolicy(db_path=path, max_detail_bytes=64 * KIB, max_bytes=2 * MIB)
    await gate.start()
    assert gate._file.disk_bytes() <= 2 * MIB
    assert (await gate.get(40)).state == "denied"  # the newest are kept
    assert (await ask(gate)).id == 41  # ids are still never reused
    gate.stop()


@pytest.mark.quick
async def test_an_agents_own_decisions_are_listed_however_many_others_were_decided(tmp_path: Path) -> None:
    gate = policy(tmp_path, max_pending_per_agent=1000)
    await gate.start()
    mine = await ask(gate)
    await gate.decide(mine.id, "approve", by="alice")
    for _ in range(120):
        other = await ask(gate, agent="agent:other")
        await gate.decide(other.id, "deny", by="alice")
    await written(gate)
    assert [a.id for a in await gate.recent("agent:bot")] == [mine.id]
    assert len(await gate.recent()) == 100  # the person: everyone's latest
    gate.stop()


@pytest.mark.quick
async def test_stop_from_a_worker_thread_wakes_the_waiters_on_the_event_loop(tmp_path: Path) -> None:
    loop = asyncio.get_running_loop()
    loop.set_debug(True)  # asyncio then raises when its objects are touched from another thread
    try:
        gate = policy(tmp_path)
        await gate.start()
        approval = await ask(gate)
        waiter = asyncio.ensure_future(gate.wait_for(approval, 30))
        await asyncio.sleep(0.01)
        await asyncio.to_thread(gate.stop)  # as the server stops its services
        await asyncio.wait_for(waiter, 5)
        assert gate.pending() == []
    finally:
        loop.set_debug(False)


@pytest.mark.quick
async def test_an_eval_request_shows_where_and_how_it_runs() -> None:
    body = {
        "cells": [{"code": "import os"}],
        "session": "s",
        "mode": "per-call",
        "reset": True,
        "kernel_name": "python3",
        "cwd": "/srv/data",
        "env": {"AWS_PROFILE": "prod"},
    }
    summary, details = await describe_eval(body)
    assert summary == "run 1 cell in session 's'"
    assert {k: details[k] for k in ("mode", "reset", "kernel_name", "cwd", "env")} == {
        "mode": "per-call",
        "reset": True,
        "kernel_name": "python3",
        "cwd": "/srv/data",
        "env": {"AWS_PROFILE": "prod"},
    }
    shown = approval_text(_answer(details))
    assert 'cwd: "/srv/data"' in shown and '"AWS_PROFILE": "prod"' in shown and "reset: true" in shown


def _answer(details: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "id": 3,
        "agent": "agent:bot",
        "door": "http",
        "action": "execute",
        "summary": "run 1 cell in session 's'",
        "state": "pending",
        "details": details,
        **extra,
    }


@pytest.mark.quick
def test_the_cli_shows_control_and_invisible_characters_as_escapes() -> None:
    code = "safe()\rrm_all()\n\x1b[2K\x1b]0;title\x07if user\u202e\u2066 == admin\u2069\u202c:\u200b\tgo()"
    shown = approval_text(_answer({"cells": [{"code": code}]}, truncated=1234))
    for raw in ("\r", "\x1b", "\x07", "\u202e", "\u2066", "\u2069", "\u202c", "\u200b"):
        assert raw not in shown
    for escaped in ("safe()\\rrm_all()", "\\x1b[2K", "\\u0007", "\\u202e", "\\u2066", "\\u200b"):
        assert escaped in shown
    assert "\n" in shown and "\tgo()" in shown  # newlines and tabs stay as they are
    assert "1234 bytes of what it would do are not shown" in shown
    listed = approvals_text({"pending": [{**_answer({}), "summary": "run\rhidden", "expires": "soon"}]})
    assert "run\\rhidden" in listed and "\r" not in listed


# -- through a real server -------------------------------------------------------------------------


@pytest.fixture
def jp_server_config() -> dict[str, Any]:
    return {
        "ServerApp": {
            "jpserver_extensions": {"jupyter_agent_tools": True},
            "identity_provider_class": AgentIdentityProvider,
            "authorizer_class": AgentAuthorizer,
        },
        "KernelPool": {"size": 0},
        "ApprovalPolicy": {"max_pending_per_agent": 1000},
    }


@pytest.fixture
def http(http_server_client: Any, jp_base_url: str, jp_serverapp: Any) -> Any:
    """``http(method, url, body=None, token=<the server's: the person>)`` -> (status, JSON)."""

    async def call(method: str, url: str, body: Any = None, token: str | None = None) -> tuple[int, Any]:
        response = await http_server_client.fetch(
            jp_base_url + url,
            method=method,
            body=json.dumps(body) if body is not None else None,
            headers={"Authorization": f"token {token or jp_serverapp.identity_provider.token}"},
            raise_error=False,
        )
        return response.code, json.loads(response.body) if response.body else None

    return call


def the_policy(serverapp: Any) -> ApprovalPolicy:
    gate: ApprovalPolicy = serverapp.web_app.settings["jupyter_agent_tools_approvals"]
    return gate


@pytest.mark.parametrize("raw", ["%C2%B2", "%EF%BC%91", "%D9%A1"])
async def test_only_ascii_digits_are_approval_ids(http: Any, jp_serverapp: Any, raw: str) -> None:
    await ask(the_policy(jp_serverapp))  # approval 1 exists: a fullwidth or Arabic-Indic 1 must not read it
    for method in ("GET", "POST"):
        status, answer = await http(method, f"api/agent/approvals/{raw}", {} if method == "POST" else None)
        assert status == 400, (method, raw, answer)
        assert "An approval id is a number" in answer["message"]
    status, answer = await http("GET", "api/agent/approvals/1")
    assert status == 200 and answer["id"] == 1


async def test_the_list_carries_previews_and_an_agent_sees_its_own_history(
    http: Any, jp_serverapp: Any
) -> None:
    gate = the_policy(jp_serverapp)
    status, made = await http("POST", "api/agent/tokens", {"name": "bot", "scopes": ["read", "execute"]})
    assert status == 201, made
    decided = await ask(gate, agent="agent:bot")
    await gate.decide(decided.id, "deny", by="alice")
    for _ in range(110):  # more than the list's 100 latest decisions, all another agent's
        other = await ask(gate, agent="agent:other")
        await gate.decide(other.id, "deny", by="alice")
    big = await ask(gate, "x = 1\n" + "#" * 3 * MIB, agent="agent:bot")
    await written(gate)

    status, listing = await http("GET", "api/agent/approvals", token=made["token"])
    assert status == 200
    assert [a["id"] for a in listing["recent"]] == [decided.id]
    [pending] = listing["pending"]
    assert pending["id"] == big.id and pending["preview"] is True
    assert records.json_bytes(pending) <= records.PREVIEW_BYTES + 2048
    status, full = await http("GET", f"api/agent/approvals/{big.id}")
    assert status == 200 and full["truncated"] > 2 * MIB
    assert records.json_bytes(full["details"]) <= gate.max_detail_bytes
    assert full["details"]["cells"][0]["code"].endswith(f"[truncated: {full['truncated']} bytes not shown]")
    status, everyone = await http("GET", "api/agent/approvals")
    assert len(everyone["recent"]) == 100 and decided.id not in [a["id"] for a in everyone["recent"]]

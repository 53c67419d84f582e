"""The approval gate without a server: rules, waiting, deciding, expiry, restart."""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import stat
from pathlib import Path
from typing import Any

import pytest
from jupyter_events import EventLogger
from traitlets import TraitError

from jupyter_agent_tools.approvals.policy import RuleError, decide, parse_rules
from jupyter_agent_tools.approvals.service import ApprovalPolicy, Forbidden, TooManyPending
from jupyter_agent_tools.audit import Audit
from jupyter_agent_tools.errors import AgentToolsError, Conflict, NotFound
from jupyter_agent_tools.pytest_plugin import EventLines

pytestmark = pytest.mark.quick  # the fast tier: no server, no kernel


def test_nothing_matched_is_allowed_and_deny_beats_ask_beats_allow() -> None:
    rules = parse_rules(
        [
            {"who": "agent:*", "actions": ["execute"], "decision": "ask"},
            {"who": "agent:ci-bot", "actions": ["execute"], "paths": ["secret/**"], "decision": "deny"},
            {"who": "*", "actions": ["edit"], "paths": ["free/**"], "decision": "allow"},
        ]
    )
    assert decide(rules, "agent:ci-bot", "read", "a.ipynb") == "allow"
    assert decide(rules, "agent:ci-bot", "execute", "a.ipynb") == "ask"
    assert decide(rules, "agent:ci-bot", "execute", "secret/x.ipynb") == "deny"
    assert decide(rules, "agent:other", "execute", "secret/x.ipynb") == "ask"
    assert decide(rules, "alice", "execute", "a.ipynb") == "allow"  # not an agent
    assert decide(rules, "agent:ci-bot", "execute", None) == "ask"  # eval in a session: no path
    assert decide(rules, "agent:x", "edit", "free/a.ipynb", frozenset({"edit"})) == "ask"  # the token asks


@pytest.mark.parametrize(
    ("rule", "words"),
    [
        ({"who": "bob", "actions": ["edit"], "decision": "ask"}, "'who'"),
        ({"who": "*", "actions": ["write"], "decision": "ask"}, "unknown action 'write'"),
        ({"who": "*", "actions": [], "decision": "ask"}, "non-empty"),
        ({"who": "*", "actions": ["edit"], "decision": "maybe"}, "'decision'"),
        ({"who": "*", "actions": ["edit"], "decision": "ask", "paths": "x"}, "'paths'"),
        ({"who": "*", "actions": ["edit"], "decision": "ask", "when": 1}, "unknown field 'when'"),
    ],
)
def test_a_bad_rule_is_refused_saying_what_to_fix(rule: dict[str, Any], words: str) -> None:
    with pytest.raises(RuleError, match=words):
        parse_rules([rule])
    with pytest.raises(TraitError, match=r"ApprovalPolicy\.rules: rule 0"):
        ApprovalPolicy(rules=[rule])


def policy(tmp_path: Path, **kwargs: Any) -> ApprovalPolicy:
    return ApprovalPolicy(db_path=str(tmp_path / "approvals.db"), **kwargs)


async def ask(gate: ApprovalPolicy, agent: str = "agent:bot", path: str | None = "a.ipynb") -> Any:
    return await gate.request(
        agent=agent, door="http", action="execute", path=path, summary="run 1 cell", details={"cells": []}
    )


async def test_a_waiting_request_wakes_on_the_decision_not_by_polling(tmp_path: Path) -> None:
    gate = policy(tmp_path)
    await gate.start()
    approval = await ask(gate)
    assert approval.state == "pending" and [a.id for a in gate.pending()] == [approval.id]
    waiter = asyncio.ensure_future(gate.wait_for(approval, 30))
    await asyncio.sleep(0.05)
    assert not waiter.done()
    await gate.decide(approval.id, "approve", by="alice")
    for _ in range(5):  # a few turns of the event loop, no clock: woken by the decision, not a poll
        await asyncio.sleep(0)
    assert waiter.done()
    decided = waiter.result()
    assert decided.state == "approved" and decided.decided_by == "alice"
    assert gate.pending() == []
    gate.stop()


async def test_deciding_twice_unknown_ids_and_agents_are_refused(tmp_path: Path) -> None:
    gate = policy(tmp_path)
    await gate.start()
    approval = await ask(gate)
    with pytest.raises(Forbidden, match="only a person decides"):
        await gate.decide(approval.id, "approve", by="agent:bot")
    assert approval.state == "pending"
    await gate.decide(approval.id, "deny", by="alice", reason="not now")
    with pytest.raises(Conflict, match="already denied"):
        await gate.decide(approval.id, "approve", by="alice")
    with pytest.raises(NotFound):
        await gate.decide(999, "approve", by="alice")
    assert approval.reason == "not now"
    gate.stop()


async def test_an_undecided_request_expires_as_denied(tmp_path: Path) -> None:
    gate = policy(tmp_path, timeout=0.2)
    await gate.start()
    approval = await ask(gate)
    decided = await gate.wait_for(approval, 5)
    assert decided.state == "expired"
    with pytest.raises(Conflict, match="already expired"):
        await gate.decide(approval.id, "approve", by="alice")
    gate.stop()


async def test_a_withdrawn_request_wakes_its_waiter_leaves_the_list_and_cannot_be_decided(
    tmp_path: Path,
) -> None:
    logger = EventLogger()
    told = EventLines()
    logger.register_handler(told)
    audit = Audit(event_logger=logger)
    audit.register_schemas()  # the event is checked against the shipped schema
    gate = policy(tmp_path, audit=audit)
    await gate.start()
    approval, other = await ask(gate), await ask(gate)
    waiter = asyncio.ensure_future(gate.wait_for(approval, 30))
    assert gate.withdraw(approval, "the run was cancelled")
    for _ in range(5):  # woken by the withdrawal, no clock
        await asyncio.sleep(0)
    assert waiter.done() and approval.state == "withdrawn" and approval.reason == "the run was cancelled"
    assert [a.id for a in gate.pending()] == [other.id]
    with pytest.raises(Conflict, match=f"Approval {approval.id} is already withdrawn"):
        await gate.decide(approval.id, "approve", by="alice")
    assert not gate.withdraw(approval, "again")  # ended once
    await gate.decide(other.id, "deny", by="alice")
    assert not gate.withdraw(other, "too late") and other.state == "denied"
    events = [json.loads(line) for line in told.lines]
    assert [(e["event"], e["approval_id"]) for e in events][2:] == [
        ("withdrawn", approval.id),
        ("denied", other.id),
    ], events
    assert events[2]["reason"] == "the run was cancelled"
    await asyncio.sleep(0.1)  # the worker writes
    gate.stop()
    again = policy(tmp_path)
    await again.start()
    assert (await again.get(approval.id)).state == "withdrawn"  # not expired by the restart
    again.stop()


async def test_approve_for_a_while_covers_the_same_agent_action_and_notebook_only(tmp_path: Path) -> None:
    gate = policy(tmp_path)
    await gate.start()
    first = await ask(gate)
    with pytest.raises(AgentToolsError, match="for_seconds"):
        await gate.decide(first.id, "approve", by="alice", for_seconds=10**9)
    await gate.decide(first.id, "approve", by="alice", for_seconds=600)
    again = await ask(gate)
    assert again.state == "approved" and again.id != first.id and "alice" in (again.decided_by or "")
    assert (await ask(gate, path="other.ipynb")).state == "pending"
    assert (await ask(gate, agent="agent:other")).state == "pending"
    gate.stop()


async def test_an_agent_may_have_only_so_many_requests_waiting(tmp_path: Path) -> None:
    gate = policy(tmp_path, max_pending_per_agent=2)
    await gate.start()
    await ask(gate), await ask(gate)
    with pytest.raises(TooManyPending) as refused:
        await ask(gate)
    assert refused.value.status == 429
    assert (await ask(gate, agent="agent:other")).state == "pending"
    gate.stop()


async def test_a_restart_expires_what_was_pending_and_keeps_the_history(tmp_path: Path) -> None:
    gate = policy(tmp_path)
    await gate.start()
    decided = await ask(gate)
    await gate.decide(decided.id, "approve", by="alice")
    left = await ask(gate)
    await asyncio.sleep(0.1)  # the worker writes
    gate.stop()
    again = policy(tmp_path)
    await again.start()
    assert again.pending() == []
    assert (await again.get(left.id)).state == "expired"
    assert (await again.get(decided.id)).decided_by == "alice"
    assert (await ask(again)).id > left.id  # ids are never reused
    assert stat.S_IMODE(os.stat(tmp_path / "approvals.db").st_mode) == 0o600
    with sqlite3.connect(tmp_path / "approvals.db") as conn:
        states = dict(conn.execute("SELECT id, state FROM approvals").fetchall())
    assert states[left.id] == "expired" and states[decided.id] == "approved"
    again.stop()


def test_a_token_file_of_schema_1_opens_and_its_tokens_ask_for_nothing(tmp_path: Path) -> None:
    from jupyter_agent_tools.auth.store import TokenStore

    path = tmp_path / "tokens.db"
    with sqlite3.connect(path) as conn:  # the file as a server before the approval gate left it
        conn.executescript(
            "CREATE TABLE agent_tokens (token_hash TEXT PRIMARY KEY, name TEXT NOT NULL, "
            "scopes TEXT NOT NULL, paths TEXT NOT NULL, created REAL NOT NULL, expires REAL, "
            "last_used REAL, revoked REAL);"
            "INSERT INTO agent_tokens VALUES ('h', 'old', 'read', '[]', 1.0, NULL, NULL, NULL);"
            "PRAGMA user_version=1;"
        )
    store = TokenStore(str(path))
    try:
        (old,) = store.tokens()
        assert old.name == "old" and old.ask == frozenset()
        _token, made = store.create("new", ["execute"], ask=["execute", "edit"])
        assert made.ask == {"execute", "edit"} and made.public(store.now())["ask"] == ["edit", "execute"]
        with pytest.raises(AgentToolsError, match="'ask' takes edit, execute, kernel"):
            store.create("bad", ["read"], ask=["write"])
    finally:
        store.close()

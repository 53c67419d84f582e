"""Eval sessions are per identity (issue 41): a session name, ``default`` included, is its owner's. Two
identities naming the same session get two kernels; an agent never reaches another's session; eviction at
``max_sessions`` takes the evicting identity's own idle session first and another's only while that one
holds more than its fair share.

The quick tier drives the eval stack over a fake kernel manager (tests/fake_stack.py), acting as each
identity the way the handlers set it (``set_user``, ``set_agent``); one test at the end runs a real server
with real kernels, two agent tokens and the server's own token, through HTTP and MCP.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest
import test_agent_tokens as tokens
from fake_stack import until

from jupyter_agent_tools.audit import set_user
from jupyter_agent_tools.auth.context import set_agent
from jupyter_agent_tools.errors import Conflict, NotFound, Unavailable
from jupyter_agent_tools.testing.fake_kernel import hangs, replies

T = TypeVar("T")

ALICE, BOB, CAROL = "agent:alice", "agent:bob", "agent:carol"
PERSON = "token-0123abcd"  # the server's own token, as acting_username names it


async def acting(user: str, work: Callable[[], Awaitable[T]], *, agent: bool = True) -> T:
    """``work()`` as ``user`` (an agent token's, or the person's with ``agent=False``), in its own task
    as the server serves each request."""

    async def run() -> T:
        set_user(user)
        set_agent(agent)
        return await work()

    return await asyncio.ensure_future(run())


def script(code: str) -> list[tuple[str, str, dict[str, Any]]]:
    """Each cell prints ``ran <code>``; a ``hold`` cell runs until interrupted."""
    return hangs(code) if code == "hold" else replies(stdout=f"ran {code}\n")


def names(stack: Any) -> set[tuple[str | None, str]]:
    return {(s.owner, s.name) for s in stack.sessions.sessions.values()}


# ------------------------------------------------------------------------------------------ quick tier


@pytest.mark.quick
async def test_each_identity_has_its_own_default_session(stacks) -> None:
    stack = stacks(script)
    answers = {}
    for user, agent in ((ALICE, True), (BOB, True), (PERSON, False)):
        plain = {"cells": [{"code": f"x = {user!r}"}]}  # no "session": "default"
        answers[user] = await acting(user, lambda plain=plain: stack.service.run(plain), agent=agent)
    assert {a["session"] for a in answers.values()} == {"default"}  # clients still say "default"
    kernels = {user: a["kernel_id"] for user, a in answers.items()}
    assert len(set(kernels.values())) == 3, kernels  # three kernels: nobody runs in another's
    assert names(stack) == {(ALICE, "default"), (BOB, "default"), (PERSON, "default")}
    for user, agent in ((BOB, True), (PERSON, False), (ALICE, True)):  # each goes back to its own
        again = await acting(user, lambda: stack.service.run({"cells": [{"code": "x"}]}), agent=agent)
        assert again["kernel_id"] == kernels[user] and again["session_lost"] is None, (user, again)
    for user, kernel in kernels.items():  # each kernel ran its owner's code, and nobody else's
        ran = [c for conn in stack.manager.connections if conn.kernel_id == kernel for c in conn.executed]
        assert [c for c in ran if not c.startswith("def __agent_tools_init")] == [f"x = {user!r}", "x"]
    # their artifact directories differ too (a session's artifacts go with it, not with a namesake's)
    keys = {s.key for s in stack.sessions.sessions.values()}
    assert len(keys) == 3 and all(k.startswith("default.") for k in keys), keys


@pytest.mark.quick
async def test_an_agent_cannot_see_or_touch_another_agents_session(stacks) -> None:
    stack = stacks(script)
    service = stack.service
    await acting(ALICE, lambda: stack.eval("secret = 1", session="shared"))
    await acting(BOB, lambda: stack.eval("mine = 1", session="shared"))
    for owner in (None, ALICE):
        for work in (
            lambda owner=owner: service.delete_session("alice-only", owner),
            lambda owner=owner: service.interrupt_session("alice-only", owner),
        ):
            await acting(ALICE, lambda: stack.eval("1", session="alice-only"))
            with pytest.raises(NotFound):
                await acting(BOB, work)
    listed = await acting(BOB, lambda: asyncio.sleep(0, service.list_sessions()))
    assert [(s["owner"], s["name"]) for s in listed] == [(BOB, "shared")], listed
    # bob deleting "shared" deletes his own; alice's namesake lives on
    await acting(BOB, lambda: service.delete_session("shared"))
    assert names(stack) == {(ALICE, "shared"), (ALICE, "alice-only")}
    alice = await acting(ALICE, lambda: stack.eval("secret", session="shared"))
    assert alice["session_lost"] is None and "deleted" not in alice["output"], alice
    bob = await acting(BOB, lambda: stack.eval("mine", session="shared"))
    assert bob["session_lost"]["reason"] == "deleted"  # told to its owner, and only to it

    # the person sees all; with two namesakes it must say whose it means
    person_listing = await acting(PERSON, lambda: asyncio.sleep(0, service.list_sessions()), agent=False)
    assert {(s["owner"], s["name"]) for s in person_listing} == names(stack)
    with pytest.raises(Conflict, match="owner="):
        await acting(PERSON, lambda: service.delete_session("shared"), agent=False)
    await acting(PERSON, lambda: service.interrupt_session("alice-only"), agent=False)  # the only one
    await acting(PERSON, lambda: service.delete_session("shared", BOB), agent=False)
    assert names(stack) == {(ALICE, "shared"), (ALICE, "alice-only")}


@pytest.mark.quick
async def test_eviction_takes_the_evicting_identitys_own_idle_session_first(stacks) -> None:
    stack = stacks(script, max_sessions=4)
    for name in ("b1", "b2"):  # bob's are the least recently used of all
        await acting(BOB, lambda name=name: stack.eval("1", session=name))
    for name in ("a1", "a2"):
        await acting(ALICE, lambda name=name: stack.eval("1", session=name))
    await acting(ALICE, lambda: stack.eval("1", session="a3"))  # the cap: alice's own a1 goes, not b1
    assert names(stack) == {(BOB, "b1"), (BOB, "b2"), (ALICE, "a2"), (ALICE, "a3")}
    lost = await acting(ALICE, lambda: stack.eval("1", session="a1"))  # a2 goes now
    assert lost["session_lost"]["reason"] == "evicted" and "session 'a3'" in lost["output"]
    assert names(stack) == {(BOB, "b1"), (BOB, "b2"), (ALICE, "a3"), (ALICE, "a1")}


@pytest.mark.quick
async def test_another_identitys_session_goes_only_past_its_fair_share(stacks) -> None:
    stack = stacks(script, max_sessions=4)
    for name in ("a1", "a2", "a3", "a4"):  # alice alone: the whole cap is hers
        await acting(ALICE, lambda name=name: stack.eval("1", session=name))
    await acting(BOB, lambda: stack.eval("1", session="b1"))  # alice holds 4 > 2 (4 / 2 identities)
    await acting(BOB, lambda: stack.eval("1", session="b2"))  # 3 > 2
    await acting(BOB, lambda: stack.eval("1", session="b3"))  # alice holds her share: bob's own b1 goes
    assert names(stack) == {(ALICE, "a3"), (ALICE, "a4"), (BOB, "b2"), (BOB, "b3")}
    assert stack.sessions.fair_share(BOB) == stack.sessions.fair_share(ALICE) == 2
    told = await acting(ALICE, lambda: stack.eval("1", session="a1"))  # her own a3 goes for it
    assert told["session_lost"]["reason"] == "evicted", told
    assert "another identity's session" in told["output"] and "b1" not in told["output"], told
    assert names(stack) == {(ALICE, "a4"), (ALICE, "a1"), (BOB, "b2"), (BOB, "b3")}


@pytest.mark.quick
async def test_nothing_to_evict_answers_503_saying_what_to_do(stacks) -> None:
    stack = stacks(script, max_sessions=2)
    await acting(ALICE, lambda: stack.eval("1", session="a"))
    await acting(BOB, lambda: stack.eval("1", session="b"))
    # carol: a share of 1 (2 / 3 identities, at least 1); alice and bob hold 1 each, within theirs
    with pytest.raises(Unavailable) as refused:
        await acting(CAROL, lambda: stack.eval("1", session="c"))
    error = refused.value
    assert error.status == 503 and error.retry_after and "fair share" in error.message, error.message
    assert "retry later" in error.message and "max_sessions" in error.message
    assert error.extra == {"max_sessions": 2, "fair_share": 1, "held": 0}
    assert names(stack) == {(ALICE, "a"), (BOB, "b")}  # nobody's state went
    # alice's one session is busy and the others hold their share: what alice can do is hers to do
    running = asyncio.ensure_future(acting(ALICE, lambda: stack.eval("hold", session="a", timeout=30)))
    await until(lambda: stack.sessions.find("a", ALICE).busy, "alice's call running")
    with pytest.raises(Unavailable, match=r"you hold 1 .*your fair share: 1.*DELETE /api/agent/sessions"):
        await acting(ALICE, lambda: stack.eval("1", session="a2"))
    await acting(ALICE, lambda: stack.service.interrupt_session("a"))
    assert (await running)["cancelled"] is True


# ------------------------------------------------------------------------------ real server, real kernels

files, http, make_token, mcp_session = tokens.files, tokens.http, tokens.make_token, tokens.mcp_session


@pytest.fixture
def jp_server_config() -> dict[str, Any]:
    return {  # the server of test_agent_tokens (agent tokens on), room for three identities' sessions
        "ServerApp": {"jpserver_extensions": {"jupyter_agent_tools": True}, **tokens.AGENT_CLASSES},
        "KernelPool": {"size": 0},
        "EvalSessionManager": {"max_sessions": 4},
    }


@pytest.mark.timeout(300)
async def test_two_agents_and_the_person_each_have_their_own_default(
    http, make_token, files, jp_http_port, jp_base_url
) -> None:
    alice = await make_token("alice", ["read", "execute"])
    bob = await make_token("bob", ["read", "execute"])

    async def run(token: str | None, code: str) -> dict[str, Any]:
        status, answer, _ = await http("POST", "api/agent/eval", {"cells": [{"code": code}]}, token=token)
        assert status == 200, answer
        return dict(answer)

    for token, who in ((alice, "alice"), (bob, "bob"), (None, "person")):  # None: the server's token
        assert (await run(token, f"WHO = {who!r}"))["session"] == "default"
    for token, who in ((bob, "bob"), (None, "person"), (alice, "alice")):
        assert (await run(token, "print(WHO)"))["output"] == f"{who}\n"
    status, listing, _ = await http("GET", "api/agent/sessions", token=alice)
    assert [(s["name"], s["owner"]) for s in listing["sessions"]] == [("default", "agent:alice")]
    status, listing, _ = await http("GET", "api/agent/sessions")
    owners = sorted(s["owner"] for s in listing["sessions"] if s["name"] == "default")
    assert owners == ["agent:alice", "agent:bob", "the server's owner"], owners
    # bob's delete ends bob's default; alice's and the person's keep their state
    status, _, _ = await http("DELETE", "api/agent/sessions/default", token=bob)
    assert status == 204
    assert (await run(alice, "print(WHO)"))["output"] == "alice\n"
    assert (await run(None, "print(WHO)"))["output"] == "person\n"
    # the person names an agent's namesake by its owner; an agent cannot name another's
    status, answer, _ = await http("DELETE", "api/agent/sessions/default?owner=agent:alice", token=bob)
    assert status == 404 and answer["message"] == "Session not found: default", answer
    status, _, _ = await http("POST", "api/agent/sessions/default/interrupt?owner=agent:alice")
    assert status == 200
    # a detached run is its starter's: alice's runs in alice's default
    body = {"cells": [{"code": "print(WHO)"}], "detach": True}
    status, started, _ = await http("POST", "api/agent/eval", body, token=alice)
    assert status == 202 and started["target"] == "default", started
    status, run, _ = await http("GET", f"api/agent/runs/{started['run_id']}?wait=60", token=alice)
    assert status == 200 and run["result"]["output"] == "alice\n", run
    # MCP names the same sessions: bob's default is new, alice's keeps her state
    url = f"http://127.0.0.1:{jp_http_port}{jp_base_url}api/agent/mcp"
    async with mcp_session(url, bob) as session:
        ran = await session.call_tool("eval", {"cells": [{"code": "print(WHO)"}]})
        assert "NameError" in json.dumps(ran.structured_content), ran
        refused = await session.call_tool("session_delete", {"name": "default", "owner": "agent:alice"})
        assert refused.is_error and "not found" in refused.content[0].text.lower(), refused
    async with mcp_session(url, alice) as session:
        ran = await session.call_tool("eval", {"cells": [{"code": "print(WHO)"}]})
        assert "alice" in ran.content[0].text, ran

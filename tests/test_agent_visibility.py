"""What an agent can see of others (issue 35: H4, M1, M2, M5, lists): a real server in process with the
two documented lines, real kernels, tokens made through ``/api/agent/tokens``.

Another agent's session, artifact or event, and any name outside an agent's paths, appear nowhere the
agent can read: its routes answer 404 and its lists leave them out. The server's own token (and a person)
still sees and manages everything.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import test_agent_tokens as tokens

# the server (agent tokens on), its files and token maker, as in test_agent_tokens
jp_server_config, files, http, make_token = (
    tokens.jp_server_config,
    tokens.files,
    tokens.http,
    tokens.make_token,
)
mcp_session = tokens.mcp_session

pytestmark = pytest.mark.timeout(300)

BIG = "print('x' * 200_000)"  # more than eval's visible output: the rest goes to an artifact


def _mcp_url(port: int, base: str) -> str:
    return f"http://127.0.0.1:{port}{base}api/agent/mcp"


async def _eval(http: Any, token: str | None, body: dict[str, Any]) -> tuple[int, Any]:
    status, answer, _ = await http("POST", "api/agent/eval", body, token=token)
    return status, answer


# --------------------------------------------------------------------------------------- H4: artifacts


async def test_an_agent_reads_only_its_own_artifacts_and_those_of_its_notebooks(
    http, make_token, files, jp_http_port, jp_base_url
) -> None:
    alice = await make_token("alice", ["read", "execute"])
    bob = await make_token("bob", ["read", "execute"])
    reporter = await make_token("reporter", ["read", "execute"], ["reports/**"])
    outsider = await make_token("outsider", ["read", "execute"], ["other/**"])
    status, answer = await _eval(http, alice, {"cells": [{"code": BIG}], "session": "alice-s"})
    assert status == 200, answer
    own = answer["cells"][0]["artifact_id"]
    status, answer = await _eval(http, alice, {"cells": [{"code": BIG}], "mode": "per-call"})
    per_call = answer["cells"][0]["artifact_id"]
    status, answer = await _eval(http, None, {"cells": [{"code": BIG}], "notebook": "reports/a.ipynb"})
    assert status == 200, answer
    of_notebook = answer["cells"][0]["artifact_id"]

    async def read(artifact: str, token: str | None) -> tuple[int, Any]:
        status, body, _ = await http("GET", f"api/agent/artifacts/{artifact}", token=token)
        return status, body

    for artifact in (own, per_call):
        assert (await read(artifact, alice))[0] == 200
        assert (await read(artifact, None))[0] == 200  # the server's own token reads everything
        for token in (bob, reporter):
            status, body = await read(artifact, token)
            assert status == 404 and body["message"] == f"Artifact not found: {artifact}", status
    assert (await read(of_notebook, reporter))[0] == 200  # a notebook inside its paths
    assert (await read(of_notebook, bob))[0] == 200  # no paths: every notebook
    status, body = await read(of_notebook, outsider)
    assert status == 404 and "reports" not in json.dumps(body), status
    # a byte range of someone else's artifact is no way around it
    status, _, _ = await http("GET", f"api/agent/artifacts/{own}", token=bob, headers={"Range": "bytes=0-10"})
    assert status == 404
    async with mcp_session(_mcp_url(jp_http_port, jp_base_url), bob) as session:
        refused = await session.call_tool("artifact_read", {"id": own})
        assert refused.is_error and "not found" in refused.content[0].text.lower(), refused
        assert "xxxx" not in refused.content[0].text
        allowed = await session.call_tool("artifact_read", {"id": of_notebook, "limit": 100})
        assert not allowed.is_error and "xxxx" in allowed.content[0].text
    async with mcp_session(_mcp_url(jp_http_port, jp_base_url), alice) as session:
        mine = await session.call_tool("artifact_read", {"id": own, "limit": 100})
        assert not mine.is_error and "xxxx" in mine.content[0].text


# ---------------------------------------------------------------------------------------- M5: sessions


async def test_another_agents_session_answers_404_on_every_route(
    http, make_token, files, jp_http_port, jp_base_url, jp_ws_fetch
) -> None:
    alice = await make_token("alice", ["read", "execute"])
    mallory = await make_token("mallory", ["read", "execute"])
    status, answer = await _eval(
        http, alice, {"cells": [{"code": "PASSWORD = 'hunter2'"}], "session": "alice-s"}
    )
    assert status == 200, answer
    alice_kernel = answer["kernel_id"]
    # jupyter_server's kernel routes do not lead to it either
    status, kernels, _ = await http("GET", "api/kernels", token=mallory)
    assert status == 200 and alice_kernel not in json.dumps(kernels), kernels
    for method, url in (
        ("GET", f"api/kernels/{alice_kernel}"),
        ("POST", f"api/kernels/{alice_kernel}/interrupt"),
    ):
        status, _, _ = await http(method, url, token=mallory)
        assert status == 404, (url, status)
    assert await tokens._ws(jp_ws_fetch, mallory, "api", "kernels", alice_kernel, "channels") == 404
    # interrupt it, delete it, even naming its owner: as if it did not exist
    for method, url in (
        ("POST", "api/agent/sessions/alice-s/interrupt"),
        ("DELETE", "api/agent/sessions/alice-s"),
        ("DELETE", "api/agent/sessions/alice-s?owner=agent:alice"),
    ):
        status, answer, _ = await http(method, url, token=mallory)
        assert status == 404 and answer["message"] == "Session not found: alice-s", (url, answer)
    status, listing, _ = await http("GET", "api/agent/sessions", token=mallory)
    assert status == 200 and "alice" not in json.dumps(listing["sessions"]), listing
    async with mcp_session(_mcp_url(jp_http_port, jp_base_url), mallory) as session:
        for tool in ("session_interrupt", "session_delete"):
            refused = await session.call_tool(tool, {"name": "alice-s"})
            assert refused.is_error and "not found" in refused.content[0].text.lower(), (tool, refused)
        listed = await session.call_tool("session_list", {})
        assert "alice" not in listed.content[0].text and "alice" not in json.dumps(listed.structured_content)
        # session names are per identity (issue 41): mallory's eval naming it runs in mallory's own
        ran = await session.call_tool("eval", {"cells": [{"code": "print(PASSWORD)"}], "session": "alice-s"})
        assert "NameError" in ran.content[0].text and "hunter2" not in ran.content[0].text, ran
    status, answer = await _eval(
        http, mallory, {"cells": [{"code": "print(PASSWORD)"}], "session": "alice-s"}
    )
    assert status == 200 and answer["kernel_id"] != alice_kernel and "NameError" in answer["output"], answer
    assert "hunter2" not in json.dumps(answer) and answer["session_lost"] is None
    # its own session is still there and still its own; mallory's own name works for mallory
    status, answer = await _eval(http, alice, {"cells": [{"code": "print(PASSWORD)"}], "session": "alice-s"})
    assert status == 200 and "hunter2" in answer["cells"][0]["output"], answer
    status, listing, _ = await http("GET", "api/agent/sessions", token=alice)
    assert [s["name"] for s in listing["sessions"]] == ["alice-s"], listing
    # the server's own credentials see and manage all, naming the owner of one of two namesakes
    status, listing, _ = await http("GET", "api/agent/sessions")
    assert sorted((s["name"], s["owner"]) for s in listing["sessions"]) == [
        ("alice-s", "agent:alice"),
        ("alice-s", "agent:mallory"),
    ], listing
    status, answer, _ = await http("DELETE", "api/agent/sessions/alice-s")
    assert status == 409 and "owner=" in answer["message"], answer
    status, answer, _ = await http("POST", "api/agent/sessions/alice-s/interrupt?owner=agent:alice")
    assert status == 200, answer
    status, _, _ = await http("DELETE", "api/agent/sessions/alice-s?owner=agent:alice")
    assert status == 204
    status, answer = await _eval(http, mallory, {"cells": [{"code": "1"}], "session": "alice-s"})
    assert status == 200 and answer["session_lost"] is None and answer["kernel_id"] != alice_kernel, answer
    status, answer = await _eval(http, alice, {"cells": [{"code": "1"}], "session": "alice-s"})
    assert status == 200 and answer["session_lost"]["reason"] == "deleted", answer  # told to alice


# ------------------------------------------------------------------------------- lists confined to paths


async def test_every_list_a_path_limited_agent_reads_leaves_other_notebooks_out(
    http, make_token, files, jp_http_port, jp_base_url, jp_ws_fetch
) -> None:
    reader = await make_token("reader", ["read"], ["reports/**"])
    for path in ("secret.ipynb", "reports/a.ipynb"):
        status, answer, _ = await http(
            "POST", f"api/agent/notebooks/{path}", {"action": "insert", "content": "y = 2"}
        )
        assert status == 200, answer
        status, answer, _ = await http("POST", f"api/agent/notebooks/{path}/run", {"all": True})
        assert status == 200, answer
    status, sessions, _ = await http("GET", "api/sessions")
    kernels = {s["path"]: s["kernel"]["id"] for s in sessions}
    secret_kernel, report_kernel = kernels["secret.ipynb"], kernels["reports/a.ipynb"]
    # the server's own token sees both, everywhere
    status, changes, _ = await http("GET", "api/agent/changes")
    assert {c["path"] for c in changes["changes"]} == {"secret.ipynb", "reports/a.ipynb"}
    checks = {
        "api/agent/changes": lambda a: {c["path"] for c in a["changes"]} == {"reports/a.ipynb"},
        "api/agent/changes?limit=1": lambda a: [c["path"] for c in a["changes"]] == ["reports/a.ipynb"],
        "api/agent/sessions": lambda a: (
            [k["path"] for k in a["notebook_kernels"]] == ["reports/a.ipynb"]
            and [s["notebook"] for s in a["sessions"]] == ["reports/a.ipynb"]
        ),
        "api/sessions": lambda a: [s["path"] for s in a] == ["reports/a.ipynb"],
        "api/kernels": lambda a: [k["id"] for k in a] == [report_kernel],
    }
    for url, check in checks.items():
        status, answer, _ = await http("GET", url, token=reader)
        assert status == 200 and check(answer), (url, answer)
        assert "secret" not in json.dumps(answer) and secret_kernel not in json.dumps(answer), (url, answer)
    secret_session = next(s["id"] for s in sessions if s["path"] == "secret.ipynb")
    for url in (f"api/sessions/{secret_session}", f"api/kernels/{secret_kernel}"):
        status, answer, _ = await http("GET", url, token=reader)
        assert status == 404 and "secret" not in json.dumps(answer), (url, answer)
        status, _, _ = await http("GET", url)
        assert status == 200
    # nor can an agent that may execute talk to that kernel through its websocket
    runner = await make_token("runner", ["read", "execute"], ["reports/**"])
    refused = await tokens._ws(jp_ws_fetch, runner, "api", "kernels", secret_kernel, "channels")
    assert refused == 404, refused
    allowed = await tokens._ws(jp_ws_fetch, runner, "api", "kernels", report_kernel, "channels")
    assert not isinstance(allowed, int), allowed
    allowed.close()
    # and a jupyter session (a kernel) cannot be made for a notebook outside its paths
    body = {"path": "secret.ipynb", "type": "notebook", "kernel": {"name": "python3"}}
    status, answer, _ = await http("POST", "api/sessions", body, token=runner)
    assert status == 404 and answer["message"] == "No such file or directory: secret.ipynb", answer
    status, answer, _ = await http("GET", "api/sessions")
    assert [s["path"] for s in answer].count("secret.ipynb") == 1, answer
    async with mcp_session(_mcp_url(jp_http_port, jp_base_url), reader) as session:
        listed = await session.call_tool("session_list", {})
        text = listed.content[0].text + json.dumps(listed.structured_content)
        assert "reports/a.ipynb" in text and "secret" not in text and secret_kernel not in text


# ------------------------------------------------------------------------------- M1: the event feed


async def _subscribe(jp_ws_fetch: Any, token: str | None) -> Any:
    headers = {"Authorization": f"token {token}"} if token else None
    return await jp_ws_fetch("api", "events", "subscribe", headers=headers)


async def _drain(ws: Any, quiet: float = 1.5) -> list[dict[str, Any]]:
    """The events a subscriber got, until none came for ``quiet`` seconds."""
    got = []
    while True:
        try:
            message = await asyncio.wait_for(ws.read_message(), quiet)
        except asyncio.TimeoutError:
            return got
        assert message is not None, "the feed closed"
        got.append(json.loads(message))


async def test_an_agent_gets_only_the_events_about_itself_and_its_paths(
    http, make_token, files, jp_ws_fetch, jp_serverapp
) -> None:
    extension = jp_serverapp.extension_manager.extension_points["jupyter_agent_tools"].app
    extension.audit.include_code = True  # the worst case: code (and its secrets) is in the events
    reader = await make_token("reader", ["read"], ["reports/**"])
    alice = await make_token("alice", ["read", "execute"])
    bob = await make_token("bob", ["read", "execute"])
    feeds = {
        "reader": await _subscribe(jp_ws_fetch, reader),
        "alice": await _subscribe(jp_ws_fetch, alice),
        "person": await _subscribe(jp_ws_fetch, None),
    }
    status, answer = await _eval(http, bob, {"cells": [{"code": "SECRET = 's3cr3t'"}], "session": "bob-s"})
    assert status == 200, answer
    bob_kernel = answer["kernel_id"]
    status, answer = await _eval(http, alice, {"cells": [{"code": "1 + 1"}], "session": "alice-s"})
    assert status == 200, answer
    for path in ("secret.ipynb", "reports/a.ipynb"):
        status, answer, _ = await http(
            "POST", f"api/agent/notebooks/{path}", {"action": "insert", "content": "y = 'edited'"}
        )
        assert status == 200, answer
    got = {name: await _drain(ws) for name, ws in feeds.items()}
    for ws in feeds.values():
        ws.close()
    text = {name: json.dumps(events) for name, events in got.items()}
    # the person (the panel) gets everything, as before
    assert "s3cr3t" in text["person"] and "secret.ipynb" in text["person"] and "alice-s" in text["person"]
    for name in ("reader", "alice"):
        assert "s3cr3t" not in text[name] and "bob" not in text[name] and bob_kernel not in text[name], name
    assert "secret.ipynb" not in text["reader"] and "alice" not in text["reader"], got["reader"]
    assert {e["path"] for e in got["reader"]} == {"reports/a.ipynb"}, got["reader"]
    assert "secret.ipynb" in text["alice"] and "alice-s" in text["alice"]  # no paths: every notebook
    schemas = {e["schema_id"].split("/")[-2] for e in got["reader"]}
    assert "ledger_change" in schemas and "notebook_change" in schemas, schemas

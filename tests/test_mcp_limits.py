"""What one MCP client can make the server do for it is bounded: a JSON-RPC batch's length and answer
bytes (answered item by item, the event loop free between items), and the legacy sessions one identity
holds. In-process server for the rules, a real server subprocess for the latency of other requests.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import nbformat
import pytest
from jupyter_server.auth.identity import IdentityProvider, User
from nbformat.v4 import new_code_cell, new_notebook

from jupyter_agent_tools.testing.server import jupyter_server

pytestmark = pytest.mark.timeout(240)
ACCEPT = "application/json, text/event-stream"
MB = 1024 * 1024
ANSWER_BYTES = 40_000  # about two 2025-03-26 tools/list answers (16 KB each)
TOKENS = {"alice-token": "alice", "bob-token": "bob"}


class TwoTokens(IdentityProvider):
    """The server's token, and two more tokens of two named users: two clients, two identities."""

    async def get_user_token(self, handler: Any) -> User | None:
        name = TOKENS.get(self.get_token(handler) or "")
        return User(name) if name else await super().get_user_token(handler)


@pytest.fixture
def jp_server_config() -> dict[str, Any]:
    return {
        "ServerApp": {
            "jpserver_extensions": {"jupyter_agent_tools": True},
            "identity_provider_class": TwoTokens,
        },
        "AgentToolsApp": {
            "mcp_max_batch_items": 5,
            "mcp_max_batch_answer_bytes": ANSWER_BYTES,
            "mcp_max_sessions_per_identity": 3,
        },
    }


@pytest.fixture
def url(jp_serverapp: Any, http_server_client: Any, jp_http_port: int, jp_base_url: str) -> str:
    return f"http://127.0.0.1:{jp_http_port}{jp_base_url}api/agent/mcp"


@pytest.fixture
def notebook(jp_root_dir: Path) -> Path:
    path = jp_root_dir / "nb.ipynb"
    nbformat.write(new_notebook(cells=[new_code_cell("x = 1")]), str(path))
    return path


def request(rid: Any, method: str, **params: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "method": method, "params": params}


def insert_cell(rid: int) -> dict[str, Any]:
    """A request whose effect is seen in the file: it ran or it did not."""
    arguments = {"path": "nb.ipynb", "action": "insert", "content": f"ran = {rid}"}
    return request(rid, "tools/call", name="notebook_edit", arguments=arguments)


async def post(url: str, body: Any, headers: dict[str, str]) -> tuple[int, Any, httpx.Headers]:
    sent = {"Accept": ACCEPT, "Content-Type": "application/json", **headers}
    async with httpx.AsyncClient(timeout=120) as client:
        response = await client.post(url, content=json.dumps(body).encode(), headers=sent)
    return response.status_code, response.json() if response.content else None, response.headers


async def open_session(url: str, auth: dict[str, str], version: str = "2025-03-26") -> dict[str, str]:
    status, answer, headers = await post(url, request(0, "initialize", protocolVersion=version), auth)
    assert status == 200, answer
    return {**auth, "Mcp-Session-Id": headers["mcp-session-id"]}


# ------------------------------------------------------------------------------------------- batches


async def test_a_batch_longer_than_the_limit_is_refused_before_any_of_it_runs(
    url, jp_auth_header, notebook
) -> None:
    session = await open_session(url, jp_auth_header)
    batch = [insert_cell(1), *(request(i, "tools/list") for i in range(2, 7))]  # 6 messages, at most 5
    status, answer, _ = await post(url, batch, session)
    assert status == 400 and answer["id"] is None and answer["error"]["code"] == -32600, answer
    message = answer["error"]["message"]
    assert "a batch of 6 messages" in message and "at most 5" in message, message
    assert "mcp_max_batch_items" in message and "batches of at most 5" in message, message
    assert len(nbformat.read(str(notebook), as_version=4).cells) == 1  # the edit did not run
    status, answer, _ = await post(url, batch[:5], session)  # the largest allowed batch is answered
    assert status == 200 and [a["id"] for a in answer] == [1, 2, 3, 4, 5]
    assert len(nbformat.read(str(notebook), as_version=4).cells) == 2


async def test_a_batch_whose_answer_outgrows_its_bound_answers_the_rest_with_an_error_unrun(
    url, jp_auth_header, notebook
) -> None:
    session = await open_session(url, jp_auth_header)
    cancelled = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 99}}
    batch = [request(1, "tools/list"), request(2, "tools/list"), request(3, "tools/list"), cancelled]
    batch.append(insert_cell(5))
    status, answer, _ = await post(url, batch, session)
    assert status == 200, answer
    ran = [a for a in answer if "result" in a]
    refused = [a for a in answer if "error" in a]
    sizes = [len(json.dumps(a, ensure_ascii=False).encode()) for a in ran]
    # items ran until their answers took more than the bound; every request after that got an error
    assert sum(sizes[:-1]) <= ANSWER_BYTES < sum(sizes), sizes
    assert [a["id"] for a in answer] == [1, 2, 3, 5] and refused[-1]["id"] == 5
    for error in refused:
        assert error["error"]["code"] == -32600
        message = error["error"]["message"]
        assert (
            "not run: the batch's answer is too large" in message and "mcp_max_batch_answer_bytes" in message
        )
        assert f"at most {ANSWER_BYTES} bytes" in message and "again in another batch or alone" in message
    assert len(nbformat.read(str(notebook), as_version=4).cells) == 1  # the edit did not run
    status, answer, _ = await post(url, [insert_cell(6)], session)  # sent again, it runs
    assert status == 200 and "result" in answer[0]
    assert len(nbformat.read(str(notebook), as_version=4).cells) == 2


# ------------------------------------------------------------------------------------------ sessions


async def test_one_identitys_initialize_flood_ends_only_its_own_sessions(
    url, jp_auth_header, monkeypatch: pytest.MonkeyPatch
) -> None:
    from jupyter_agent_tools.mcp import server as core

    monkeypatch.setattr(core, "MAX_SESSIONS", 20)  # the server's global bound, 1000, made quick to reach
    alice = await open_session(url, {"Authorization": "token alice-token"}, "2025-11-25")
    mine = await open_session(url, jp_auth_header, "2025-11-25")  # a third identity, opened before the flood
    # bob sends three times the global bound, spelling his token every way jupyter_server accepts it
    spellings = ["token bob-token", "Token bob-token", "bearer bob-token", "BEARER   bob-token"]
    bobs = []
    for i in range(60):
        bobs.append(await open_session(url, {"Authorization": spellings[i % 4]}, "2025-11-25"))
    status, _, headers = await post(
        url + "?token=bob-token", request(0, "initialize", protocolVersion="2025-11-25"), {}
    )
    assert status == 200
    bobs.append({"Mcp-Session-Id": headers["mcp-session-id"], "Authorization": "token bob-token"})

    async def ping(session: dict[str, str]) -> int:
        return (await post(url, request(9, "ping"), session))[0]

    assert await ping(alice) == 200 and await ping(mine) == 200  # the other identities keep theirs
    # bob's token is one identity however it is spelled: only his 3 most recent sessions are left
    assert [await ping(session) for session in bobs] == [404] * 58 + [200] * 3
    assert await ping({**alice, "Authorization": "token bob-token"}) == 404  # still bound to alice


# ------------------------------------------------------------------------- a real server, under load


def _session(http: httpx.Client, url: str, version: str) -> dict[str, str]:
    response = http.post(url, json=request(0, "initialize", protocolVersion=version))
    assert response.status_code == 200, response.text
    return {"Mcp-Session-Id": response.headers["mcp-session-id"]}


def _ping(http: httpx.Client, url: str, session: dict[str, str]) -> float:
    started = time.perf_counter()
    response = http.post(url, json=request(1, "ping"), headers=session)
    assert response.status_code == 200, response.text
    return time.perf_counter() - started


def test_other_requests_are_answered_while_batches_are(tmp_path: Path) -> None:
    """The largest batch the defaults allow (100 tools/list: the cheapest request with the largest
    answer), again and again, and a flood of 20,000 (1 MB, refused): a concurrent ping in another
    session answers within 0.5 s of its latency alone, and the server's memory stays put."""
    with jupyter_server(root_dir=tmp_path) as server:
        url = server.url + "api/agent/mcp"
        base = {"Authorization": f"token {server.token}", "Accept": ACCEPT}
        with (
            httpx.Client(headers=base, timeout=300) as pinger,
            httpx.Client(headers=base, timeout=300) as sender,
        ):
            other = _session(pinger, url, "2025-11-25")
            batches = _session(sender, url, "2025-03-26")
            alone = [_ping(pinger, url, other) for _ in range(30)]
            largest = json.dumps([request(i, "tools/list") for i in range(100)]).encode()
            flood = json.dumps([request(i, "tools/list") for i in range(20_000)]).encode()
            before = server.rss_bytes() or 0
            assert server.reset_peak_memory()
            answers: list[tuple[int, bytes]] = []  # parsed after, out of the measurement

            def send() -> None:
                for body in [largest] * 10 + [flood] + [largest] * 10:
                    headers = {**batches, "Content-Type": "application/json"}
                    response = sender.post(url, content=body, headers=headers)
                    answers.append((response.status_code, response.content))

            thread = threading.Thread(target=send)
            thread.start()
            during: list[float] = []
            while thread.is_alive():
                during.append(_ping(pinger, url, other))
                time.sleep(0.01)
            thread.join()
            grown = server.memory().get("VmHWM", 0) - before
        print(
            f"\nping alone: median {statistics.median(alone) * 1000:.1f} ms, max {max(alone) * 1000:.0f} ms; "
            f"during batches: {len(during)} pings, median {statistics.median(during) * 1000:.1f} ms, max "
            f"{max(during) * 1000:.0f} ms; server peak RSS grew {grown / MB:.0f} MB"
        )
        assert len(answers) == 21
        for status, content in answers[:10] + answers[11:]:
            answer = json.loads(content)
            assert status == 200 and [a["id"] for a in answer] == list(range(100))
            assert all(a["result"]["tools"] for a in answer)
        status, refused = answers[10][0], json.loads(answers[10][1])
        assert status == 400 and refused["error"]["code"] == -32600, str(refused)[:500]
        assert "a batch of 20000 messages" in refused["error"]["message"]
        assert max(during) - max(alone) < 0.5, (max(during), max(alone))
        assert grown < 100 * MB, f"server peak RSS grew by {grown / MB:.0f} MB"

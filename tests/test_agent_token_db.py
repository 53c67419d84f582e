"""The agent token database when it cannot be used: locked by another process, corrupt, not openable.

A real server (in process) with the two documented lines, a real SQLite file, a real second process
holding ``BEGIN EXCLUSIVE`` on it. Such a database answers 503 naming the file, never a 500; the
last-use write waits for nothing; a revoke succeeds or says it did not; nothing else freezes.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from jupyter_agent_tools.auth import AgentAuthorizer, AgentIdentityProvider

pytestmark = pytest.mark.timeout(300)

AGENTS = {"identity_provider_class": AgentIdentityProvider, "authorizer_class": AgentAuthorizer}
HOLD = """
import sqlite3, sys, time
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
time.sleep(120)
"""


@pytest.fixture
def token_db(tmp_path: Path, request: pytest.FixtureRequest) -> Path:
    kind = getattr(request, "param", "fine")
    if kind == "corrupt":
        path = tmp_path / "tokens" / "agent_tokens.db"
        path.parent.mkdir()
        path.write_bytes(b"this is not a database, " * 200)
    elif kind == "unopenable":
        (tmp_path / "a-file").write_text("x")
        path = tmp_path / "a-file" / "agent_tokens.db"
    else:
        path = tmp_path / "tokens" / "agent_tokens.db"
    return path


LOCK_WAIT = 1.0  # AgentIdentityProvider.token_db_timeout of these servers


@pytest.fixture
def jp_server_config(token_db: Path) -> dict[str, Any]:
    return {
        "ServerApp": {"jpserver_extensions": {"jupyter_agent_tools": True}, **AGENTS},
        "AgentIdentityProvider": {"token_db": str(token_db), "token_db_timeout": LOCK_WAIT},
        "KernelPool": {"size": 0},
    }


async def _timed(http: Any, *args: Any, **kwargs: Any) -> tuple[float, int, Any]:
    started = time.perf_counter()
    status, answer = await http(*args, **kwargs)
    return time.perf_counter() - started, status, answer


async def _baseline(http: Any, token: str | None = None) -> float:
    """The slowest of a few unhindered requests on this server now: what "answered at once" means on a
    machine that may be loaded."""
    return max([(await _timed(http, "GET", "api/contents/a.txt", token=token))[0] for _ in range(5)])


async def test_a_locked_token_database_freezes_nothing_and_revoke_says_it_failed(
    http, jp_serverapp, token_db: Path, jp_root_dir: Path
) -> None:
    (jp_root_dir / "a.txt").write_text("a")
    status, made = await http("POST", "api/agent/tokens", {"name": "bot", "scopes": ["read"]})
    assert status == 201, made
    token = made["token"]
    # a request that waited for the lock takes token_db_timeout at least; one that did not, about this
    at_once = LOCK_WAIT / 2 + 5 * await _baseline(http)
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(token_db)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        # the token's first use is due to be written: the answer does not wait for the lock
        took, status, answer = await _timed(http, "GET", "api/contents/a.txt", token=token)
        assert status == 200 and took < at_once, (took, at_once, status, answer)
        # a revoke waits at most token_db_timeout, then says nothing was revoked, naming the file;
        # meanwhile every other request is answered at once
        revoke = asyncio.ensure_future(_timed(http, "DELETE", "api/agent/tokens/bot"))
        others = []
        while not revoke.done():
            others.append((await _timed(http, "GET", "api/contents/a.txt", token=token))[0])
            others.append((await _timed(http, "GET", "api/status"))[0])
        took, status, answer = await revoke
        assert status == 503, answer
        assert str(token_db) in answer["message"] and "locked" in answer["message"], answer
        assert "NOT revoked" in answer["message"]
        assert 0.8 * LOCK_WAIT < took < 2 * LOCK_WAIT + at_once, (took, at_once)
        assert len(others) >= 6 and max(others) < at_once, (others, at_once)
        assert (await http("GET", "api/contents/a.txt", token=token))[0] == 200  # said so: still works
        status, listing = await http("GET", "api/agent/tokens")
        assert status == 200 and [t["status"] for t in listing["tokens"]] == ["active"], listing
        took, status, answer = await _timed(
            http, "POST", "api/agent/tokens", {"name": "another", "scopes": ["read"]}
        )
        assert status == 503 and "was not created" in answer["message"], answer
        assert took < 2 * LOCK_WAIT + at_once, (took, at_once)
    finally:
        holder.kill()
        holder.wait()
    # the lock is gone: the revoke succeeds, and the last use was kept for the file
    status, answer = await http("DELETE", "api/agent/tokens/bot")
    assert status == 200 and answer["status"] == "revoked", answer
    assert (await http("GET", "api/contents/a.txt", token=token))[0] == 403
    status, listing = await http("GET", "api/agent/tokens")
    assert listing["tokens"][0]["last_used"] is not None


@pytest.mark.parametrize("token_db", ["corrupt", "unopenable"], indirect=True)
async def test_a_corrupt_or_unopenable_token_database_answers_503_naming_it(
    http, token_db: Path, jp_root_dir: Path
) -> None:
    (jp_root_dir / "a.txt").write_text("a")
    at_once = LOCK_WAIT / 2 + 5 * await _baseline(http)  # (the server's own token reads no token file)
    for method, url, body, token in [
        ("GET", "api/contents/a.txt", None, "jat_" + "x" * 43),
        ("GET", "api/agent/tokens", None, None),
        ("POST", "api/agent/tokens", {"name": "bot", "scopes": ["read"]}, None),
        ("DELETE", "api/agent/tokens/bot", None, None),
    ]:
        took, status, answer = await _timed(http, method, url, body, token=token)
        assert status == 503, (url, status, answer)
        assert str(token_db) in answer["message"] and "Unhandled" not in answer["message"], answer
        assert took < at_once, (url, took, at_once)
    # the server's own credentials keep working
    status, answer = await http("GET", "api/contents/a.txt")
    assert status == 200, answer

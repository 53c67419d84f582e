"""EMFILE for real: a server process whose RLIMIT_NOFILE is lowered while it runs.

The server is a subprocess (so lowering its limit cannot hurt the test runner); its soft limit is
lowered with ``prlimit(2)`` to just above what it has open, so that the next kernel start runs out of
descriptors.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import resource
import sys
import urllib.parse
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from jupyter_agent_tools.testing.server import jupyter_server

pytestmark = [
    pytest.mark.timeout(240),
    pytest.mark.skipif(
        not Path("/proc/self/fd").is_dir(), reason="not applicable here: needs /proc to count descriptors"
    ),
]

HEADROOM = 64  # KernelService.fd_headroom (its default)


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def call(server, method: str, path: str, body=None) -> tuple[int, Any, dict[str, str]]:
    """One request to the server: (status, parsed JSON body or None, lower-cased headers)."""
    parsed = urllib.parse.urlsplit(server.url)
    conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=120)
    try:
        data = None if body is None else json.dumps(body).encode()
        conn.request(
            method, parsed.path + path, body=data, headers={"Authorization": f"token {server.token}"}
        )
        response = conn.getresponse()
        raw = response.read()
        headers = {k.lower(): v for k, v in response.getheaders()}
        return response.status, (json.loads(raw) if raw else None), headers
    finally:
        conn.close()


def eval_call(server, session: str, code: str = "print('ok')") -> tuple[int, Any]:
    status, body, _ = call(server, "POST", "api/agent/eval", {"cells": [{"code": code}], "session": session})
    return status, body


@pytest.fixture
def events_file(tmp_path: Path) -> Path:
    return tmp_path / "events.jsonl"


@pytest.fixture
def server(tmp_path: Path, events_file: Path):
    config = tmp_path / "jupyter_server_config.py"
    config.write_text(
        f"import logging\nc.EventLogger.handlers = [logging.FileHandler({str(events_file)!r})]\n"
    )
    # No warm pool: these tests measure what a session's own kernel start costs and frees (the pool's
    # part in the recovery is tests/test_pool.py's).
    args = [
        "--EvalSessionManager.max_sessions=20",
        "--EvalSessionManager.heartbeat_interval=0",
        "--KernelPool.size=0",
        f"--config={config}",
    ]
    with jupyter_server(extra_args=args) as running:
        yield running


def recovery_events(events_file: Path) -> list[tuple[str, str]]:
    records = [json.loads(line) for line in events_file.read_text().splitlines()]
    return [(r["kind"], r["outcome"]) for r in records if r["__schema__"].endswith("/recovery/v1")]


def test_emfile_recovery_frees_idle_sessions_and_the_next_eval_succeeds(server, events_file):
    pid = server.process.pid
    soft, hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)
    assert eval_call(server, "warmup")[0] == 200
    assert call(server, "DELETE", "api/agent/sessions/warmup")[0] == 204
    baseline = open_fds(pid)
    assert eval_call(server, "a")[0] == 200
    per_session = open_fds(pid) - baseline
    assert per_session > 0
    assert eval_call(server, "b")[0] == 200
    # Leave less than the headroom a start needs; freeing the idle sessions a and b gives it back.
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (open_fds(pid) + HEADROOM - per_session, hard))
    try:
        status, body = eval_call(server, "c", "print('c ran')")
        assert status == 200, body
        assert body["output"] == "c ran\n"
        status, listing, _ = call(server, "GET", "api/agent/sessions")
        names = [s["name"] for s in listing["sessions"]]
        assert names == ["c"]  # a and b were shut down by the recovery, c was started
        assert listing["totals"]["emfile_recoveries"] == 1
        (entry,) = listing["sessions"]
        assert entry["recoveries"] == {"emfile_recoveries": 1}
        assert recovery_events(events_file) == [
            ("emfile_recoveries", "retrying"),
            ("emfile_recoveries", "recovered"),
        ]
        # the server stays healthy: other routes answer
        (server.root_dir / "nb.ipynb").write_text(
            '{"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}'
        )
        assert call(server, "GET", "api/agent/notebooks/nb.ipynb")[0] == 200
        assert call(server, "GET", "api/kernels")[0] == 200
    finally:
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (soft, hard))
    assert call(server, "DELETE", "api/agent/sessions/c")[0] == 204
    assert open_fds(pid) <= baseline + 2  # nothing leaked by the failed start or the recovery
    assert eval_call(server, "after")[0] == 200


def test_emfile_without_recovery_room_answers_503_with_retry_after(server, events_file):
    pid = server.process.pid
    soft, hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)
    assert eval_call(server, "a")[0] == 200
    baseline = open_fds(pid)
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (baseline + 8, hard))
    try:
        status, body, headers = call(
            server, "POST", "api/agent/eval", {"cells": [{"code": "1"}], "session": "z"}
        )
        assert status == 503
        assert "out of file descriptors" in body["message"]
        assert f"of {baseline + 8} file descriptors open" in body["message"]
        assert int(headers["retry-after"]) > 0
        assert recovery_events(events_file) == [
            ("emfile_recoveries", "retrying"),
            ("emfile_recoveries", "failed"),
        ]
        assert call(server, "GET", "api/agent/sessions")[0] == 200
    finally:
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (soft, hard))
    status, body = eval_call(server, "z", "print('recovered')")
    assert status == 200 and body["output"] == "recovered\n"


def test_real_exhaustion_without_headroom_check_is_still_recognised():
    """With the pre-spawn check off, the start really runs out of descriptors.

    What happens then (measured): libzmq does not raise, the client's sockets silently fail to connect
    and the kernel "doesn't respond". The descriptor count identifies it as EMFILE, the idle session is
    shut down, and the retried start succeeds.
    """
    args = [
        "--EvalSessionManager.max_sessions=20",
        "--EvalSessionManager.heartbeat_interval=0",
        "--KernelService.fd_headroom=0",
        "--KernelPool.size=0",
        "--KernelService.ready_timeout=5",
    ]
    with jupyter_server(extra_args=args) as server:
        pid = server.process.pid
        soft, hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)
        idle = [f"idle{i}" for i in range(5)]
        for name in idle:  # enough open sessions that the limit stays workable for a kernel process
            assert eval_call(server, name)[0] == 200
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (open_fds(pid) + 10, hard))
        try:
            status, body = eval_call(server, "c", "print('c ran')")
        finally:
            resource.prlimit(pid, resource.RLIMIT_NOFILE, (soft, hard))
        assert status == 200, body
        # the failed start and its retry may pass the slow-start mark (5 s): then the answer says so first
        started = r"(\[A new kernel was started for this call in [^\]]+\]\n)?"
        assert re.fullmatch(started + r"c ran\n", body["output"]), body["output"]
        _, listing, _ = call(server, "GET", "api/agent/sessions")
        assert listing["totals"]["emfile_recoveries"] == 1
        assert [s["name"] for s in listing["sessions"]] == ["c"]
        assert server.process.poll() is None

"""Sessions never reach outside what they own, and never change other sessions or state silently.

Session names become artifact directories: names that are not plain file names are refused, and every
removal is confined to the artifact store's own root. Kernel replacements are reported, a bad kernel name
changes nothing, evictions never let more kernels live than ``max_sessions``, and per-call sessions are
as manageable as they are visible.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import psutil
import pytest
from tornado.httpclient import AsyncHTTPClient
from traitlets import TraitError
from traitlets.config import Config

from jupyter_agent_tools.artifacts import ArtifactStore
from jupyter_agent_tools.errors import NotFound
from jupyter_agent_tools.execution.cells import CellExecutor
from jupyter_agent_tools.execution.session_manager import EvalSessionManager

NOT_PLAIN_NAMES = [".", "..", "...", ".hidden", "../x", "a/b", "%2e%2e"]


@pytest.fixture
def private(tmp_path: Path) -> Path:
    """A private directory holding the artifacts root, with a canary file beside it."""
    (tmp_path / "canary.txt").write_text("must survive")
    return tmp_path


@pytest.fixture
def jp_server_config(private: Path) -> dict[str, Any]:
    return {
        "ServerApp": {"jpserver_extensions": {"jupyter_agent_tools": True}},
        "ArtifactStore": {"root_dir": str(private / "artifacts")},
        "EvalSessionManager": {"max_sessions": 2, "heartbeat_interval": 0},
        "CellExecutor": {"max_output_bytes": 1024, "interrupt_grace": 1.0},
        # No warm pool here: these tests count a server's kernels and pause its kernel launches.
        "KernelPool": {"size": 0},
    }


def service(jp_serverapp: Any) -> Any:
    return jp_serverapp.web_app.settings["jupyter_agent_tools"].eval_service


def kernel_processes(runtime_dir: Path) -> list[str]:
    """Kernel processes of this (in-process) server that still exist, exiting ones included: those
    whose connection file is in its runtime directory; one entry per kernel (a kernel's forked child has
    the same command line)."""
    found: list[str] = []
    for child in psutil.Process().children(recursive=True):
        try:
            cmdline = child.cmdline()
            line = " ".join(cmdline)
            if str(runtime_dir) in line and child.status() != "zombie" and line not in found:
                found.append(line)
        except psutil.Error:
            continue
    return found


# -- names and paths ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NOT_PLAIN_NAMES)
async def test_session_names_that_are_not_plain_names_are_refused(api, jp_serverapp, private, name):
    status, answer = await api("POST", "eval", body={"cells": [{"code": "1"}], "session": name})
    assert status == 400, answer
    assert "'session' must be 1-64 characters" in answer["message"]
    assert service(jp_serverapp).list_sessions() == []
    assert jp_serverapp.kernel_manager.list_kernel_ids() == []


@pytest.fixture
def raw_request(jp_http_port, jp_base_url, jp_auth_header):
    """Send a request with the path exactly as given (jp_fetch would escape '%')."""

    async def send(method: str, path: str) -> tuple[int, Any]:
        url = f"http://127.0.0.1:{jp_http_port}{jp_base_url}{path}"
        body = b"{}" if method == "POST" else None
        response = await AsyncHTTPClient().fetch(
            url, method=method, headers=jp_auth_header, body=body, raise_error=False
        )
        return response.code, json.loads(response.body) if response.body else None

    return send


@pytest.mark.parametrize("name", ["%2E%2E", "%2E", ".hidden", "..%2Fx", "%2E%2E%2F%2E%2E"])
async def test_deleting_dot_names_removes_nothing(raw_request, evaluate, private, name):
    await evaluate("print('x' * 5000)", session="keep")  # spills an artifact
    before = sorted(p.name for p in (private / "artifacts").rglob("*"))
    status, answer = await raw_request("DELETE", f"api/agent/sessions/{name}")
    assert status == 404, answer
    assert answer["message"].startswith("Session not found")
    status, _ = await raw_request("POST", f"api/agent/sessions/{name}/interrupt")
    assert status == 404
    assert (private / "canary.txt").read_text() == "must survive"
    assert sorted(p.name for p in (private / "artifacts").rglob("*")) == before


async def test_eviction_sweep_and_stop_stay_inside_the_artifacts_root(evaluate, jp_serverapp, private):
    for name in ("a", "b", "c"):  # max_sessions=2: "c" evicts "a"
        answer = await evaluate("print('y' * 5000)", session=name)
        assert answer["cells"][0]["artifact_id"]
    sessions = service(jp_serverapp).sessions
    sessions.idle_timeout = 1e-9
    await sessions.sweep()
    assert sessions.describe_all() == []
    await service(jp_serverapp).shutdown()
    assert (private / "canary.txt").read_text() == "must survive"
    assert sorted(p.name for p in (private / "artifacts").iterdir()) == []


def test_artifact_store_confines_every_path(private):
    root = private / "artifacts"
    store = ArtifactStore(root=root)
    outside = private / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("x")
    for name in NOT_PLAIN_NAMES:
        with pytest.raises(ValueError):
            store.remove_session(name)
        with pytest.raises(ValueError):
            store.session_dir(name)
    for artifact_id in ("..." + "0" * 32, "..", "../outside/keep", ".." + "/" + "0" * 32):
        with pytest.raises(NotFound):
            store.path(artifact_id)
    # A session directory replaced by a link (kernel code can do that) is never followed.
    (root / "linked").symlink_to(outside, target_is_directory=True)
    store.remove_session("linked")
    assert not (root / "linked").exists() and (outside / "keep.txt").exists()
    (root / "linked2").symlink_to(outside, target_is_directory=True)
    store.sweep(now=1e12)
    assert (outside / "keep.txt").exists()
    assert (private / "canary.txt").read_text() == "must survive"


def test_output_limit_below_one_byte_is_refused_at_start():
    with pytest.raises(TraitError, match=r"CellExecutor\.max_output_bytes must be at least 1"):
        CellExecutor(config=Config({"CellExecutor": {"max_output_bytes": 0}}))
    with pytest.raises(TraitError, match=r"EvalSessionManager\.max_sessions must be at least 1"):
        EvalSessionManager(config=Config({"EvalSessionManager": {"max_sessions": 0}}))


# -- no silent state loss -------------------------------------------------------------------------

IGNORES_SIGINT = "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\ntime.sleep(60)"


async def test_kernel_replaced_after_an_ignored_interrupt_is_reported(evaluate, jp_fetch):
    first = await evaluate("x = 41", session="w")
    response = await jp_fetch(
        "api",
        "agent",
        "eval",
        method="POST",
        headers={"Accept": "application/x-ndjson"},
        body=json.dumps({"cells": [{"code": IGNORES_SIGINT}], "session": "w", "timeout": 1}),
        request_timeout=60,
    )
    events = [json.loads(line) for line in response.body.decode().splitlines()]
    restarts = [e for e in events if e["type"] == "restart"]
    assert len(restarts) == 1 and "state from earlier calls was lost" in restarts[0]["message"]
    result = events[-1]["result"]
    assert result["timed_out"] is True and result["restarted"] is True
    assert "state from earlier calls was lost" in result["output"]
    assert result["kernel_id"] != first["kernel_id"]
    after = await evaluate("print('x' in globals())", session="w")
    assert after["output"] == "False\n" and after["restarted"] is False


async def test_unknown_kernel_name_changes_no_session(api, evaluate, jp_serverapp):
    a = await evaluate("x = 1", session="a")
    b = await evaluate("y = 2", session="b")
    for body in (
        {"cells": [{"code": "1"}], "session": "c", "kernel_name": "no-such-kernel"},
        {"cells": [{"code": "1"}], "session": "a", "kernel_name": "no-such-kernel", "reset": True},
    ):
        status, answer = await api("POST", "eval", body=body)
        assert status == 400
        assert answer["message"].startswith("No such kernel: 'no-such-kernel' (available: ")
        assert "python3" in answer["message"]
    listing = service(jp_serverapp).list_sessions()
    assert sorted((s["name"], s["kernel_id"]) for s in listing) == [
        ("a", a["kernel_id"]),
        ("b", b["kernel_id"]),
    ]
    assert (await evaluate("print(x)", session="a"))["output"] == "1\n"
    assert (await evaluate("print(y)", session="b"))["output"] == "2\n"


async def test_failed_first_start_leaves_no_session_holding_a_slot(api, evaluate, jp_serverapp):
    kernels = service(jp_serverapp).kernels

    async def refuse(*args: Any, **kwargs: Any) -> Any:
        # A fault that cannot be produced for real here: a kernel manager refusing a start with a 4xx.
        from tornado.web import HTTPError

        raise HTTPError(403, "refused by policy")

    real = kernels._launch_once
    kernels._launch_once = refuse
    try:
        status, _ = await api("POST", "eval", body={"cells": [{"code": "1"}], "session": "ghost"})
    finally:
        kernels._launch_once = real
    assert status == 400
    assert service(jp_serverapp).list_sessions() == []
    await evaluate("1", session="a")
    await evaluate("1", session="b")  # both slots free: nothing evicted for a ghost
    assert sorted(s["name"] for s in service(jp_serverapp).list_sessions()) == ["a", "b"]


async def test_evictions_never_exceed_max_sessions_kernels(api, evaluate, jp_runtime_dir):
    await evaluate("1", session="a")
    await evaluate("1", session="b")
    peak: list[str] = []
    done = asyncio.Event()

    async def sample() -> None:
        nonlocal peak
        while not done.is_set():
            now = kernel_processes(jp_runtime_dir)
            if len(now) > len(peak):
                peak = now
            await asyncio.sleep(0.01)

    sampler = asyncio.ensure_future(sample())
    answers = await asyncio.gather(
        *(api("POST", "eval", body={"cells": [{"code": "1"}], "session": f"new{i}"}) for i in range(6))
    )
    done.set()
    await sampler
    assert {status for status, _ in answers} <= {200, 503}
    assert any(status == 200 for status, _ in answers)
    assert peak, "the sampler saw no kernel process"
    assert len(peak) <= 2, f"{len(peak)} kernel processes with max_sessions=2: {peak}"


# -- per-call sessions ----------------------------------------------------------------------------


async def _per_call_name(api: Any) -> str:
    for _ in range(200):
        _, listing = await api("GET", "sessions")
        running = [s for s in listing["sessions"] if s["mode"] == "per-call" and s["kernel_id"]]
        if running:
            return str(running[0]["name"])
        await asyncio.sleep(0.05)
    raise AssertionError("the per-call session never showed up")


async def test_per_call_sessions_can_be_interrupted_and_deleted(api, evaluate, jp_serverapp):
    sleeper = "import time\nfor _ in range(600):\n    time.sleep(0.05)"
    call = asyncio.ensure_future(evaluate(sleeper, mode="per-call", timeout=60))
    name = await _per_call_name(api)
    await asyncio.sleep(0.3)
    status, answer = await api("POST", f"sessions/{name}/interrupt", body={})
    assert status == 200 and answer["interrupted"] is True
    assert (await call)["cancelled"] is True

    call = asyncio.ensure_future(evaluate(sleeper, mode="per-call", timeout=60))
    name = await _per_call_name(api)
    _, listing = await api("GET", "sessions")
    kernel_id = next(s["kernel_id"] for s in listing["sessions"] if s["name"] == name)
    status, _ = await api("DELETE", f"sessions/{name}")
    assert status == 204
    assert (await call)["cancelled"] is True
    assert kernel_id not in jp_serverapp.kernel_manager.list_kernel_ids()
    _, listing = await api("GET", "sessions")
    assert listing["sessions"] == []


async def test_per_call_leaves_no_empty_artifact_directory(evaluate, jp_fetch, private):
    await evaluate("print(1)", mode="per-call")
    assert list((private / "artifacts").iterdir()) == []
    spilled = await evaluate("print('z' * 5000)", mode="per-call")
    artifact_id = spilled["cells"][0]["artifact_id"]
    assert artifact_id and [p.name for p in (private / "artifacts").iterdir()] == [artifact_id.split(".")[0]]
    response = await jp_fetch("api", "agent", "artifacts", artifact_id)  # still there after the call
    assert response.body.decode() == "z" * 5000 + "\n"


def test_the_suite_keeps_temporary_files_in_a_private_directory():
    import tempfile

    private = os.environ["JUPYTER_AGENT_TOOLS_TEST_TMP"]
    assert os.path.basename(private).startswith("jupyter-agent-tools-tests-")
    worker = os.environ.get("PYTEST_XDIST_WORKER")  # under pytest-xdist: a folder of its own inside it
    assert tempfile.gettempdir() == (os.path.join(private, worker) if worker else private)


async def test_a_replacement_after_the_caller_left_is_told_to_the_next_call(
    evaluate, api, jp_http_port, jp_base_url, jp_auth_header
):
    await evaluate("x = 5", session="gone")
    reader, writer = await asyncio.open_connection("127.0.0.1", jp_http_port)
    # 'go' comes once SIGINT is ignored: printed before, a loaded kernel could get the interrupt first
    code = IGNORES_SIGINT.replace("time.sleep(60)", "print('go', flush=True)\ntime.sleep(60)")
    body = json.dumps({"cells": [{"code": code}], "session": "gone"})
    headers = "".join(f"{k}: {v}\r\n" for k, v in jp_auth_header.items())
    writer.write(
        f"POST {jp_base_url}api/agent/eval HTTP/1.1\r\nHost: 127.0.0.1:{jp_http_port}\r\n{headers}"
        f"Accept: application/x-ndjson\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        + body.encode()
    )
    await writer.drain()
    seen = b""
    while b'"chunk"' not in seen:
        seen += await asyncio.wait_for(reader.read(4096), 30)
    writer.close()  # the caller leaves: its run is interrupted, the kernel ignores it and is replaced
    for _ in range(600):  # interrupt grace, then the replacement kernel's start: slow on a loaded machine
        await asyncio.sleep(0.1)
        _, listing = await api("GET", "sessions")
        entry = next(s for s in listing["sessions"] if s["name"] == "gone")
        if not entry["busy"] and entry["recoveries"].get("wedged_restarts"):
            break
    else:
        pytest.fail(f"the wedged kernel was not replaced within 60 s: {entry}")
    after = await evaluate("print('x' in globals())", session="gone")
    assert after["restarted"] is True and "state from earlier calls was lost" in after["output"]
    assert after["cells"][0]["output"] == "False\n"
    again = await evaluate("1", session="gone")
    assert again["restarted"] is False  # told once


@pytest.mark.parametrize("phase", ["launch", "init"])
@pytest.mark.parametrize("mode", ["per-call", "session"])
async def test_a_delete_while_the_kernel_starts_cancels_the_call(
    api, evaluate, jp_serverapp, monkeypatch, phase, mode
):
    """A DELETE that lands while the session's kernel is being launched or initialized cancels the call
    (200, cancelled) and leaves no kernel: the kernel's shutdown is not a death, and nothing runs on a
    connection the DELETE closed. The pause is injected at the phase, so the DELETE always lands in it."""
    svc = service(jp_serverapp)
    reached, release = asyncio.Event(), asyncio.Event()
    target = svc.recovery if phase == "launch" else svc
    method = "launch" if phase == "launch" else "_ensure_init"
    original = getattr(target, method)

    async def paused(*args: Any, **kwargs: Any) -> Any:
        if phase == "init":  # init: the kernel is up; the DELETE shuts it down under the init step
            reached.set()
            await release.wait()
            return await original(*args, **kwargs)
        result = await original(*args, **kwargs)  # launch: the kernel is up but not handed over yet
        reached.set()
        await release.wait()
        return result

    monkeypatch.setattr(target, method, paused)
    before = set(jp_serverapp.kernel_manager.list_kernel_ids())
    fields = {"mode": "per-call"} if mode == "per-call" else {"session": "starting"}
    call = asyncio.ensure_future(evaluate("print('never')", timeout=30, **fields))
    await asyncio.wait_for(reached.wait(), 30)
    _, listing = await api("GET", "sessions")
    (name,) = [s["name"] for s in listing["sessions"] if s["mode"] == mode]
    status, answer = await api("DELETE", f"sessions/{name}")
    assert status == 204, answer
    result = await asyncio.wait_for(call, 10)  # at once: the start goes on without the call (issue 35)
    release.set()
    assert result["cancelled"] is True and result["error"] is None
    assert "never" not in result["output"]
    for _ in range(100):  # the kernel the start still got is shut down when the start ends
        if set(jp_serverapp.kernel_manager.list_kernel_ids()) <= before:
            break
        await asyncio.sleep(0.1)
    assert set(jp_serverapp.kernel_manager.list_kernel_ids()) <= before
    monkeypatch.undo()
    assert (await evaluate("1 + 1", session="after"))["cells"][0]["output"].strip() == "2"


async def test_an_interrupt_while_the_kernel_starts_cancels_the_call(
    api, evaluate, jp_serverapp, monkeypatch
):
    """An interrupt that lands while the session's kernel is being started answers the call cancelled at
    once (not an empty success, and not after the start): none of its cells runs, and the session's next
    call runs normally, on the kernel that start gave it."""
    svc = service(jp_serverapp)
    reached, release = asyncio.Event(), asyncio.Event()
    original = svc.recovery.launch

    async def paused(*args: Any, **kwargs: Any) -> Any:
        result = await original(*args, **kwargs)
        reached.set()
        await release.wait()
        return result

    monkeypatch.setattr(svc.recovery, "launch", paused)
    call = asyncio.ensure_future(evaluate("print('never')", timeout=30, session="early"))
    await asyncio.wait_for(reached.wait(), 30)
    status, answer = await api("POST", "sessions/early/interrupt")
    assert status == 200 and answer["interrupted"] is True, answer
    # Answered at once, while the kernel still starts (issue 35: the call waited for the start)
    result = await asyncio.wait_for(asyncio.shield(call), 10)
    release.set()
    assert result["cancelled"] is True and result["cells"] == [], result
    assert result["output"] == "(cancelled before it started)"
    assert "never" not in result["output"]
    monkeypatch.undo()
    assert (await evaluate("1 + 1", session="early"))["cells"][0]["output"].strip() == "2"

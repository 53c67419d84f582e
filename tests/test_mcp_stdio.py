"""``jupyter agent mcp``, the stdio relay, driven by the official Python MCP SDK's stdio client
(``mcp.client.stdio.stdio_client`` running ``python -m jupyter_agent_tools.cli mcp``) against a real server
and real kernels, in both protocol eras; a raw pipe for what no SDK does (a reader that stops reading)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TextIO

import anyio
import httpx
import nbformat
import pytest
from mcp import ClientSession
from mcp.client.client import Client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.shared.exceptions import MCPError
from nbformat.v4 import new_code_cell, new_notebook

from jupyter_agent_tools.cli.mcp_stdio import _Refused, encode_header_value, modern_version, sse_messages
from jupyter_agent_tools.mcp.server import LEGACY_VERSIONS, MODERN_VERSIONS
from jupyter_agent_tools.mcp.tools import TOOLS
from jupyter_agent_tools.testing.server import Server, free_port, jupyter_server

pytestmark = pytest.mark.timeout(300)
REPO = Path(__file__).resolve().parent.parent
AGENT_TOKENS = [
    "--ServerApp.identity_provider_class=jupyter_agent_tools.auth.AgentIdentityProvider",
    "--ServerApp.authorizer_class=jupyter_agent_tools.auth.AgentAuthorizer",
]
SLOW = "import time\nprint('started', flush=True)\ntime.sleep(60)\nfinished = True"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("stdio-root")
    nb = new_notebook(cells=[new_code_cell("print('hello')", id="c1")])
    nb.nbformat_minor = 5
    nbformat.write(nb, str(root / "nb.ipynb"))
    # One legacy session per identity: a second initialize with the same token ends the first one.
    extra = [*AGENT_TOKENS, "--AgentToolsApp.mcp_max_sessions_per_identity=1"]
    with jupyter_server(root_dir=root, extra_args=extra) as s:
        yield s


@pytest.fixture
def runtime(tmp_path: Path) -> Path:
    path = tmp_path / "runtime"
    path.mkdir(mode=0o700)
    return path


def relay_env(runtime: Path, **extra: str) -> dict[str, str]:
    """The relay's environment: the checkout first, a private runtime dir, nothing else of Jupyter's (the
    SDK's stdio client passes only HOME, PATH and a few more of the test's own)."""
    env = {"PYTHONPATH": str(REPO), "JUPYTER_RUNTIME_DIR": str(runtime)}
    env.update(extra)
    return env


def relay(runtime: Path, *args: str, **env: str) -> StdioServerParameters:
    command = [sys.executable, "-m", "jupyter_agent_tools.cli", "mcp", *args]
    return StdioServerParameters(
        command=command[0], args=command[1:], env=relay_env(runtime, **env), cwd=REPO
    )


def to(server: Server, token: str | None = None) -> dict[str, str]:
    return {"JUPYTER_AGENT_URL": server.url, "JUPYTER_AGENT_TOKEN": token or server.token}


@contextlib.asynccontextmanager
async def legacy(params: StdioServerParameters, errlog: TextIO) -> AsyncIterator[ClientSession]:
    """The SDK's ClientSession over the relay, after the initialize handshake (protocol 2025-11-25)."""
    async with stdio_client(params, errlog=errlog) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


@contextlib.asynccontextmanager
async def modern(params: StdioServerParameters, errlog: TextIO) -> AsyncIterator[Client]:
    """The SDK's Client in its default mode over the relay: server/discover, then 2026-07-28."""
    async with Client(stdio_client(params, errlog=errlog)) as client:
        yield client


def text_of(result: Any) -> str:
    return str(result.content[0].text)


def api(server: Server, method: str, path: str, body: Any = None) -> Any:
    with server.client() as client:
        return client.json(method, path, body, expect=201 if path == "api/agent/tokens" else 200)


def stderr_of(path: Path) -> str:
    text = path.read_text()
    assert "Traceback" not in text, text
    return text


# ------------------------------------------------------------------------------------- both eras


def test_legacy_session_tools_progress_and_resources(server: Server, runtime: Path, tmp_path: Path) -> None:
    errors = tmp_path / "stderr.txt"

    async def run() -> None:
        with errors.open("w") as errlog:
            async with legacy(relay(runtime, **to(server)), errlog) as session:
                assert session.initialize_result.protocol_version == LEGACY_VERSIONS[-1]
                listed = await session.list_tools()
                assert {tool.name for tool in listed.tools} == {tool.name for tool in TOOLS}
                ran = await session.call_tool("eval", {"cells": [{"code": "print(6 * 7)"}], "session": "s"})
                assert not ran.is_error and text_of(ran) == "42\n"
                read = await session.call_tool("notebook_read", {"path": "nb.ipynb"})
                assert not read.is_error and "print('hello')" in text_of(read)
                resources = await session.list_resources()
                assert [str(r.uri) for r in resources.resources] == ["jupyter://notebooks/nb.ipynb"]
                contents = await session.read_resource("jupyter://notebooks/nb.ipynb")
                assert "print('hello')" in contents.contents[0].text  # type: ignore[union-attr]

                seen: list[str | None] = []

                async def on_progress(value: float, total: float | None, message: str | None) -> None:
                    seen.append(message)

                code = "import time\nprint('start', flush=True)\ntime.sleep(1.5)\nprint('end')"
                slow = await session.call_tool(
                    "eval", {"cells": [{"code": code}]}, progress_callback=on_progress
                )
                assert text_of(slow) == "start\nend\n"
                assert [m for m in seen if m] == ["start\n", "end\n"], seen  # as the kernel printed them

    anyio.run(run)
    said = stderr_of(errors)
    assert f"relaying to {server.url}api/agent/mcp (found via JUPYTER_AGENT_URL)" in said, said


def test_modern_client_tools_and_progress(server: Server, runtime: Path, tmp_path: Path) -> None:
    errors = tmp_path / "stderr.txt"

    async def run() -> None:
        with errors.open("w") as errlog:
            async with modern(relay(runtime, **to(server)), errlog) as client:
                assert client.protocol_version == MODERN_VERSIONS[-1]
                names = {tool.name for tool in (await client.list_tools()).tools}
                assert "eval" in names and "notebook_read" in names
                seen: list[str | None] = []

                async def on_progress(value: float, total: float | None, message: str | None) -> None:
                    seen.append(message)

                code = "import time\nprint('start', flush=True)\ntime.sleep(1.5)\nprint('end')"
                ran = await client.call_tool(
                    "eval", {"cells": [{"code": code}]}, progress_callback=on_progress
                )
                assert text_of(ran) == "start\nend\n"
                assert "start\n" in seen, seen
                read = await client.call_tool("notebook_read", {"path": "nb.ipynb"})
                assert "print('hello')" in text_of(read)  # (Mcp-Name mirrored: else the server refuses)

    anyio.run(run)
    stderr_of(errors)


async def _cancel_after_start(call: Callable[[Any], Awaitable[Any]]) -> None:
    """Run a call whose kernel prints 'started' and then sleeps; cancel it once it started (the SDK
    then sends notifications/cancelled to the relay)."""
    started = anyio.Event()

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        if message and "started" in message:
            started.set()

    async with anyio.create_task_group() as group:
        scope = anyio.CancelScope()

        async def run() -> None:
            with scope:
                await call(on_progress)

        group.start_soon(run)
        with anyio.fail_after(90):
            await started.wait()
        scope.cancel()


@pytest.mark.parametrize("era", ["legacy", "modern"])
def test_cancel_interrupts_the_kernel_and_the_session_goes_on(
    era: str, server: Server, runtime: Path, tmp_path: Path
) -> None:
    """Cancelling a running eval interrupts the kernel: the sleep never finishes, and the next call in the
    same eval session (over the same relay) answers at once."""
    errors = tmp_path / "stderr.txt"
    name = f"cancel-{era}"
    arguments = {"cells": [{"code": SLOW}], "session": name, "timeout": 120}
    check = {"cells": [{"code": "'finished' in dir()"}], "session": name}

    async def run() -> None:
        with errors.open("w") as errlog:
            opened = legacy if era == "legacy" else modern
            async with opened(relay(runtime, **to(server)), errlog) as client:
                await _cancel_after_start(
                    lambda on_progress: client.call_tool("eval", arguments, progress_callback=on_progress)
                )
                with anyio.fail_after(30):  # the sleep (60 s) was interrupted, not waited for
                    after = await client.call_tool("eval", check)
                assert text_of(after) == "False\n", text_of(after)

    anyio.run(run)
    stderr_of(errors)
    sessions = api(server, "GET", "api/agent/sessions")["sessions"]
    assert not next(s for s in sessions if s["name"] == name)["busy"]


def test_read_only_agent_token_gets_the_servers_refusal(
    server: Server, runtime: Path, tmp_path: Path
) -> None:
    made = api(server, "POST", "api/agent/tokens", {"name": "stdio-reader", "scopes": ["read"]})
    errors = tmp_path / "stderr.txt"

    async def run() -> None:
        with errors.open("w") as errlog:
            async with legacy(relay(runtime, **to(server, made["token"])), errlog) as session:
                refused = await session.call_tool("eval", {"cells": [{"code": "open('made.txt', 'w')"}]})
                assert refused.is_error and "Permission denied" in text_of(refused)
                assert "'execute' scope" in text_of(refused), text_of(refused)
                read = await session.call_tool("notebook_read", {"path": "nb.ipynb"})
                assert not read.is_error and "print('hello')" in text_of(read)

    anyio.run(run)
    stderr_of(errors)
    assert not (server.root_dir / "made.txt").exists()


# ------------------------------------------------------------------------ finding the server, errors


def server_record(runtime: Path, server: Server, url: str | None = None) -> Path:
    """A ``jpserver-<pid>.json`` like the one jupyter_server writes for itself (owner-only)."""
    info = {
        "pid": server.process.pid,
        "url": url or server.url,
        "token": server.token,
        "root_dir": str(server.root_dir),
    }
    path = runtime / f"jpserver-{server.process.pid}.json"
    path.write_text(json.dumps(info))
    path.chmod(0o600)
    return path


def test_found_through_its_runtime_record_and_a_new_session_when_the_server_forgets_it(
    server: Server, runtime: Path, tmp_path: Path
) -> None:
    """Without --url or the environment, the relay uses the running server's record (and its token); a
    server that moved (the record it read first names a port nobody listens on) is found again. When the
    server ends the relay's MCP session (here: the same token opened another one past the server's
    per-identity limit of 1), the relay opens a new one with the client's own initialize: the client
    never notices."""
    gone = f"http://127.0.0.1:{free_port()}/"
    record = server_record(runtime, server, gone)
    errors = tmp_path / "stderr.txt"

    async def run() -> None:
        with errors.open("w") as errlog:
            started = stdio_client(relay(runtime), errlog=errlog)
            async with started as (read, write), ClientSession(read, write) as session:
                with anyio.fail_after(60):  # it read the record before the server "moved"
                    while f"relaying to {gone}" not in errors.read_text():
                        await anyio.sleep(0.05)
                server_record(runtime, server)
                await session.initialize()
                first = await session.call_tool("eval", {"cells": [{"code": "1 + 1"}]})
                assert text_of(first) == "2\n"
                async with httpx.AsyncClient() as http:  # another session of the same token
                    opened = await http.post(
                        f"{server.url}api/agent/mcp",
                        headers={"Authorization": f"token {server.token}", "Accept": "application/json"},
                        json={
                            "jsonrpc": "2.0",
                            "id": 1,
                            "method": "initialize",
                            "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {}},
                        },
                    )
                    assert opened.status_code == 200 and opened.headers["mcp-session-id"]
                again = await session.call_tool("eval", {"cells": [{"code": "2 + 2"}]})
                assert text_of(again) == "4\n"

    anyio.run(run)
    said = stderr_of(errors)
    assert f"relaying to {server.url}api/agent/mcp (found via {record})" in said, said
    assert "opened a new one" in said, said


def test_no_server_and_a_refused_token_are_json_rpc_errors_and_a_line_on_stderr(
    server: Server, runtime: Path, tmp_path: Path
) -> None:
    async def refused(params: StdioServerParameters, errors: Path) -> str:
        with errors.open("w") as errlog:
            async with stdio_client(params, errlog=errlog) as (read, write), ClientSession(read, write) as s:
                with pytest.raises(MCPError) as raised:
                    await s.initialize()
                return str(raised.value)

    nowhere = anyio.run(refused, relay(runtime), tmp_path / "none.txt")
    assert "no running Jupyter server found" in nowhere, nowhere
    assert "no running Jupyter server found" in stderr_of(tmp_path / "none.txt")

    wrong = anyio.run(
        refused, relay(runtime, "--url", server.url, "--token", "wrong"), tmp_path / "wrong.txt"
    )
    assert "refused the token (HTTP 40" in wrong and "--token" in wrong, wrong
    assert "refused the token" in stderr_of(tmp_path / "wrong.txt")


# ------------------------------------------------------------------------------- a raw pipe


def _peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc (Linux)")
def test_a_reader_that_stops_reading_keeps_the_relays_memory_bounded(
    server: Server, runtime: Path, tmp_path: Path
) -> None:
    """The client stops reading stdout while an eval prints 48 MB (6000 flushes) with a progress token:
    the relay holds a few messages and stops reading the server's stream (which coalesces its progress
    meanwhile); its peak memory stays far below what the server would have sent (7 MiB more with an
    unbounded queue, measured), and the response arrives once the client reads again. Every line of
    stdout is one JSON-RPC message."""
    env = {**os.environ, **relay_env(runtime, **to(server))}
    with (tmp_path / "stderr.txt").open("w") as errlog:
        process = subprocess.Popen(
            [sys.executable, "-m", "jupyter_agent_tools.cli", "mcp"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=errlog,
            env=env,
            cwd=REPO,
        )
    assert process.stdin is not None and process.stdout is not None

    def send(message: dict[str, Any]) -> None:
        assert process.stdin is not None
        process.stdin.write(json.dumps(message).encode() + b"\n")
        process.stdin.flush()

    try:
        send(
            {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "initialize",
                "params": {"protocolVersion": LEGACY_VERSIONS[-1], "capabilities": {}, "clientInfo": {}},
            }
        )
        assert json.loads(process.stdout.readline())["result"]["protocolVersion"] == LEGACY_VERSIONS[-1]
        send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        idle = _peak_rss(process.pid)
        code = "for i in range(6000): print(str(i % 10) * 8000, flush=True)"
        call = {"name": "eval", "arguments": {"cells": [{"code": code}], "session": "flood", "timeout": 200}}
        send(
            {
                "jsonrpc": "2.0",
                "id": 2,
                "method": "tools/call",
                "params": {**call, "_meta": {"progressToken": 7}},
            }
        )
        deadline = time.monotonic() + 200
        while time.monotonic() < deadline:  # the kernel printed it all while nobody read the relay
            time.sleep(0.5)
            sessions = api(server, "GET", "api/agent/sessions")["sessions"]
            if any(s["name"] == "flood" and not s["busy"] for s in sessions):
                break
        else:
            raise AssertionError("the eval did not end")
        time.sleep(1)
        peak = _peak_rss(process.pid)
        lines, response = 0, None
        while response is None:
            message = json.loads(process.stdout.readline())
            lines += 1
            if message.get("id") == 2:
                response = message
            else:
                assert message["method"] == "notifications/progress", message
        grew = peak - idle
        print(f"relay peak grew {grew / 2**20:.1f} MiB over idle {idle / 2**20:.1f} MiB; {lines} lines read")
        assert grew < 4 * 1024 * 1024, f"the relay grew by {grew / 2**20:.1f} MiB (48 MB printed)"
        assert response["result"]["content"][0]["text"], response  # (the server's answer: its text is
        # the output's tail, or says which output the kernel dropped while the server fell behind)
    finally:
        process.stdin.close()  # stdin ends: the relay ends its session and exits
        assert process.wait(timeout=30) == 0
        process.stdout.close()
    stderr_of(tmp_path / "stderr.txt")


# ----------------------------------------------------------------------------------- pure parts


@pytest.mark.quick
def test_sse_messages_parse_events_and_bound_them() -> None:
    async def parse(*chunks: bytes, limit: int = 1000) -> list[Any]:
        async def source() -> AsyncIterator[bytes]:
            for chunk in chunks:
                yield chunk

        return [message async for message in sse_messages(source(), limit)]

    stream = (
        b': keep-alive\n\nevent: message\ndata: {"a":\r\ndata: 1}\r\n\r\n',
        b'id: 4\ndata: {"b": 2}\n\nevent: other\ndata: {"c": 3}\n\nda',
        b"ta: [1]\n\n",
    )
    assert anyio.run(parse, *stream) == [{"a": 1}, {"b": 2}, [1]]
    with pytest.raises(_Refused, match="more than 10 bytes"):
        anyio.run(lambda: parse(b"data: " + b"1" * 20 + b"\n", limit=10))
    with pytest.raises(_Refused, match="line of more than 10 bytes"):
        anyio.run(lambda: parse(b"data: " + b"1" * 20, limit=10))
    with pytest.raises(_Refused, match="not JSON"):
        anyio.run(lambda: parse(b"data: {\n\n"))


@pytest.mark.quick
def test_the_era_and_the_mirrored_headers_come_from_the_message() -> None:
    meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}
    assert modern_version({"method": "tools/list", "params": {"_meta": meta}}) == "2026-07-28"
    assert modern_version({"method": "initialize", "params": {"_meta": meta}}) is None
    assert modern_version({"method": "tools/list", "params": {}}) is None
    assert modern_version([{"method": "tools/list"}]) is None
    assert encode_header_value("eval") == "eval"
    assert (
        encode_header_value("jupyter://notebooks/é.ipynb")
        == "=?base64?anVweXRlcjovL25vdGVib29rcy/DqS5pcHluYg==?="
    )

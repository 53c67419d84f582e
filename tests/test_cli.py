"""``jupyter agent`` and the Python client against a real server.

The command runs as a subprocess (``python -m jupyter_agent_tools.cli``, the checkout first on
``PYTHONPATH``) with an empty private runtime directory, so only the servers a test records there are found.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import sysconfig
import threading
import time
import uuid
import venv
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import cli_fork
import httpx
import nbformat
import pytest

from jupyter_agent_tools.cli.cells import CellRef, CodeCell, parse_cell_ref, split_cells
from jupyter_agent_tools.cli.discovery import find_server, running_servers
from jupyter_agent_tools.client import AgentAPIError, AgentClient, AsyncAgentClient
from jupyter_agent_tools.testing.server import Server, free_port, jupyter_server

REPO = Path(__file__).resolve().parent.parent
# AGENT_TOOLS_CLI_FRESH=1: every run_cli call starts `python -m jupyter_agent_tools.cli` (no fork server).
FRESH_PROCESSES = os.environ.get("AGENT_TOOLS_CLI_FRESH") == "1"
MAX_OUTPUT = 4096  # the test server's max_output_bytes: small, so truncation is cheap to reach
PNG_1X1 = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
SHOW_IMAGE = (
    "from IPython.display import Image, display; import base64; display(Image(base64.b64decode({!r})))"
)


# -- fixtures and helpers --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("cli-root")
    (root / "sub" / "deeper").mkdir(parents=True)
    with jupyter_server(root_dir=root, extra_args=[f"--CellExecutor.max_output_bytes={MAX_OUTPUT}"]) as s:
        yield s


@pytest.fixture
def runtime_dir(tmp_path: Path) -> Path:
    path = tmp_path / "runtime"
    path.mkdir()
    return path


def base_env(runtime: Path, **extra: str) -> dict[str, str]:
    """The environment of a command run: no inherited server settings, a private runtime dir."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k
        not in (
            "JUPYTER_AGENT_URL",
            "JUPYTER_AGENT_TOKEN",
            "JUPYTER_TOKEN",
            "JUPYTERHUB_API_TOKEN",
            "JUPYTER_RUNTIME_DIR",
        )
    }
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    env["JUPYTER_RUNTIME_DIR"] = str(runtime)
    env.pop("TERM", None)
    env.update(extra)
    return env


def run_cli(
    *args: str,
    server: Server | None = None,
    runtime: Path,
    input: str | None = None,
    cwd: Path | None = None,
    timeout: float = 120,
    **env: str,
) -> subprocess.CompletedProcess[str]:
    """``jupyter agent ARGS`` in a process of its own, forked from one that has imported the command
    (tests/cli_fork.py: the same main(), environment, files and exit status, without Python's start);
    with AGENT_TOOLS_CLI_FRESH=1 in the environment, ``python -m jupyter_agent_tools.cli`` each time."""
    extra = dict(env)
    if server is not None:
        extra.update(JUPYTER_AGENT_URL=server.url, JUPYTER_AGENT_TOKEN=server.token)
    if not FRESH_PROCESSES:
        return cli_fork.run(list(args), base_env(runtime, **extra), cwd or REPO, input, timeout)
    return subprocess.run(
        [sys.executable, "-m", "jupyter_agent_tools.cli", *args],
        capture_output=True,
        text=True,
        input=input,
        env=base_env(runtime, **extra),
        cwd=cwd or REPO,
        timeout=timeout,
    )


@pytest.fixture
def cli(server: Server, runtime_dir: Path) -> Any:
    """Run ``jupyter agent ARGS`` against the test server (through JUPYTER_AGENT_URL / _TOKEN)."""

    def call(*args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        return run_cli(*args, server=server, runtime=runtime_dir, **kwargs)

    return call


def api_eval(server: Server, body: dict[str, Any]) -> dict[str, Any]:
    with server.client() as client:
        answer: dict[str, Any] = client.json("POST", "api/agent/eval", body)
    return answer


def expected_stdout(text: str) -> str:
    """What the plain command prints for an API text: the text, ended by one newline if it has none."""
    return text if not text or text.endswith("\n") else text + "\n"


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def write_notebook(server: Server, name: str, sources: list[str]) -> str:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(source) for source in sources]
    for i, cell in enumerate(nb.cells):
        cell["id"] = f"cell{i}"
    nbformat.write(nb, server.root_dir / name)
    return name


def server_record(runtime: Path, server: Server, **fields: Any) -> Path:
    """A ``jpserver-<pid>.json`` like the one jupyter_server writes for itself."""
    info = {
        "base_url": "/",
        "hostname": "127.0.0.1",
        "password": False,
        "pid": server.process.pid,
        "port": int(server.url.rsplit(":", 1)[1].strip("/")),
        "root_dir": str(server.root_dir),
        "secure": False,
        "sock": "",
        "token": server.token,
        "url": server.url,
        "version": "2",
    }
    info.update(fields)
    path = runtime / f"jpserver-{info['pid']}.json"
    path.write_text(json.dumps(info))
    return path


# -- pure parts: cells and cell references ---------------------------------------------------------------


def test_split_cells_at_percent_markers() -> None:
    text = (
        "import os\n\n# %% load\nx = 1\n\n#%%\ny = 2\n"
        "# %% [markdown]\n# # Title\n# %%   show it  \nprint(x + y)\n"
    )
    assert split_cells(text) == [
        CodeCell("import os"),
        CodeCell("x = 1", "load"),
        CodeCell("y = 2"),
        CodeCell("print(x + y)", "show it"),
    ]
    assert split_cells("print(1)\n") == [CodeCell("print(1)")]
    assert split_cells("# %% empty\n\n# %%\n") == []
    assert split_cells("# %%% not a marker\nx = 1") == [CodeCell("# %%% not a marker\nx = 1")]


def test_cell_references() -> None:
    assert parse_cell_ref("3") == CellRef(index=3)
    assert parse_cell_ref("a1b2c3d4") == CellRef(id="a1b2c3d4")
    assert parse_cell_ref("id:31415926") == CellRef(id="31415926")


# -- the Python client -----------------------------------------------------------------------------------


def mock_client(answers: list[httpx.Response], seen: list[httpx.Request]) -> AgentClient:
    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return answers.pop(0)

    return AgentClient("http://agent.test/base/", "tok", transport=httpx.MockTransport(handler))


def test_client_request_shapes_and_errors() -> None:
    """The bodies the client sends for routes this branch cannot call yet (run, clear_outputs), and how
    an error answer becomes an AgentAPIError."""
    seen: list[httpx.Request] = []
    ok = {"output": "", "cells": []}
    client = mock_client(
        [httpx.Response(200, json=ok) for _ in range(3)]
        + [httpx.Response(409, json={"message": "Notebook changed", "reason": None})],
        seen,
    )
    client.run_notebook("dir/a b.ipynb", cell_ids=["x", "y"], timeout=5, stop_on_error=False)
    client.run_notebook("a.ipynb")
    client.edit_notebook("a.ipynb", [{"action": "clear_outputs", "all": True}], expected_hash="h")
    with pytest.raises(AgentAPIError) as failure:
        client.edit_notebook("a.ipynb", {"action": "delete", "cell_index": 0})
    assert [r.url.raw_path.decode() for r in seen] == [
        "/base/api/agent/notebooks/dir/a%20b.ipynb/run",
        "/base/api/agent/notebooks/a.ipynb/run",
        "/base/api/agent/notebooks/a.ipynb",
        "/base/api/agent/notebooks/a.ipynb",
    ]
    assert json.loads(seen[0].content) == {"cell_ids": ["x", "y"], "timeout": 5, "stop_on_error": False}
    assert json.loads(seen[1].content) == {"all": True}
    assert json.loads(seen[2].content) == {
        "ops": [{"action": "clear_outputs", "all": True}],
        "expected_hash": "h",
    }
    assert seen[0].headers["authorization"] == "token tok"
    assert (failure.value.status, failure.value.message) == (409, "Notebook changed")
    with pytest.raises(ValueError):
        client.run_notebook("a.ipynb", cell_ids=["x"], cell_indices=[0])


def test_client_against_server(server: Server) -> None:
    session = unique("client")
    with AgentClient(server.url, server.token) as client:
        result = client.eval(["x = 20", {"code": "x * 2", "title": "double"}], session=session)
        assert result["output"] == "[1/2]\n(no output)\n\n[2/2] double\n40"
        events = list(client.stream_eval("print(x)", session=session))
        assert [e["type"] for e in events] == ["cell_start", "chunk", "cell_end", "result"]
        assert events[-1]["result"]["output"] == "20\n"
        assert session in [s["name"] for s in client.sessions()["sessions"]]
        assert client.interrupt(session)["interrupted"] is False
        big = client.eval(f"print('z' * {MAX_OUTPUT * 2})", session=session)["cells"][0]
        assert big["truncated"] and client.artifact(str(big["artifact_id"])) == "z" * MAX_OUTPUT * 2 + "\n"
        name = write_notebook(server, f"{session}.ipynb", ["a = 1"])
        answer = client.edit_notebook(name, {"action": "insert", "content": "b = 2"})
        assert answer["message"] == "Inserted code cell at index 1. Notebook now has 2 cells."
        assert [c["source"] for c in client.read_notebook(name)["cells"]] == ["a = 1", "b = 2"]
        client.delete_session(session)
        with pytest.raises(AgentAPIError) as missing:
            client.delete_session(session)
        assert missing.value.status == 404 and "Session not found" in missing.value.message
    with AgentClient(server.url, "wrong-token") as client, pytest.raises(AgentAPIError) as refused:
        client.sessions()
    assert refused.value.status == 403


def test_blocking_client_interrupted_closes_the_stream(server: Server) -> None:
    """Ctrl-C while the blocking client waits for the next event cancels that wait on the client's own
    loop and closes the connection before KeyboardInterrupt reaches the caller: the server stops the run
    (the session answers a new call at once) and the client still works."""
    session = unique("ctrlc")
    with AgentClient(server.url, server.token) as client:
        events = client.stream_eval("import time\nprint('go', flush=True)\ntime.sleep(600)", session=session)
        assert next(events)["type"] == "cell_start"
        assert next(events)["type"] == "chunk"
        timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT))  # as Ctrl-C does
        # Python's own Ctrl-C handler, even when the suite runs with SIGINT ignored (a background job)
        previous = signal.signal(signal.SIGINT, signal.default_int_handler)
        timer.start()
        began = time.monotonic()
        try:
            with pytest.raises(KeyboardInterrupt):
                next(events)
        finally:
            signal.signal(signal.SIGINT, previous)
        # the wait was cancelled, not sat out: the cell alone would have taken 600 s
        assert time.monotonic() - began < 300
        events.close()
        result = client.eval("print('after')", session=session, timeout=20)
        assert result["output"] == "after\n" and not result["cancelled"], result
        client.delete_session(session)


def test_async_client(server: Server) -> None:
    async def main() -> tuple[str, list[str]]:
        async with AsyncAgentClient(server.url, server.token) as client:
            result = await client.eval("1 + 1", mode="per-call")
            kinds = [e["type"] async for e in client.stream_eval("print('hi')", mode="per-call")]
            with pytest.raises(AgentAPIError) as missing:
                await client.artifact("nope.0123")
            assert missing.value.status == 404
            return result["output"], kinds

    output, kinds = asyncio.run(main())
    assert output == "2\n"
    assert kinds[0] == "cell_start" and kinds[-1] == "result"


def python_c(code: str, runtime_dir: Path) -> subprocess.CompletedProcess[str]:
    """``python -c code`` in a fresh interpreter (what it imports is the point), in the repository."""
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=base_env(runtime_dir), cwd=REPO
    )


def test_client_and_command_stay_on_http(runtime_dir: Path) -> None:
    """Neither the client nor the command loads the server side (services, handlers, jupyter_server)."""
    code = (
        "import sys, jupyter_agent_tools.client, jupyter_agent_tools.cli.commands, "
        "jupyter_agent_tools.cli.render.terminal, jupyter_agent_tools.cli.render.plain\n"
        "server = ('jupyter_server', 'tornado', 'zmq', 'jupyter_agent_tools.execution',"
        " 'jupyter_agent_tools.notebook', 'jupyter_agent_tools.handlers', 'jupyter_agent_tools.app')\n"
        "print(sorted(m for m in sys.modules if m.startswith(server)))"
    )
    done = python_c(code, runtime_dir)
    assert done.stdout == "[]\n", done.stderr


def test_the_command_starts_without_what_it_does_not_use(runtime_dir: Path) -> None:
    """Shell-driven agents pay the command's start on every call: it loads neither httpx's own command line
    (click, rich, pygments: ~130 ms) nor the route schemas, and a non-terminal run no rich at all."""
    code = (
        "import sys\n"
        "from jupyter_agent_tools.cli import main\n"
        "code = main(['--url', 'http://127.0.0.1:1/', '--token', 't', 'sessions'])\n"
        "heavy = ('click', 'rich', 'pygments', 'jupyter_agent_tools.schemas')\n"
        "print(code, sorted(m for m in sys.modules if m.split('.')[0] in heavy or m in heavy))"
    )
    done = python_c(code, runtime_dir)
    assert done.stdout.splitlines()[-1] == "3 []", (done.stdout, done.stderr)


def test_client_unreachable() -> None:
    with AgentClient(f"http://127.0.0.1:{free_port()}/", "t") as client, pytest.raises(AgentAPIError) as e:
        client.sessions()
    assert e.value.status is None and e.value.reason == "unreachable"


# -- the command: usage and help -------------------------------------------------------------------------


def test_help_and_usage(runtime_dir: Path) -> None:
    helped = run_cli("--help", runtime=runtime_dir)
    assert helped.returncode == 0
    assert helped.stdout.startswith("usage: jupyter agent")
    for word in ("eval", "nb", "sessions", "artifact", "Exit codes"):
        assert word in helped.stdout
    assert run_cli(runtime=runtime_dir).returncode == 2  # no command: help, exit 2
    assert run_cli("nb", "frobnicate", "x.ipynb", runtime=runtime_dir).returncode == 2


# -- eval: plain output is the API's text ----------------------------------------------------------------


CASES = {
    "titled cells": (["-c", "x = 20", "-c", "x * 2"], [{"code": "x = 20"}, {"code": "x * 2"}]),
    "a failing cell": (
        ["-c", "print('before')", "-c", "1/0", "-c", "print('never')"],
        [{"code": "print('before')"}, {"code": "1/0"}, {"code": "print('never')"}],
    ),
    "stdout, stderr and a display only": (
        ["-c", "import sys; print('out'); print('err', file=sys.stderr)", "-c", SHOW_IMAGE.format(PNG_1X1)],
        [
            {"code": "import sys; print('out'); print('err', file=sys.stderr)"},
            {"code": SHOW_IMAGE.format(PNG_1X1)},
        ],
    ),
    "unicode": (["-c", "'héllo ✓'"], [{"code": "'héllo ✓'"}]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_eval_plain_output_is_the_api_output(cli: Any, server: Server, case: str) -> None:
    args, cells = CASES[case]
    # per-call: both runs get a fresh kernel, so tracebacks name the same "Cell In[n]"
    expected = api_eval(server, {"cells": cells, "mode": "per-call"})
    done = cli("eval", "--per-call", *args)
    assert done.stdout == expected_stdout(expected["output"])
    assert done.stderr == ""
    assert done.returncode == (1 if case == "a failing cell" else 0)


def test_eval_file_is_split_at_percent_markers(cli: Any, server: Server, tmp_path: Path) -> None:
    source = "import math\n# %% load\nx = 3\n# %% [markdown]\n# prose\n# %% show\nprint(math.pi * x)\n"
    script = tmp_path / "job.py"
    script.write_text(source)
    session = unique("split")
    from_file = cli("eval", "-s", session, "--json", str(script))
    assert from_file.returncode == 0, from_file.stderr
    result = json.loads(from_file.stdout)
    assert [c["title"] for c in result["cells"]] == [None, "load", "show"]
    expected = api_eval(
        server,
        {
            "session": session,
            "cells": [
                {"code": "import math"},
                {"code": "x = 3", "title": "load"},
                {"code": "print(math.pi * x)", "title": "show"},
            ],
        },
    )
    assert (
        result["output"]
        == expected["output"]
        == "[1/3]\n(no output)\n\n[2/3] load\n(no output)\n\n[3/3] show\n9.42477796076938"
    )
    from_stdin = cli("eval", "-s", session, "-", input=source)
    assert from_stdin.stdout == expected_stdout(expected["output"])


def test_eval_options_reach_the_kernel(cli: Any, server: Server) -> None:
    session = unique("opts")
    code = "import os; print(os.getcwd().endswith('sub'), os.environ['GREETING'], repr(os.environ['EMPTY']))"
    done = cli("eval", "-s", session, "--cwd", "sub", "-e", "GREETING=hi there", "-e", "EMPTY=", "-c", code)
    assert done.stdout == "True hi there ''\n", done.stderr
    assert cli("eval", "-s", session, "-c", "y = 1").returncode == 0
    reset = cli("eval", "-s", session, "--reset", "-c", "print('y' in dir())")
    assert reset.stdout == "False\n"


def test_eval_ndjson_passes_the_stream_through(cli: Any) -> None:
    done = cli("eval", "--per-call", "--ndjson", "-c", "print(1)", "-c", "print(2)")
    assert done.returncode == 0, done.stderr
    events = [json.loads(line) for line in done.stdout.splitlines()]
    kinds = [e["type"] for e in events if e["type"] != "heartbeat"]
    assert kinds == ["cell_start", "chunk", "cell_end", "cell_start", "chunk", "cell_end", "result"]
    assert events[-1]["result"]["output"] == "[1/2]\n1\n\n[2/2]\n2"
    for line in done.stdout.splitlines():  # the server's own serialization, line for line
        assert line == json.dumps(json.loads(line), ensure_ascii=False)


def test_save_images(cli: Any, tmp_path: Path) -> None:
    out = tmp_path / "images"
    code = SHOW_IMAGE.format(PNG_1X1)
    done = cli("eval", "--per-call", "--save-images", str(out), "-c", code)
    assert done.stdout == "(no text output)\n"
    saved = out / "cell1-1.png"
    assert saved.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"[image/png 1x1, 70 bytes] saved to {saved}" in done.stderr


# -- exit codes ------------------------------------------------------------------------------------------


def test_exit_codes(cli: Any, server: Server, runtime_dir: Path) -> None:
    assert cli("eval", "--per-call", "-c", "pass").returncode == 0
    assert cli("eval", "--per-call", "-c", "raise ValueError('no')").returncode == 1
    # bad usage, and a 4xx answer
    assert cli("eval").returncode == 2
    assert cli("eval", "-c", "1", "some_file.py").returncode == 2
    bad_cwd = cli("eval", "--cwd", "no/such/dir", "-c", "1")
    assert bad_cwd.returncode == 2
    assert bad_cwd.stderr == (
        "Error: 'cwd' must be an existing directory inside the server root (got 'no/such/dir') (HTTP 400)\n"
    )
    # unreachable, and auth refused
    nobody = run_cli("sessions", runtime=runtime_dir, JUPYTER_AGENT_URL=f"http://127.0.0.1:{free_port()}/")
    assert nobody.returncode == 3 and "cannot reach the Jupyter server" in nobody.stderr
    refused = run_cli(
        "sessions", runtime=runtime_dir, JUPYTER_AGENT_URL=server.url, JUPYTER_AGENT_TOKEN="wrong"
    )
    assert refused.returncode == 3 and "HTTP 403" in refused.stderr and "token" in refused.stderr
    # timed out
    slow = cli("eval", "--per-call", "--timeout", "1", "-c", "import time; time.sleep(30)")
    assert slow.returncode == 124
    assert slow.stdout.endswith("Command timed out after 1 seconds\n")


# A run that only an interrupt ends: its budget (the most the server allows) is far longer than a loaded
# machine can take to get the cell going and the interrupt delivered, so the run cannot time out first
# (it did with the default 30 s: exit 124 instead of 130); the cell sleeps longer than that budget.
UNTIL_INTERRUPTED = ("--timeout", "600")


def started_eval(server: Server, runtime_dir: Path, session: str, code: str) -> subprocess.Popen[str]:
    """``jupyter agent eval --ndjson`` running ``code``, once the cell has printed 'ready'."""
    command = ["eval", "--ndjson", *UNTIL_INTERRUPTED, "-s", session, "-c", code]
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyter_agent_tools.cli", *command],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=base_env(runtime_dir, JUPYTER_AGENT_URL=server.url, JUPYTER_AGENT_TOKEN=server.token),
        # Ctrl-C's default, as at a terminal, even when the suite itself runs with SIGINT ignored (a
        # shell's background job)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert proc.stdout is not None
    seen = []
    while not seen or "ready" not in seen[-1]:
        seen.append(proc.stdout.readline())
        if not seen[-1]:  # the run ended without the cell getting there
            out, err = proc.communicate()
            raise AssertionError(f"exit {proc.returncode}: {''.join(seen)}{out}{err}")
    return proc


def test_interrupted_from_elsewhere_exits_130(cli: Any, server: Server, runtime_dir: Path) -> None:
    session = unique("elsewhere")
    code = "import time\nprint('ready', flush=True)\ntime.sleep(3600)"
    proc = started_eval(server, runtime_dir, session, code)
    try:
        interrupted = cli("sessions", "interrupt", session)
        assert interrupted.stdout == f"Interrupted session {session}: its running call was cancelled.\n"
        out, err = proc.communicate(timeout=300)  # a guard against a hang, not a measure
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err
    result = json.loads(out.splitlines()[-1])["result"]
    assert result["cancelled"] is True and result["timed_out"] is False


def test_ctrl_c_interrupts_the_kernel(server: Server, runtime_dir: Path) -> None:
    session = unique("ctrlc")
    code = (
        "import time\ninterrupted = False\ntry:\n    print('ready', flush=True)\n    time.sleep(3600)\n"
        "except KeyboardInterrupt:\n    interrupted = True"
    )
    proc = started_eval(server, runtime_dir, session, code)  # the kernel is inside the try block
    try:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=300)  # a guard against a hang, not a measure
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err
    assert err == "Error: cancelled: the run was interrupted (Ctrl-C)\n"
    # The kernel got the interrupt: only the KeyboardInterrupt handler sets the flag, and the session
    # answers with its state kept (an uninterrupted kernel would still sleep, and this call time out).
    after = run_cli("eval", "-s", session, "-c", "print(interrupted)", server=server, runtime=runtime_dir)
    assert (after.returncode, after.stdout) == (0, "True\n"), after.stderr


# -- notebook commands -----------------------------------------------------------------------------------


def test_nb_commands(cli: Any, server: Server, tmp_path: Path) -> None:
    name = write_notebook(server, unique("nb") + ".ipynb", ["a = 1", "print(a)"])
    shown = cli("nb", "show", name)
    with server.client() as client:
        read = client.json("GET", f"api/agent/notebooks/{name}")
    assert shown.returncode == 0
    assert shown.stdout == (
        f"{name}: 2 cells, hash {read['hash']}\n\n[0] code id=cell0\na = 1\n\n[1] code id=cell1\nprint(a)\n"
    )
    assert cli("nb", "show", name, "--cell", "cell1").stdout.endswith("\n\n[1] code id=cell1\nprint(a)\n")

    inserted = cli("nb", "insert", name, "--at", "1", "--id", "new", "--content", "b = 2\nc = 3")
    assert inserted.stdout == "Inserted code cell at index 1. Notebook now has 3 cells.\nb = 2\nc = 3\n"
    edited = cli("nb", "edit", name, "--cell", "new", "--type", "markdown", "-", input="# Title")
    assert (
        edited.stdout
        == "Edited cell at index 1 and converted it from code to markdown. Notebook has 3 cells.\n# Title\n"
    )
    source = tmp_path / "cell.py"
    source.write_text("print(a + 1)")
    assert cli("nb", "edit", name, "--cell", "2", "--file", str(source)).returncode == 0
    moved = cli("nb", "move", name, "--cell", "2", "--to", "0")
    assert moved.stdout == "Moved code cell from index 2 to index 0. Notebook has 3 cells.\nprint(a + 1)\n"

    current = json.loads(cli("nb", "show", name, "--json").stdout)
    stale = cli("nb", "delete", name, "--cell", "0", "--expected-hash", "0" * 64)
    assert (
        stale.returncode == 2
        and "Notebook changed since it was read" in stale.stderr
        and "(HTTP 409)" in stale.stderr
    )
    deleted = cli("nb", "delete", name, "--cell", "0", "--expected-hash", current["hash"])
    assert deleted.stdout == "Deleted code cell at index 0. Notebook now has 2 cells.\nprint(a + 1)\n"

    as_json = json.loads(cli("nb", "insert", name, "--content", "d = 4", "--json").stdout)
    assert as_json["details"]["totalCells"] == 3 and as_json["details"]["cellSource"] == "d = 4"
    assert [c["source"] for c in json.loads(cli("nb", "show", name, "--json").stdout)["cells"]] == [
        "a = 1",
        "# Title",
        "d = 4",
    ]
    # errors: a missing cell (found by the command itself), a 404, an out-of-range index (the route's 400)
    assert cli("nb", "show", name, "--cell", "nope").returncode == 2
    assert cli("nb", "show", "missing.ipynb").returncode == 2
    out_of_range = cli("nb", "delete", name, "--cell", "9")
    assert out_of_range.returncode == 2
    assert "Cell index 9 is out of range for delete" in out_of_range.stderr
    assert cli("nb", "edit", name, "--cell", "0").returncode == 2  # no source given


def test_nb_upgrade_and_repair(cli: Any, server: Server) -> None:
    fixtures = Path(__file__).parent / "fixtures" / "notebooks"
    old, stray = unique("v3") + ".ipynb", unique("stray") + ".ipynb"
    (server.root_dir / old).write_bytes((fixtures / "v3_book.ipynb").read_bytes())
    (server.root_dir / stray).write_bytes((fixtures / "stray_ids_44.ipynb").read_bytes())
    refused = cli("nb", "edit", old, "--cell", "2", "--content", "x")
    assert refused.returncode == 2 and '"upgrade": true' in refused.stderr
    upgraded = cli("nb", "edit", old, "--cell", "2", "--content", "x", "--upgrade")
    assert upgraded.returncode == 0, upgraded.stderr
    assert "Upgraded the file from nbformat 3.0 to 4.5." in upgraded.stdout
    assert json.loads((server.root_dir / old).read_text())["nbformat"] == 4
    refused = cli("nb", "clear", stray, "--all")
    assert refused.returncode == 2 and "was already invalid" in refused.stderr
    repaired = cli("nb", "clear", stray, "--all", "--repair", "--json")
    assert repaired.returncode == 0, repaired.stderr
    assert len(json.loads(repaired.stdout)["repairs"]) == 2


def test_nb_show_outputs(cli: Any, server: Server) -> None:
    name = unique("out") + ".ipynb"
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("print('hi'); 1/0", id="c0", execution_count=1)
    cell.outputs = [
        nbformat.v4.new_output("stream", name="stdout", text="hi\n"),
        nbformat.v4.new_output(
            "error",
            ename="ZeroDivisionError",
            evalue="division by zero",
            traceback=["ZeroDivisionError: oops"],
        ),
        nbformat.v4.new_output("display_data", data={"text/plain": "<Figure>", "image/png": PNG_1X1}),
    ]
    nb.cells = [cell]
    nbformat.write(nb, server.root_dir / name)
    shown = cli("nb", "show", name, "--outputs")
    assert shown.stdout.endswith(
        "[0] code id=c0 execution_count=1\nprint('hi'); 1/0\n[0] outputs:\nhi\n"
        "ZeroDivisionError: oops\n<Figure>\n[image/png 70 bytes]\n"
    )


def test_nb_clear(cli: Any, server: Server) -> None:
    name = unique("clear") + ".ipynb"
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("print(1)", id="c0", execution_count=1)
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="1\n")]
    nb.cells = [cell]
    nbformat.write(nb, server.root_dir / name)
    cleared = cli("nb", "clear", name, "--all")
    assert cleared.returncode == 0, cleared.stderr
    assert nbformat.read(server.root_dir / name, as_version=4).cells[0].outputs == []


def test_nb_run(cli: Any, server: Server) -> None:
    name = write_notebook(server, unique("run") + ".ipynb", ["x = 6", "print(x * 7)"])
    done = cli("nb", "run", name, "--json")
    assert done.returncode == 0, done.stderr
    assert "42" in json.loads(done.stdout)["output"]
    failing = write_notebook(server, unique("runfail") + ".ipynb", ["x = 1", "y = 2", "1/0", "z = 3"])
    done = cli("nb", "run", failing, "--all")
    assert done.returncode == 1
    # the failing cell is named as every nb command names it: its notebook index and its id
    assert "Cell 2 (id cell2) failed (exit code 1)" in done.stdout, done.stdout
    assert "Fix only cell 2 (id cell2)." in done.stdout
    assert "Fix only cell 3" not in done.stdout and "Cell 3 failed" not in done.stdout
    subset = cli("nb", "run", failing, "--cell", "2")
    assert subset.returncode == 1 and "cell 2 (id cell2)" in subset.stdout.lower(), subset.stdout


def test_nb_kernel_and_eval_in_a_notebook(cli: Any, server: Server) -> None:
    name = write_notebook(server, unique("kern") + ".ipynb", ["base = 21"])
    assert "not_running" in cli("nb", "kernel", name).stdout
    assert cli("nb", "run", name).returncode == 0
    done = cli("eval", "--notebook", name, "-c", "print(base * 2)")
    assert done.returncode == 0 and done.stdout == "42\n", done.stderr
    assert f"Notebook {name}: kernel python3" in cli("sessions").stdout
    shown = cli("nb", "kernel", name)
    assert shown.returncode == 0 and f"Kernel of {name}: idle, python3" in shown.stdout, shown.stdout
    restarted = cli("nb", "kernel", name, "restart", "--json")
    assert restarted.returncode == 0 and json.loads(restarted.stdout)["state_lost"] is True
    assert "NameError" in cli("eval", "--notebook", name, "-c", "base").stdout
    assert "Shut down" in cli("nb", "kernel", name, "shutdown").stdout
    bad = cli("nb", "kernel", name, "explode")
    assert bad.returncode != 0 and "invalid choice" in bad.stderr
    # insert and run in one call: the new cell's output, and one change in the ledger
    done = cli("nb", "insert", name, "--id", "added", "--content", "print('added ran')", "--run")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "[1/1] cell 1 (id added)\nadded ran\n", done.stdout
    log = cli("nb", "log", name, "--json")
    assert json.loads(log.stdout)["changes"][0]["kind"] == "run"


def test_nb_run_saves_the_images_the_cells_stored(cli: Any, server: Server, tmp_path: Path) -> None:
    name = write_notebook(server, unique("plot") + ".ipynb", [SHOW_IMAGE.format(PNG_1X1)])
    out = tmp_path / "images"
    done = cli("nb", "run", name, "--save-images", str(out))
    assert done.returncode == 0, done.stderr
    saved = out / "cell1-1.png"
    assert saved.read_bytes() == base64.b64decode(PNG_1X1)
    assert f"[image/png 1x1, 70 bytes] saved to {saved}" in done.stderr


# -- sessions and artifacts ------------------------------------------------------------------------------


def test_sessions_commands(cli: Any) -> None:
    session = unique("sess")
    assert cli("eval", "-s", session, "-c", "1").returncode == 0
    listed = cli("sessions")
    assert listed.returncode == 0
    header, *rows = listed.stdout.splitlines()
    assert header.split()[:3] == ["NAME", "MODE", "KERNEL"]
    assert any(row.split()[:2] == [session, "session"] for row in rows)
    assert header.split()[-3:] == ["OUTPUT", "OWNER", "CWD"]  # "LAST OUTPUT", "OWNER", "CWD"
    assert rows[-1].startswith("Warm kernels for per-call evals: ")  # the server keeps a pool of 1
    assert session in [s["name"] for s in json.loads(cli("sessions", "list", "--json").stdout)["sessions"]]
    for action in ("interrupt", "rm"):  # names are per identity: another's session of that name is not it
        other = cli("sessions", action, session, "--owner", "agent:nobody")
        assert other.returncode == 2 and f"Session not found: {session} (HTTP 404)" in other.stderr
    idle = cli("sessions", "interrupt", session)
    assert idle.stdout == f"Session {session} was running nothing; its kernel was sent an interrupt.\n"
    assert cli("sessions", "rm", session).stdout == f"Shut down session {session}.\n"
    assert session not in cli("sessions").stdout
    gone = cli("sessions", "rm", session)
    assert gone.returncode == 2 and f"Session not found: {session} (HTTP 404)" in gone.stderr


def test_artifact_command(cli: Any, server: Server) -> None:
    code = "for i in range(2000): print('line', i)"
    done = cli("eval", "--json", "-s", unique("art"), "-c", code)
    cell = json.loads(done.stdout)["cells"][0]
    assert cell["truncated"] and cell["artifact_id"]
    full = "".join(f"line {i}\n" for i in range(2000))
    with server.client() as client:
        status, body = client.request("GET", f"api/agent/artifacts/{cell['artifact_id']}")
    assert status == 200 and body.decode() == full
    assert cli("artifact", cell["artifact_id"]).stdout == full
    assert cli("artifact", cell["artifact_id"], "--tail", "3").stdout == "line 1997\nline 1998\nline 1999\n"
    missing = cli("artifact", "nope.0123")
    assert missing.returncode == 2 and "Artifact not found" in missing.stderr


# -- finding the server ----------------------------------------------------------------------------------


def test_no_server_found(runtime_dir: Path) -> None:
    done = run_cli("sessions", runtime=runtime_dir)
    assert done.returncode == 3
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1  # one line
    assert "no running Jupyter server found" in done.stderr and "JUPYTER_AGENT_URL" in done.stderr
    assert "jupyter lab" in done.stderr


def test_discovery_from_runtime_dir(server: Server, runtime_dir: Path, tmp_path: Path) -> None:
    record = server_record(runtime_dir, server)
    now = time.time()
    os.utime(record, (now - 100, now - 100))
    inside = server.root_dir / "sub" / "deeper"
    alone = run_cli("eval", "--per-call", "-c", "print('found')", runtime=runtime_dir, cwd=inside)
    assert (alone.returncode, alone.stdout, alone.stderr) == (0, "found\n", "")

    # a second running server (this test process, alive) whose root does not hold the cwd, and a stale
    # record of a process that is gone
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    newer = server_record(
        runtime_dir, server, pid=os.getpid(), root_dir=str(elsewhere), url=f"http://127.0.0.1:{free_port()}/"
    )
    os.utime(newer, (now - 50, now - 50))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    server_record(runtime_dir, server, pid=dead.pid, url="http://127.0.0.1:1/")
    picked = run_cli("sessions", runtime=runtime_dir, cwd=inside)
    assert picked.returncode == 0, picked.stderr
    assert picked.stderr == (
        f"jupyter agent: 2 Jupyter servers are running; using {server.url} (root {server.root_dir.resolve()})"
        ": its root directory holds the current directory\n"
    )
    # the same servers jupyter_server itself lists (what `jupyter server list` shows)
    from jupyter_server.serverapp import list_running_servers

    ours = sorted(info["url"] for _, info in running_servers(runtime_dir))
    assert ours == sorted(info["url"] for info in list_running_servers(str(runtime_dir)))
    # from a directory no root holds, the newest record wins (here: the unreachable one)
    outside = run_cli("sessions", runtime=runtime_dir, cwd=tmp_path)
    assert outside.returncode == 3 and "none has a root directory holding" in outside.stderr
    # --url without a token: the token comes from the record of the server at that URL
    by_url = run_cli("sessions", "--url", server.url, runtime=runtime_dir, cwd=tmp_path)
    assert by_url.returncode == 0 and by_url.stderr == ""


def test_discovery_precedence(server: Server, runtime_dir: Path) -> None:
    env = {"JUPYTER_AGENT_URL": "http://127.0.0.1:1/", "JUPYTER_TOKEN": "env-token"}
    assert find_server(env=env, directory=runtime_dir).token == "env-token"
    assert find_server("http://flag/", "flag-token", env=env, directory=runtime_dir).url == "http://flag/"
    fallback = run_cli(
        "sessions", runtime=runtime_dir, JUPYTER_AGENT_URL=server.url, JUPYTER_TOKEN=server.token
    )
    assert fallback.returncode == 0, fallback.stderr
    flags = run_cli("sessions", "--url", server.url, "--token", server.token, runtime=runtime_dir)
    assert flags.returncode == 0, flags.stderr


class TokenTrap:
    """A local HTTP listener that records the Authorization header of every request it gets (403s all)."""

    def __init__(self) -> None:
        self.authorizations: list[str | None] = []
        seen = self.authorizations

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                seen.append(self.headers.get("Authorization"))
                body = b'{"message": "no"}'
                self.send_response(403)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}/"
        self.thread = threading.Thread(target=self.http.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()
        self.thread.join()


@pytest.fixture
def trap() -> Iterator[TokenTrap]:
    listener = TokenTrap()
    yield listener
    listener.close()


def trap_record(runtime: Path, trap: TokenTrap) -> Path:
    """A record naming no token, of a live process (this one), whose URL is the trap."""
    path = runtime / f"jpserver-{os.getpid()}.json"
    info = {"pid": os.getpid(), "url": trap.url, "root_dir": str(runtime), "token": "", "version": "2"}
    path.write_text(json.dumps(info))
    path.chmod(0o600)
    return path


SECRETS = {"JUPYTER_TOKEN": "env-secret", "JUPYTER_AGENT_TOKEN": "agent-secret"}


def test_env_token_goes_to_the_users_own_server_record(runtime_dir: Path, trap: TokenTrap) -> None:
    """The control of the test below: a record the user wrote, in a directory only they can write to."""
    runtime_dir.chmod(0o700)
    trap_record(runtime_dir, trap)
    done = run_cli("sessions", runtime=runtime_dir, **SECRETS)
    assert done.returncode == 3 and "HTTP 403" in done.stderr, done.stderr
    assert trap.authorizations == ["token agent-secret"]


def test_an_empty_agent_token_is_an_error_never_the_servers_own(
    runtime_dir: Path, trap: TokenTrap, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`JUPYTER_AGENT_TOKEN=$(a command that failed)` must not fall back to the token the server recorded
    (its own: full rights): the CLI and the Python client refuse, and nothing is sent."""
    runtime_dir.chmod(0o700)
    record = trap_record(runtime_dir, trap)
    record.write_text(json.dumps({**json.loads(record.read_text()), "token": "the-servers-own"}))
    cases = [
        ({"JUPYTER_AGENT_TOKEN": ""}, (), "JUPYTER_AGENT_TOKEN is set but empty"),
        (
            {"JUPYTER_AGENT_TOKEN": "", "JUPYTER_AGENT_URL": trap.url},
            (),
            "JUPYTER_AGENT_TOKEN is set but empty",
        ),
        ({"JUPYTER_AGENT_TOKEN": " "}, (), "JUPYTER_AGENT_TOKEN is set but empty"),
        ({}, ("--token", ""), "--token is empty"),
    ]
    for env, flags, said in cases:
        done = run_cli("sessions", *flags, runtime=runtime_dir, **env)
        assert done.returncode == 3 and said in done.stderr, (env, flags, done.stderr)
    assert trap.authorizations == []
    # the Python client, finding the server the same way
    from jupyter_agent_tools.cli.discovery import EmptyToken
    from jupyter_agent_tools.client import AgentClient

    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(runtime_dir))
    monkeypatch.setenv("JUPYTER_AGENT_TOKEN", "")
    with pytest.raises(EmptyToken, match="JUPYTER_AGENT_TOKEN is set but empty"):
        AgentClient()
    assert trap.authorizations == []
    # the control: unset, the record's token is used
    monkeypatch.delenv("JUPYTER_AGENT_TOKEN")
    assert run_cli("sessions", runtime=runtime_dir).returncode == 3
    assert trap.authorizations == ["token the-servers-own"]


def _owned_by_another_user(record: Path) -> None:
    os.chown(record, 12345, 12345)


UNTRUSTED: dict[str, tuple[int, Callable[[Path], None] | None, str]] = {
    # runtime directory mode, what is done to the record, what the note says
    "record-of-another-user": (0o700, _owned_by_another_user, "belongs to another user (uid 12345)"),
    "record-others-may-write": (0o700, lambda record: record.chmod(0o666), "other users may write to"),
    "group-writable-directory": (0o770, None, "other users may write to"),
    "sticky-world-writable-directory": (0o1777, None, "other users may write to"),
}


@pytest.mark.parametrize("case", sorted(UNTRUSTED))
def test_env_token_never_goes_to_a_server_record_someone_else_could_write(
    runtime_dir: Path, trap: TokenTrap, case: str
) -> None:
    mode, spoil, why = UNTRUSTED[case]
    if spoil is _owned_by_another_user and os.geteuid() != 0:
        pytest.skip("not applicable here: giving a file to another user needs root")
    record = trap_record(runtime_dir, trap)
    if spoil is not None:
        spoil(record)
    runtime_dir.chmod(mode)
    done = run_cli("sessions", runtime=runtime_dir, **SECRETS)
    assert trap.authorizations == []  # nothing was sent to the URL in the record, with or without a token
    assert done.returncode == 3 and "no running Jupyter server found" in done.stderr, done.stderr
    assert "ignored" in done.stderr and why in done.stderr, done.stderr
    assert [info["url"] for _, info in running_servers(runtime_dir)] == []


# -- on a terminal ---------------------------------------------------------------------------------------


class Tmux:
    """A detached tmux session running one command in a 110x40 terminal.

    Its server has a short unique name (``-L``): tmux keeps the socket in its own directory
    (``/tmp/tmux-UID``), so a long TMPDIR cannot push the socket path past the 108 bytes AF_UNIX allows.
    """

    def __init__(self, command: str, env: dict[str, str]):
        self.base = ["tmux", "-L", f"jat-{uuid.uuid4().hex[:12]}"]
        self.name = "cli"
        subprocess.run(
            [*self.base, "new-session", "-d", "-s", self.name, "-x", "110", "-y", "40", command],
            check=True,
            env=env,
        )
        self.socket = subprocess.run(
            [*self.base, "display-message", "-p", "#{socket_path}"], capture_output=True, text=True
        ).stdout.strip()

    def screen(self) -> str:
        done = subprocess.run(
            [*self.base, "capture-pane", "-p", "-J", "-S", "-", "-t", self.name],
            capture_output=True,
            text=True,
        )
        return done.stdout

    def wait_for(self, text: str, timeout: float = 120) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            screen = self.screen()
            if text in screen:
                return screen
            time.sleep(0.05)
        raise AssertionError(f"{text!r} never appeared on the terminal:\n{self.screen()}")

    def keys(self, *keys: str) -> None:
        """Type ``keys`` on the terminal (``C-c``: Ctrl-C, which the terminal sends as SIGINT)."""
        subprocess.run([*self.base, "send-keys", "-t", self.name, *keys], check=True)

    def close(self) -> None:
        subprocess.run([*self.base, "kill-server"], capture_output=True)
        if self.socket:  # tmux leaves it behind
            Path(self.socket).unlink(missing_ok=True)


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_terminal_rendering(server: Server, runtime_dir: Path, tmp_path: Path) -> None:
    """On a terminal: the cell's status line goes from running to complete while it runs (the cell waits
    for a file the test writes once it has seen "running"), then the truncation warning names the command
    that prints the rest; JSON shows as a tree, a status display in its own section, an error in a box."""
    go = tmp_path / "go"
    script = tmp_path / "job.py"
    script.write_text(
        "# %% wait\nimport os, time\nprint('waiting', flush=True)\n"
        f"while not os.path.exists({str(go)!r}):\n    time.sleep(0.02)\n"
        "# %% rich\nfrom IPython.display import JSON, display\ndisplay(JSON({'answer': 42}))\n"
        "display({'application/x-omp-status': {'op': 'read', 'file': 'x.csv'}}, raw=True)\n"
        "for i in range(600): print('line', i)\n"
        "# %% fail\n1/0\n"
    )
    env = base_env(
        runtime_dir, JUPYTER_AGENT_URL=server.url, JUPYTER_AGENT_TOKEN=server.token, TERM="xterm-256color"
    )
    marker = "EXIT="
    command = (
        f"{sys.executable} -m jupyter_agent_tools.cli eval --per-call {script}; echo {marker}$?; sleep 600"
    )
    tmux = Tmux(command, env)
    try:
        running = tmux.wait_for("running")
        assert "[1/3] wait  running" in running and "[2/3] rich  pending" in running
        assert "✓ [1/3] wait  complete" not in running
        go.touch()
        screen = tmux.wait_for(marker)
    finally:
        tmux.close()
    assert "✓ [1/3] wait  complete" in screen
    assert "waiting" in screen
    assert "✓ [2/3] rich  complete" in screen
    assert "answer: 42" in screen  # the JSON tree
    assert "Status\n" in screen and "op: read · file: x.csv" in screen
    assert "✗ [3/3] fail  error" in screen and "ZeroDivisionError: division by zero" in screen
    warning = next(line for line in screen.splitlines() if "output truncated" in line)
    assert "[2/3] rich: output truncated" in warning
    command = next(line for line in screen.splitlines() if "full output:" in line).split("full output:")[1]
    assert command.split()[:3] == ["jupyter", "agent", "artifact"]
    rest = run_cli("artifact", command.split()[3], "--tail", "1", server=server, runtime=runtime_dir)
    assert rest.stdout == "line 599\n"
    assert f"{marker}1" in screen


def on_terminal(server: Server, runtime: Path, *args: str) -> tuple[str, int]:
    """Run ``jupyter agent ARGS`` on a 110x40 tmux terminal: (everything it printed, its exit code)."""
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed")
    env = base_env(
        runtime, JUPYTER_AGENT_URL=server.url, JUPYTER_AGENT_TOKEN=server.token, TERM="xterm-256color"
    )
    command = shlex.join([sys.executable, "-m", "jupyter_agent_tools.cli", *args])
    tmux = Tmux(f"{command}; echo EXIT=$?; sleep 600", env)
    try:
        screen = tmux.wait_for("EXIT=")
    finally:
        tmux.close()
    lines = [line.rstrip() for line in screen.rstrip("\n").splitlines()]
    code = int(next(line for line in lines if line.startswith("EXIT="))[5:])
    return "\n".join(line for line in lines if not line.startswith("EXIT=")).rstrip("\n") + "\n", code


def test_terminal_long_output_shows_a_screen_then_the_command_for_the_rest(
    server: Server, runtime_dir: Path
) -> None:
    """20,000 lines: the cell shows the last lines that fit the terminal, then the warning and the command
    that prints all of them (not thousands of lines of the tail first)."""
    screen, code = on_terminal(
        server, runtime_dir, "eval", "--per-call", "-c", "for i in range(20000): print('line', i)"
    )
    assert code == 0
    lines = screen.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("✓ [1/1]  complete"))
    warning = next(i for i, line in enumerate(lines) if "output truncated" in line)
    assert warning - start <= 40  # a screen of 40 rows (it printed about 18,000 lines before)
    hidden = lines[start + 1].strip()
    assert hidden.startswith("… ") and hidden.endswith(" earlier lines not shown")
    shown = int(hidden.split()[1])
    assert lines[start + 2 : warning] == [f"  line {i}" for i in range(shown, 20000)]
    assert lines[warning + 1].startswith("  full output: jupyter agent artifact ")
    artifact = lines[warning + 1].split()[-1]
    rest = run_cli("artifact", artifact, "--tail", "1", server=server, runtime=runtime_dir)
    assert rest.stdout == "line 19999\n"
    assert lines[-1].startswith("done · 1/1 cells complete · ") and lines[-1].endswith(" · per-call")


def test_terminal_notebook_run_lists_the_cells_not_run_and_names_the_notebook(
    server: Server, runtime_dir: Path
) -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# T", id="m")]
    sources = ["x = 1", "1/0", "x", "2"]
    nb.cells += [nbformat.v4.new_code_cell(source, id=f"c{i}") for i, source in enumerate(sources)]
    name = unique("stops") + ".ipynb"
    nbformat.write(nb, server.root_dir / name)
    screen, code = on_terminal(server, runtime_dir, "nb", "run", name)
    assert code == 1
    lines = screen.splitlines()
    assert lines[0].startswith("✓ [cell 1] c0  complete") and lines[1].startswith("✗ [cell 2] c1  error")
    assert lines[-3:-1] == ["· [cell 3] c2  not run", "· [cell 4] c3  not run"]
    assert lines[-1].startswith("failed · 1/4 cells complete · ") and lines[-1].endswith(f"s · {name}")


def test_timeout_shows_where_the_cell_stopped_not_the_interrupts_traceback(
    cli: Any, server: Server, runtime_dir: Path
) -> None:
    session = unique("slow")
    assert cli("eval", "-s", session, "-c", "import time").returncode == 0  # the kernel is up
    code = "print('start')\ndef wait():\n    time.sleep(30)\nwait()"
    slow = cli("eval", "-s", session, "--timeout", "2", "-c", code)
    assert slow.returncode == 124
    assert re.fullmatch(
        r"start\nStopped in Cell In\[\d+\], line 3, in wait\(\)\n----> 3     time\.sleep\(30\)\n"
        r"Command timed out after 2 seconds\n",
        slow.stdout,
    ), slow.stdout
    screen, exit_code = on_terminal(server, runtime_dir, "eval", "-s", session, "--timeout", "2", "-c", code)
    assert exit_code == 124
    assert "KeyboardInterrupt" not in screen and "Traceback" not in screen
    assert "  ----> 3     time.sleep(30)\n  Command timed out after 2 seconds\n" in screen


def test_input_says_in_one_line_that_the_call_cannot_read_stdin(
    cli: Any, server: Server, runtime_dir: Path
) -> None:
    notice = "This call cannot read stdin, so input() failed: put the value in the code instead.\n"
    done = cli("eval", "--per-call", "-c", "name = input('name? ')\nprint('got', name)")
    assert (done.stdout, done.returncode) == (notice, 1)  # the code stops at input(): nothing more
    answer = json.loads(cli("eval", "--json", "--per-call", "-c", "input()").stdout)
    assert answer["cells"][0]["stdin_requested"] is True and answer["output"] == notice
    screen, code = on_terminal(server, runtime_dir, "eval", "--per-call", "-c", "input()")
    assert code == 1
    assert screen.count("This call cannot read stdin") == 1 and "''" not in screen
    assert "StdinNotImplementedError" not in screen


def test_plain_truncation_notice_names_the_artifact_command(cli: Any, server: Server) -> None:
    done = cli("eval", "-s", unique("notice"), "-c", "for i in range(2000): print('line', i)")
    first = done.stdout.splitlines()[0]
    assert re.fullmatch(
        r"\[Showing lines \d+-2000 of 2000 \(4\.0KB limit\)\. Full: jupyter agent artifact [\w.-]+\]", first
    ), first
    assert "artifact://" not in done.stdout
    rest = cli(*first.rstrip("]").split(": ", 1)[1].split()[2:], "--tail", "1")
    assert rest.stdout == "line 1999\n"


# -- the installed entry point ---------------------------------------------------------------------------


@pytest.mark.timeout(300)
def test_jupyter_agent_entry_point(tmp_path: Path) -> None:
    """`jupyter agent --help` works once the wheel is installed: the wheel's `jupyter-agent` script is a
    jupyter subcommand. The wheel goes into a throwaway venv (the shared environment is left alone)."""
    pytest.importorskip("hatchling", reason="hatchling is needed to build the wheel offline")
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER", "PYTHON", "PIP_"))}
    wheels = tmp_path / "wheels"
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-q",
            "-w",
            str(wheels),
            str(REPO),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        env=clean,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = wheels.glob("jupyter_agent_tools-*.whl")
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False, symlinks=os.name != "nt").create(env_dir)
    bin_dir = env_dir / ("Scripts" if os.name == "nt" else "bin")
    purelib = subprocess.run(
        [str(bin_dir / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
    ).stdout.strip()
    # dependencies (httpx, rich, jupyter_core) come from this environment, after the venv's own packages
    Path(purelib, "_host_env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    installed = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(bin_dir / "python"),
            "install",
            "--no-deps",
            "--no-index",
            "-q",
            str(wheel),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=clean,
    )
    assert installed.returncode == 0, installed.stdout + installed.stderr
    assert (bin_dir / "jupyter-agent").exists()
    jupyter = Path(sys.executable).parent / "jupyter"
    env = dict(clean, PATH=os.pathsep.join([str(bin_dir), clean.get("PATH", "")]))
    helped = subprocess.run(
        [str(jupyter), "agent", "--help"], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60
    )
    assert helped.returncode == 0, helped.stderr
    assert helped.stdout.startswith("usage: jupyter agent")


def test_nb_show_pages_text_and_one_output(cli: Any, server: Server, tmp_path: Path) -> None:
    name = unique("read") + ".ipynb"
    nb = nbformat.v4.new_notebook()
    long = "".join(f"line {i}\n" for i in range(1000))
    figure = nbformat.v4.new_code_cell("plot()", id="fig", execution_count=2)
    figure.outputs = [
        nbformat.v4.new_output("stream", name="stdout", text=long),
        nbformat.v4.new_output("display_data", data={"text/plain": "<Figure>", "image/png": PNG_1X1}),
    ]
    nb.cells = [nbformat.v4.new_markdown_cell("# T", id="m"), figure, nbformat.v4.new_code_cell("x", id="x")]
    nbformat.write(nb, server.root_dir / name)

    page = cli("nb", "show", name, "--start", "1", "--limit", "1")
    assert page.returncode == 0, page.stderr
    assert page.stdout.startswith(f"{name}: 3 cells, hash ") and "[1] code id=fig" in page.stdout
    assert "[0] markdown" not in page.stdout and "[2] code" not in page.stdout
    assert (
        cli("nb", "show", name, "--start", "1", "--limit", "1", "--cell", "2").returncode == 2
    )  # not in page
    text = cli("nb", "show", name, "--text", "--limit", "2")
    assert text.returncode == 0, text.stderr
    assert "# cells 0-1 of 3; next page: start=2\n" in text.stdout
    assert "### [1] code id=fig exec=2\nplot()\n-> out[0] stream stdout\nline 0\n" in text.stdout
    assert "[image/png 70 bytes]" in text.stdout
    # how to read one output is this CLI's command (not the HTTP route), and it works as printed
    assert (
        f"# one output in full: jupyter agent nb output {name} --cell CELL N [--mime TYPE]\n" in text.stdout
    )
    assert f"[full: jupyter agent nb output {name} --cell fig 0 --mime text/plain]" in text.stdout
    assert "/api/agent/" not in text.stdout and "?mime=" not in text.stdout
    printed = re.search(r"\[full: jupyter agent (.+?)\]", text.stdout)
    assert printed is not None and cli(*shlex.split(printed.group(1))).stdout == long
    one = cli("nb", "show", name, "--text", "--cell", "2")
    assert "# 1 of 3 cells by id\n" in one.stdout and "### [2] code id=x\nx" in one.stdout

    full = cli("nb", "output", name, "--cell", "fig", "0", "--mime", "text/plain")
    assert full.returncode == 0 and full.stdout == long
    as_json = json.loads(cli("nb", "output", name, "--cell", "1", "1").stdout)
    assert as_json["mimes"] == ["image/png", "text/plain"] and as_json["cell_id"] == "fig"
    binary = cli("nb", "output", name, "--cell", "fig", "1", "--mime", "image/png")
    assert binary.returncode == 2 and "give --save FILE" in binary.stderr
    target = tmp_path / "fig.png"
    saved = cli("nb", "output", name, "--cell", "fig", "1", "--mime", "image/png", "--save", str(target))
    assert saved.returncode == 0 and target.read_bytes() == base64.b64decode(PNG_1X1)
    missing = cli("nb", "output", name, "--cell", "fig", "1", "--mime", "text/html")
    assert missing.returncode == 2 and "MIME types: image/png, text/plain" in missing.stderr


# -- agent tokens ----------------------------------------------------------------------------------------

AGENT_TOKENS = [
    "--ServerApp.identity_provider_class=jupyter_agent_tools.auth.AgentIdentityProvider",
    "--ServerApp.authorizer_class=jupyter_agent_tools.auth.AgentAuthorizer",
]


def test_token_commands_and_an_agent_using_its_token(runtime_dir: Path, tmp_path: Path) -> None:
    """``jupyter agent token create|list|revoke`` with the server's token; the agent then works with its
    own token (JUPYTER_AGENT_TOKEN), within its scopes and paths, until it is revoked."""
    root = tmp_path / "root"
    (root / "reports").mkdir(parents=True)
    with jupyter_server(root_dir=root, extra_args=AGENT_TOKENS) as s:
        write_notebook(s, "reports/r.ipynb", ["print('report')"])
        write_notebook(s, "secret.ipynb", ["print('secret')"])
        made = run_cli(
            "token", "create", "bot", "--scopes", "read,execute", "--paths", "reports/**", "--expires", "8h",
            server=s, runtime=runtime_dir,
        )  # fmt: skip
        assert made.returncode == 0, made.stderr
        token = made.stdout.splitlines()[0]
        assert token.startswith("jat_") and "shown this once" in made.stdout
        assert "user agent:bot" in made.stdout and "valid until 20" in made.stdout
        assert "paths reports/**" in made.stdout, made.stdout
        own: dict[str, Any] = {"server": s, "runtime": runtime_dir}
        as_json = run_cli("token", "create", "other", "--scopes", "edit", "--json", **own)
        assert json.loads(as_json.stdout)["token"].startswith("jat_"), as_json.stderr
        # a token that asks before editing but runs code unasked: its asks do not bind it, and it is said
        asks = run_cli("token", "create", "asker", "--scopes", "read,edit,execute", "--ask", "edit", **own)
        assert asks.returncode == 0 and asks.stdout.startswith("jat_"), asks.stderr
        assert "Warning:" in asks.stderr and "jpserver-" in asks.stderr, asks.stderr
        listing = run_cli("token", "list", **own)
        assert listing.returncode == 0, listing.stderr
        row = next(line for line in listing.stdout.splitlines() if line.startswith("bot "))
        assert row.split()[:4] == ["bot", "active", "read,execute", "reports/**"], listing.stdout
        assert token not in listing.stdout

        agent = {"JUPYTER_AGENT_URL": s.url, "JUPYTER_AGENT_TOKEN": token}
        ran = run_cli("eval", "-c", "print(6 * 7)", runtime=runtime_dir, **agent)
        assert ran.returncode == 0 and ran.stdout == "42\n", ran.stderr
        shown = run_cli("nb", "show", "reports/r.ipynb", runtime=runtime_dir, **agent)
        assert shown.returncode == 0 and "print('report')" in shown.stdout, shown.stderr
        hidden = run_cli("nb", "show", "secret.ipynb", runtime=runtime_dir, **agent)
        assert hidden.returncode == 2 and "Notebook not found" in hidden.stderr, hidden.stderr
        edit = run_cli("nb", "insert", "reports/r.ipynb", "--content", "x", runtime=runtime_dir, **agent)
        # a scope the token lacks is not a bad token: said so, and its own exit code
        assert edit.returncode == 4 and "needs the 'edit' scope" in edit.stderr, edit.stderr
        assert "lacks the scope" in edit.stderr and "check the token" not in edit.stderr, edit.stderr
        managing = run_cli("token", "list", runtime=runtime_dir, **agent)
        assert managing.returncode == 4 and "agent_tokens" in managing.stderr, managing.stderr
        assert "check the token" not in managing.stderr, managing.stderr

        bad = run_cli("token", "create", "x", "--scopes", "read", "--expires", "8x", **own)
        assert bad.returncode == 2 and "--expires" in bad.stderr
        short = run_cli("token", "create", "x", "--scopes", "read", "--expires", "5s", **own)
        assert short.returncode == 2 and "--expires must be at least 1m" in short.stderr, short.stderr
        assert "expires_in" not in short.stderr
        revoked = run_cli("token", "revoke", "bot", **own)
        assert revoked.returncode == 0 and "Revoked agent token 'bot'" in revoked.stdout, revoked.stderr
        after = run_cli("eval", "-c", "1", runtime=runtime_dir, **agent)
        assert after.returncode == 3 and "was revoked at" in after.stderr, after.stderr
        assert "check the token" in after.stderr, after.stderr
        # a JupyterHub user's API token is read from JUPYTERHUB_API_TOKEN (here: the server's own token)
        hub = run_cli("sessions", runtime=runtime_dir, JUPYTER_AGENT_URL=s.url, JUPYTERHUB_API_TOKEN=s.token)
        assert hub.returncode == 0, hub.stderr


def test_terminal_listings_start_at_their_first_line_and_name_the_notebook(
    cli: Any, server: Server, runtime_dir: Path
) -> None:
    """On a terminal, `nb log`, `nb diff` and `runs` print their table or report as is (no "✓ " pushing
    the first line, a header, out of its columns); `eval --notebook` ends its summary with the path."""
    name = write_notebook(server, unique("term") + ".ipynb", ["a = 1"])
    edited = json.loads(cli("nb", "edit", name, "--cell", "cell0", "--content", "a = 2", "--json").stdout)
    change_id = edited["change_id"]
    log, code = on_terminal(server, runtime_dir, "nb", "log", name)
    assert code == 0 and log.startswith(f"change {change_id} "), log
    diff, code = on_terminal(server, runtime_dir, "nb", "diff", name, change_id)
    assert code == 0 and diff.startswith(f"change {change_id} ") and "+a = 2" in diff, diff
    assert cli("eval", "--detach", "-c", "1").returncode == 0  # a run for the listing
    runs, code = on_terminal(server, runtime_dir, "runs")
    assert code == 0 and runs.split()[:3] == ["ID", "STATE", "KIND"], runs
    ran, code = on_terminal(server, runtime_dir, "eval", "--notebook", name, "-c", "6 * 7")
    assert code == 0 and "42" in ran, ran
    summary = next(line for line in ran.splitlines() if "cells complete" in line)
    assert summary.startswith("done · 1/1 cells complete · ") and summary.endswith(f"s · {name}"), summary


def test_nb_log_diff_undo(cli: Any, server: Server) -> None:
    name = write_notebook(server, unique("ledger") + ".ipynb", ["a = 1", "b = 2"])
    original = (server.root_dir / name).read_bytes()
    edited = json.loads(cli("nb", "edit", name, "--cell", "cell0", "--content", "a = 10", "--json").stdout)
    assert edited["recorded"] is True
    change_id = edited["change_id"]
    log = cli("nb", "log", name)
    assert log.returncode == 0, log.stderr
    assert f"change {change_id} " in log.stdout and "via cli: edit 1 cell; cells: cell0 edited" in log.stdout
    listing = json.loads(cli("nb", "log", name, "--json").stdout)
    assert [c["via"] for c in listing["changes"]] == ["cli"]  # the CLI says it is the CLI
    diff = cli("nb", "diff", name, change_id)
    assert diff.returncode == 0 and "-a = 1\n+a = 10\n" in diff.stdout and "cell cell0: edited" in diff.stdout
    # a later change of that cell: refused, nothing written, exit 2 with the cell named
    with server.client() as client:
        client.json(
            "POST", f"api/agent/notebooks/{name}", {"action": "edit", "cell_id": "cell0", "content": "p"}
        )
    before = (server.root_dir / name).read_bytes()
    refused = cli("nb", "undo", name, change_id)
    assert refused.returncode == 2 and "cell cell0: its source changed since" in refused.stderr
    assert "(HTTP 409)" in refused.stderr and (server.root_dir / name).read_bytes() == before
    latest = json.loads(cli("nb", "log", name, "--json", "--limit", "1").stdout)["changes"][0]["id"]
    assert cli("nb", "undo", name, latest).returncode == 0
    undone = cli("nb", "undo", name, change_id)
    assert undone.returncode == 0, undone.stderr
    assert undone.stdout.startswith(f"Undid change {change_id} (edit 1 cell) of {name}. Hash: ")
    assert (server.root_dir / name).read_bytes() == original
    assert cli("nb", "diff", name, "99999").returncode == 2  # 404
    assert cli("nb", "undo", name, "x").returncode == 2  # 400


def test_client_ledger_methods(server: Server) -> None:
    name = write_notebook(server, unique("client") + ".ipynb", ["a = 1"])
    with AgentClient(server.url, server.token) as client:
        first = client.read_notebook(name)
        edited = client.edit_notebook(name, {"action": "insert", "content": "x", "cell_id": "x"})
        since = client.read_notebook(name, since=first["hash"])
        assert since["changes_since"]["cells"][0]["id"] == "x"  # type: ignore[typeddict-item]
        [entry] = client.notebook_changes(name)["changes"]
        assert entry["id"] == edited["change_id"] and entry["via"] == "http"  # type: ignore[typeddict-item]
        assert client.notebook_change(name, entry["id"])["cells"][0]["what"] == ["inserted"]
        assert entry["id"] in [c["id"] for c in client.changes(limit=1000)["changes"]]
        assert client.undo_change(name, entry["id"])["undoes"] == entry["id"]
        with pytest.raises(AgentAPIError) as refused:
            client.undo_change(name, entry["id"])  # the cell it inserted is gone: a conflict
        assert refused.value.status == 409

    async def use_async() -> None:
        async with AsyncAgentClient(server.url, server.token, client="cli") as client:
            await client.edit_notebook(name, {"action": "insert", "content": "y"})
            listing = await client.notebook_changes(name, limit=1)
            assert listing["changes"][0]["via"] == "cli"
            change = await client.notebook_change(name, listing["changes"][0]["id"])
            assert change["kind"] == "edit"
            assert (await client.undo_change(name, change["id"]))["undoes"] == change["id"]
            assert (await client.changes(since="2000-01-01T00:00:00Z"))["changes"]

    asyncio.run(use_async())

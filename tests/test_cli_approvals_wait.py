"""``jupyter agent nb ...`` under the approval gate (real server subprocess, real CLI entry point, real agent
tokens): the command says at once that it waits for the person, as ``eval`` does, waits for the decision,
and its exit code says what came of it: 0 approved and done, 6 denied, 7 expired, 8 still pending."""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook, new_output
from test_cli import base_env, run_cli

from jupyter_agent_tools.cli import exits
from jupyter_agent_tools.testing.server import Server, jupyter_server

pytestmark = pytest.mark.timeout(300)

RULES = [{"who": "agent:*", "actions": ["edit", "execute"], "decision": "ask"}]


def gate_config(directory: Path, **policy: Any) -> Path:
    config = {
        "ServerApp": {
            "identity_provider_class": "jupyter_agent_tools.auth.AgentIdentityProvider",
            "authorizer_class": "jupyter_agent_tools.auth.AgentAuthorizer",
        },
        "ApprovalPolicy": {"rules": RULES, **policy},
        "KernelPool": {"size": 0},
    }
    path = directory / "gate_config.json"
    path.write_text(json.dumps(config))
    return path


def agent_token(server: Server, name: str) -> str:
    with server.client() as client:
        body = {"name": name, "scopes": ["read", "edit", "execute"]}
        return str(client.json("POST", "api/agent/tokens", body, expect=201)["token"])


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    # the server's own wait is the request's whole life: "at once" is then whether it said so at all
    config = gate_config(tmp_path_factory.mktemp("config"), wait=600)
    with jupyter_server(extra_args=[f"--config={config}"]) as s:
        yield s


@pytest.fixture(scope="module")
def token(server: Server) -> str:
    return agent_token(server, "nb-bot")


def write_notebook(root: Path, name: str) -> Path:
    cell = new_code_cell("print(6 * 7)", id="c1", outputs=[new_output("stream", name="stdout", text="42\n")])
    path = root / name
    nbformat.write(new_notebook(cells=[cell, new_code_cell("x = 1", id="c2")]), str(path))
    return path


class Agent:
    """``jupyter agent ARGS`` run as the agent, its stderr read line by line as it comes."""

    def __init__(self, server: Server, token: str, runtime: Path, *args: str):
        env = base_env(runtime, JUPYTER_AGENT_URL=server.url, JUPYTER_AGENT_TOKEN=token)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "jupyter_agent_tools.cli", *args, "--plain"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.err: list[str] = []
        assert self.process.stderr is not None
        stderr = self.process.stderr
        self.reader = threading.Thread(target=lambda: [self.lines.put(line) for line in stderr], daemon=True)
        self.reader.start()

    def wait_for(self, text: str, timeout: float = 120) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                break
            self.err.append(line)
            if text in line:
                return line
        raise AssertionError(f"{text!r} not said within {timeout} s; stderr so far: {''.join(self.err)!r}")

    def finish(self, timeout: float = 60) -> tuple[int, str, str]:
        assert self.process.stdout is not None
        try:
            self.process.wait(timeout=timeout)  # (not communicate(): the reader thread has stderr)
            out = self.process.stdout.read()
        finally:
            self.process.kill()
        self.reader.join(timeout=10)  # (stderr read to its end)
        while not self.lines.empty():
            self.err.append(self.lines.get())
        return self.process.returncode, out, "".join(self.err)


def decide(server: Server, runtime: Path, approval_id: int, *args: str) -> None:
    decided = run_cli("approvals", *args[:1], str(approval_id), *args[1:], server=server, runtime=runtime)
    assert decided.returncode == 0, decided.stderr


def waiting_id(line: str) -> int:
    return int(line.split("Waiting for approval ", 1)[1].split(" ", 1)[0])


def test_an_edit_says_it_waits_and_is_done_once_approved(server: Server, token: str, tmp_path: Path) -> None:
    path = write_notebook(server.root_dir, "clear.ipynb")
    agent = Agent(server, token, tmp_path, "nb", "clear", "clear.ipynb", "--all")
    line = agent.wait_for("Waiting for approval")  # at once: the server itself would wait 600 s
    assert "in JupyterLab (" in line and "clear.ipynb)" in line, line
    assert nbformat.read(str(path), as_version=4).cells[0].outputs  # not before the person approves
    decide(server, tmp_path, waiting_id(line), "approve")
    code, out, err = agent.finish()
    assert code == exits.OK, (out, err)
    assert "Approved by" in out and "Hash:" in out, out
    assert nbformat.read(str(path), as_version=4).cells[0].outputs == []


def test_a_denied_edit_exits_6_with_the_reason(server: Server, token: str, tmp_path: Path) -> None:
    path = write_notebook(server.root_dir, "deny.ipynb")
    before = path.read_bytes()
    agent = Agent(server, token, tmp_path, "nb", "insert", "deny.ipynb", "--content", "print('no')")
    line = agent.wait_for("Waiting for approval")
    decide(server, tmp_path, waiting_id(line), "deny", "--reason", "not today")
    code, out, err = agent.finish()
    assert code == exits.DENIED == 6, (out, err)
    assert "denied" in err and "not today" in err and "Nothing was done" in err, err
    assert path.read_bytes() == before


def test_still_pending_when_it_stops_waiting_it_exits_8_and_it_is_done_once_approved(
    server: Server, token: str, tmp_path: Path
) -> None:
    path = write_notebook(server.root_dir, "later.ipynb")
    agent = Agent(
        server,
        token,
        tmp_path,
        "nb",
        "edit",
        "later.ipynb",
        "--cell",
        "c2",
        "--content",
        "x = 2",
        "--approval-wait",
        "0.5",
    )
    line = agent.wait_for("Waiting for approval")
    code, out, err = agent.finish()
    assert code == exits.PENDING == 8, (out, err)
    approval_id = waiting_id(line)
    assert f"approval {approval_id}" in err and "still pending" in err and "done once approved" in err, err
    assert f"jupyter agent approvals show {approval_id}" in err
    decide(server, tmp_path, approval_id, "approve")
    for _ in range(100):
        if nbformat.read(str(path), as_version=4).cells[1].source == "x = 2":
            break
        time.sleep(0.05)
    assert nbformat.read(str(path), as_version=4).cells[1].source == "x = 2"


def test_an_expired_request_exits_7_for_an_edit_and_for_an_eval(tmp_path: Path) -> None:
    config = gate_config(tmp_path, timeout=1.5)
    with jupyter_server(extra_args=[f"--config={config}"]) as short:
        bot = agent_token(short, "hasty")
        path = write_notebook(short.root_dir, "expire.ipynb")
        before = path.read_bytes()
        agent = Agent(short, bot, tmp_path, "nb", "delete", "expire.ipynb", "--cell", "c2")
        agent.wait_for("Waiting for approval")
        code, out, err = agent.finish()
        assert code == exits.EXPIRED == 7, (out, err)
        assert "expired" in err and "Nothing was done" in err, err
        assert path.read_bytes() == before
        agent = Agent(short, bot, tmp_path, "eval", "-c", "print('never')")
        agent.wait_for("Waiting for approval")
        code, out, err = agent.finish()
        assert code == exits.EXPIRED, (out, err)
        assert "never" not in out


def test_a_session_delete_says_it_waits_at_once(tmp_path: Path) -> None:
    """``sessions rm`` under a ``kernel`` rule: the DELETE carries ``?approval_wait=0`` (it has no body),
    so the CLI says it waits at once rather than after the server's default wait."""
    config = gate_config(tmp_path, wait=600)  # without ?approval_wait=0 the line would not come in time
    rules = json.loads(config.read_text())
    rules["ApprovalPolicy"]["rules"] = [{"who": "agent:*", "actions": ["kernel"], "decision": "ask"}]
    config.write_text(json.dumps(rules))
    with jupyter_server(extra_args=[f"--config={config}"]) as server:
        token = agent_token(server, "rm-bot")
        made = Agent(server, token, tmp_path, "eval", "-s", "doomed", "-c", "x = 1").finish()
        assert made[0] == exits.OK, made
        agent = Agent(server, token, tmp_path, "sessions", "rm", "doomed")
        line = agent.wait_for("Waiting for approval")
        decide(server, tmp_path, waiting_id(line), "approve")
        code, out, err = agent.finish()
        assert code == exits.OK, (out, err)
        with server.client() as client:  # the person sees every identity's sessions
            sessions = client.json("GET", "api/agent/sessions")["sessions"]
        assert "doomed" not in [s["name"] for s in sessions]

"""The approval gate from a terminal: an agent's ``jupyter agent eval`` waits in tmux while the person
decides with ``jupyter agent approvals`` (real server subprocess, real kernels, real agent tokens)."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_cli import Tmux, base_env, run_cli

from jupyter_agent_tools.testing.server import Client, Server, jupyter_server

pytestmark = pytest.mark.timeout(300)

CONFIG = {
    "ServerApp": {
        "identity_provider_class": "jupyter_agent_tools.auth.AgentIdentityProvider",
        "authorizer_class": "jupyter_agent_tools.auth.AgentAuthorizer",
    },
    "ApprovalPolicy": {"rules": [{"who": "agent:*", "actions": ["execute"], "decision": "ask"}]},
    "KernelPool": {"size": 0},
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    config = tmp_path_factory.mktemp("config") / "gate_config.json"
    config.write_text(json.dumps(CONFIG))
    with jupyter_server(extra_args=[f"--config={config}"]) as s:
        yield s


@pytest.fixture(scope="module")
def agent_token(server: Server) -> str:
    with server.client() as client:
        answer: dict[str, Any] = client.json(
            "POST", "api/agent/tokens", {"name": "cli-bot", "scopes": ["read", "execute"]}, expect=201
        )
    return str(answer["token"])


def person(server: Server, runtime: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, server=server, runtime=runtime)


def first_pending(server: Server, runtime: Path) -> int:
    for _ in range(400):
        listed = person(server, runtime, "approvals", "--json")
        pending = json.loads(listed.stdout)["pending"] if listed.returncode == 0 else []
        if pending:
            return int(pending[0]["id"])
        time.sleep(0.05)
    raise AssertionError("no approval request appeared")


def test_the_agent_waits_in_its_terminal_and_runs_once_the_person_approves(
    server: Server, agent_token: str, tmp_path: Path
) -> None:
    env = base_env(
        tmp_path, JUPYTER_AGENT_URL=server.url, JUPYTER_AGENT_TOKEN=agent_token, TERM="xterm-256color"
    )
    command = shlex.join([sys.executable, "-m", "jupyter_agent_tools.cli", "eval", "-c", "print(6 * 7)"])
    tmux = Tmux(f"{command}; echo EXIT=$?; sleep 600", env)
    try:
        waiting = tmux.wait_for("Waiting for approval")
        approval_id = first_pending(server, tmp_path)
        assert f"Waiting for approval {approval_id} in JupyterLab" in waiting
        shown = person(server, tmp_path, "approvals", "show", str(approval_id))
        assert shown.returncode == 0 and "agent:cli-bot asks to run 1 cell" in shown.stdout
        assert "print(6 * 7)" in shown.stdout
        refused = run_cli(
            "approvals",
            "approve",
            str(approval_id),
            runtime=tmp_path,
            JUPYTER_AGENT_URL=server.url,
            JUPYTER_AGENT_TOKEN=agent_token,
        )
        assert refused.returncode != 0 and "agent_approvals" in refused.stderr  # an agent cannot approve
        approved = person(server, tmp_path, "approvals", "approve", str(approval_id))
        assert approved.returncode == 0 and f"Approval {approval_id} approved" in approved.stdout
        screen = tmux.wait_for("EXIT=")
    finally:
        tmux.close()
    assert "42" in screen and "EXIT=0" in screen


def test_a_denial_ends_the_agents_command_with_the_reason(
    server: Server, agent_token: str, tmp_path: Path
) -> None:
    env = base_env(tmp_path, JUPYTER_AGENT_URL=server.url, JUPYTER_AGENT_TOKEN=agent_token)
    agent = subprocess.Popen(
        [sys.executable, "-m", "jupyter_agent_tools.cli", "eval", "-c", "print('never')"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        approval_id = first_pending(server, tmp_path)
        denied = person(server, tmp_path, "approvals", "deny", str(approval_id), "--reason", "not today")
        assert denied.returncode == 0, denied.stderr
        out, err = agent.communicate(timeout=60)
    finally:
        agent.kill()
    assert agent.returncode == 6, (out, err)  # exits.DENIED
    assert "denied" in err and "not today" in err and "never" not in out
    listed = person(server, tmp_path, "approvals")
    assert f"{approval_id}  denied" in listed.stdout


def test_a_restart_expires_pending_requests_and_nothing_runs_unapproved(tmp_path: Path) -> None:
    config = dict(CONFIG)
    config["ApprovalPolicy"] = {**CONFIG["ApprovalPolicy"], "db_path": str(tmp_path / "approvals.db")}
    config["RunRegistry"] = {"runs_db_path": str(tmp_path / "runs.db")}
    path = tmp_path / "gate_config.json"
    path.write_text(json.dumps(config))
    marker = tmp_path / "ran"
    code = f"open({str(marker)!r}, 'w').close()"
    root = tmp_path / "root"  # the same root: a server reads the run records of its root
    root.mkdir()
    with (
        jupyter_server(root_dir=root, extra_args=[f"--config={path}"]) as first,
        first.client() as person_client,
    ):
        token = person_client.json(
            "POST", "api/agent/tokens", {"name": "bot", "scopes": ["execute", "read"]}, expect=201
        )["token"]
        with Client(first.url, token) as agent_client:
            started = agent_client.json(
                "POST", "api/agent/eval", {"cells": [{"code": code}], "approval_wait": 0}, expect=202
            )
    with (
        jupyter_server(root_dir=root, extra_args=[f"--config={path}"]) as second,
        second.client() as person_client,
    ):
        approval = person_client.json("GET", f"api/agent/approvals/{started['approval_id']}")
        assert approval["state"] == "expired" and approval["decided_by"] == "server restart"
        assert approval["details"]["cells"][0]["code"] == code  # the record survives
        run = person_client.json("GET", f"api/agent/runs/{started['run_id']}")
        assert run["state"] == "lost"
        status, _ = person_client.request(
            "POST", f"api/agent/approvals/{started['approval_id']}", {"decision": "approve"}
        )
        assert status == 409
    assert not marker.exists()  # nothing ran, before or after the restart

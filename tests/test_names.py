"""How people and states are named to agents and in the panel (issue 42, "Names"): the server's own token
is "the server's owner", never its hash; a run waiting for the person says so; a request counts the cells
it runs; the CLI's messages name the option used and its exit codes say a run waits. Real server
subprocess, real kernels, real agent tokens; the CLI as a subprocess."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook
from test_cli import REPO, run_cli

from jupyter_agent_tools.testing.server import Client, Server, jupyter_server

pytestmark = pytest.mark.timeout(300)

OWNER = "the server's owner"
CONFIG = {
    "ServerApp": {
        "identity_provider_class": "jupyter_agent_tools.auth.AgentIdentityProvider",
        "authorizer_class": "jupyter_agent_tools.auth.AgentAuthorizer",
    },
    "ApprovalPolicy": {"rules": [{"who": "agent:*", "actions": ["execute", "edit"], "decision": "ask"}]},
    "KernelPool": {"size": 0},
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    config = tmp_path_factory.mktemp("config") / "names_config.json"
    config.write_text(json.dumps(CONFIG))
    with jupyter_server(extra_args=[f"--config={config}"]) as s:
        yield s


@pytest.fixture(scope="module")
def person(server: Server) -> Iterator[Client]:
    with server.client() as client:
        yield client


@pytest.fixture(scope="module")
def agent(server: Server, person: Client) -> Iterator[Client]:
    answer = person.json(
        "POST", "api/agent/tokens", {"name": "names-bot", "scopes": ["read", "edit", "execute"]}, 201
    )
    with Client(server.url, answer["token"]) as client:
        client.token = answer["token"]  # type: ignore[attr-defined]
        yield client


def answer_of(client: Client, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    status, content = client.request(method, path, body)
    return status, json.loads(content) if content else None


def outcome(person: Client, approval_id: int) -> dict[str, Any]:
    """The approval once what it approved was done (its ``outcome``), at most 60 s."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        approval: dict[str, Any] = person.json("GET", f"api/agent/approvals/{approval_id}")
        if approval.get("outcome"):
            return approval
        time.sleep(0.05)
    raise AssertionError(f"approval {approval_id} never had an outcome")


def test_the_person_is_the_servers_owner_never_a_token_hash(
    server: Server, person: Client, agent: Client
) -> None:
    """Who decided, who changed a cell, whose session: named as the server's owner wherever an agent or
    the panel is told (before: ``token-`` and 8 hex digits of the token's hash)."""
    nbformat.write(new_notebook(cells=[new_code_cell("x = 1", id="a")]), str(server.root_dir / "who.ipynb"))
    # the person edits and runs code themselves (no rule asks the person)
    person.json("POST", "api/agent/notebooks/who.ipynb", {"action": "insert", "content": "y = 2"})
    person.json("POST", "api/agent/eval", {"session": "mine", "cells": [{"code": "1"}]})
    # an agent's edit waits for the person, who approves it
    status, pending = answer_of(
        agent,
        "POST",
        "api/agent/notebooks/who.ipynb",
        {"action": "insert", "content": "z = 3", "approval_wait": 0},
    )
    assert status == 202, pending
    decided = person.json("POST", f"api/agent/approvals/{pending['approval_id']}", {"decision": "approve"})
    assert decided["decided_by"] == OWNER, decided
    done = outcome(person, pending["approval_id"])
    assert done["outcome"]["status"] == 200, done
    # what the agent is told of its request, and what the panel lists
    seen_by_agent = agent.json("GET", f"api/agent/approvals/{pending['approval_id']}")
    assert seen_by_agent["decided_by"] == OWNER
    changes = person.json("GET", "api/agent/notebooks/who.ipynb/changes")["changes"]
    by = {(c["user"], c["approved_by"]) for c in changes}
    assert by == {(OWNER, None), ("agent:names-bot", OWNER)}, changes
    sessions = person.json("GET", "api/agent/sessions")
    mine = [s for s in sessions["sessions"] if s["name"] == "mine"]
    assert [s["owner"] for s in mine] == [OWNER], sessions
    told = json.dumps([decided, seen_by_agent, changes, sessions, agent.json("GET", "api/agent/approvals")])
    assert re.search(r"token-[0-9a-f]{8}", told) is None, told
    # the name the listing shows addresses the session too
    owner = urllib.parse.quote(OWNER)
    assert person.request("POST", f"api/agent/sessions/mine/interrupt?owner={owner}", {})[0] == 200
    assert person.request("DELETE", f"api/agent/sessions/mine?owner={owner}")[0] == 204


def test_a_detached_eval_waiting_for_the_person_answers_awaiting_approval(
    person: Client, agent: Client
) -> None:
    """docs/api.md: still pending, the 202 is a detached run in state ``awaiting_approval`` (before: the
    202 said ``queued``, its task not started yet)."""
    body = {"cells": [{"code": "print('later')"}], "session": "waits", "approval_wait": 0}
    status, started = answer_of(agent, "POST", "api/agent/eval", body)
    assert status == 202, started
    assert started["state"] == "awaiting_approval" and started["approval_id"], started
    run = agent.json("GET", f"api/agent/runs/{started['run_id']}")
    assert run["state"] == "awaiting_approval", run
    person.json("POST", f"api/agent/approvals/{started['approval_id']}", {"decision": "deny"})


def test_a_run_request_counts_the_code_cells_it_runs(server: Server, person: Client, agent: Client) -> None:
    """A notebook run of a notebook with a markdown cell asks to run its code cells (before: "run 3
    cells", the markdown cell counted as a cell to run)."""
    cells = [
        new_markdown_cell("# Title", id="m"),
        new_code_cell("a = 1", id="c1"),
        new_code_cell("a + 1", id="c2"),
    ]
    nbformat.write(new_notebook(cells=cells), str(server.root_dir / "count.ipynb"))
    status, started = answer_of(
        agent, "POST", "api/agent/notebooks/count.ipynb/run", {"all": True, "approval_wait": 0}
    )
    assert status == 202, started
    approval = person.json("GET", f"api/agent/approvals/{started['approval_id']}")
    assert approval["summary"] == "run 2 cells in count.ipynb", approval
    person.json("POST", f"api/agent/approvals/{started['approval_id']}", {"decision": "deny"})


def test_runs_show_exits_8_while_the_run_waits_for_the_person(
    server: Server, person: Client, agent: Client, tmp_path: Path
) -> None:
    """`jupyter agent runs show` of a run awaiting approval exits 8, as any command the person has not
    decided yet (before: 1, as if it had failed)."""
    body = {"cells": [{"code": "print('later')"}], "session": "shown", "approval_wait": 0, "detach": True}
    status, started = answer_of(agent, "POST", "api/agent/eval", body)
    assert status == 202, started
    shown = run_cli(
        "runs",
        "show",
        started["run_id"],
        runtime=tmp_path,
        JUPYTER_AGENT_URL=server.url,
        JUPYTER_AGENT_TOKEN=agent.token,  # type: ignore[attr-defined]
    )
    assert shown.returncode == 8, (shown.stdout, shown.stderr)
    assert "awaiting_approval" in shown.stdout
    person.json("POST", f"api/agent/approvals/{started['approval_id']}", {"decision": "deny"})


def test_a_bad_duration_names_the_option_it_was_given_to(server: Server, tmp_path: Path) -> None:
    """`approvals approve ID --for 10x` names --for (before: --expires, an option of another command)."""
    done = run_cli("approvals", "approve", "1", "--for", "10x", server=server, runtime=tmp_path)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "--for wants a number and a unit" in done.stderr and "--expires" not in done.stderr, done.stderr
    done = run_cli(
        "token", "create", "x", "--scopes", "read", "--expires", "10x", server=server, runtime=tmp_path
    )
    assert done.returncode == 2 and "--expires wants a number and a unit" in done.stderr, done.stderr


def test_docs_cli_names_every_option_of_token_create() -> None:
    """docs/cli.md's row for `token create` names each of its options (before: not `--ask`), as `jupyter
    agent token create --help` lists them."""
    shown = subprocess.run(
        [sys.executable, "-m", "jupyter_agent_tools.cli", "token", "create", "--help"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    common = {"--help", "--url", "--token", "--json", "--plain"}
    options = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]+)", shown.stdout)) - common
    assert {"--scopes", "--paths", "--expires", "--ask"} <= options, shown.stdout
    row = next(
        line
        for line in (REPO / "docs" / "cli.md").read_text().splitlines()
        if line.startswith("| `token create")
    )
    signature = row.split("|")[1]
    assert [o for o in sorted(options) if o not in signature] == [], signature

"""What the approval gate costs an agent's eval and edit when nothing asks the person.

Two server subprocesses with agent tokens on: one as shipped (no approval rule: the gate answers "allow"
at its first check), one with 50 rules that all name other agents (every rule is looked at for each call,
none matches). The same agent calls, interleaved (rotating which goes first) after a warm-up, each server on
its own keep-alive connection:

- ``POST /api/agent/eval``: ``1 + 1`` in a warm session;
- ``POST /api/agent/notebooks/{path}``: one cell's source replaced (the edit pipeline, a write on disk).

The figure of the issue: with rules that do not apply, eval and edit take the same time as with none
(ratio within 2%).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .common import BenchResult, Row, httpx, interleaved, jupyter_server, profile_path, quick, run_meta

NAME = "approvals"
TITLE = "Approval gate: eval and edit with 50 rules that do not apply vs none"

REPEAT, QUICK_REPEAT, WARMUP = 400, 20, 30
AGENT_ARGS = [
    "--ServerApp.identity_provider_class=jupyter_agent_tools.auth.AgentIdentityProvider",
    "--ServerApp.authorizer_class=jupyter_agent_tools.auth.AgentAuthorizer",
    "--KernelPool.size=0",
]
RULES = [{"who": f"agent:other-{i}", "actions": ["execute", "edit"], "decision": "ask"} for i in range(50)]
EVAL, EDIT = "POST /api/agent/eval (1 + 1)", "POST /api/agent/notebooks/nb.ipynb (edit 1 cell)"
NONE, OTHERS = "no rule (as shipped)", "50 rules for other agents"
TARGET = 1.02


def run(options: argparse.Namespace) -> BenchResult:
    if httpx is None:
        raise RuntimeError("this benchmark needs httpx (pip install httpx, or the 'bench' extra)")
    repeat = QUICK_REPEAT if quick(options) else REPEAT
    with tempfile.TemporaryDirectory(prefix="bench-approvals-") as tmp:
        config = Path(tmp) / "rules.json"  # a list of dicts: a config file, not a command-line option
        config.write_text(json.dumps({"ApprovalPolicy": {"rules": RULES}}))
        ruled_args = [*AGENT_ARGS, f"--config={config}"]
        return _run(options, repeat, ruled_args)


def _run(options: argparse.Namespace, repeat: int, ruled_args: list[str]) -> BenchResult:
    with (
        jupyter_server(extra_args=AGENT_ARGS) as shipped,
        jupyter_server(extra_args=ruled_args, profile_to=profile_path(options, NAME)) as ruled,
    ):
        clients: dict[str, Any] = {}
        for variant, server in ((NONE, shipped), (OTHERS, ruled)):
            own = {"Authorization": f"token {server.token}"}
            with httpx.Client(base_url=server.url, headers=own, timeout=60) as admin:
                answer = admin.post("api/agent/tokens", json={"name": "bench", "scopes": ["edit", "execute"]})
                answer.raise_for_status()
                token = answer.json()["token"]
            client = httpx.Client(
                base_url=server.url, headers={"Authorization": f"token {token}"}, timeout=60
            )
            client.post(
                "api/agent/notebooks/nb.ipynb", json={"action": "create", "cells": [{"source": "x = 0"}]}
            ).raise_for_status()
            clients[variant] = client
        try:
            variants: dict[tuple[str, str], Callable[[], Any]] = {}
            for variant, client in clients.items():
                variants[(EVAL, variant)] = _poster(client, "api/agent/eval", {"cells": [{"code": "1 + 1"}]})
                variants[(EDIT, variant)] = _editor(client)
            samples = interleaved(variants, repeat, WARMUP)
        finally:
            for client in clients.values():
                client.close()
    rows = []
    for case in (EVAL, EDIT):
        rows.append(Row(case, NONE, samples[(case, NONE)]))
        rows.append(Row(case, OTHERS, samples[(case, OTHERS)], baseline=NONE))
    result = BenchResult(NAME, TITLE, rows, meta=run_meta())
    result.meta.update(repetitions=repeat, warmup=WARMUP)
    for case in (EVAL, EDIT):
        result.add_ratio(case, OTHERS, NONE)
        ratio = result.row(case, OTHERS).stats["median"] / result.row(case, NONE).stats["median"]
        result.add_check(case, "median ratio, 50 rules that do not apply / none", ratio, TARGET)
    result.notes.append(
        f"{repeat} repetitions after {WARMUP} untimed warm-ups, the four variants interleaved, each server "
        "on its own keep-alive connection. With no rule the gate's first check answers 'allow' (no request "
        "is described or recorded); with rules, each is matched against the agent's name first."
    )
    return result


def _poster(client: Any, url: str, body: dict[str, Any]) -> Callable[[], Any]:
    def post() -> Any:
        response = client.post(url, json=body)
        if response.status_code != 200:
            raise RuntimeError(f"POST {url}: {response.status_code} {response.text[:200]}")
        return response

    return post


def _editor(client: Any) -> Callable[[], Any]:
    count = [0]

    def edit() -> Any:
        count[0] += 1
        body = {"action": "edit", "cell_index": 0, "content": f"x = {count[0]}"}
        response = client.post("api/agent/notebooks/nb.ipynb", json=body)
        if response.status_code != 200:
            raise RuntimeError(f"edit: {response.status_code} {response.text[:200]}")
        return response

    return edit

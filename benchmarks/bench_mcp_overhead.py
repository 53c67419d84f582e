"""What the MCP endpoint adds to a call of the same service through its route.

One server subprocess, one keep-alive HTTP connection, the same token. Pairs, interleaved (rotating which
goes first) after a warm-up:

- ``eval 1+1`` on a warm session kernel: ``POST /api/agent/eval`` (JSON answer) vs ``tools/call eval``
  on ``POST /api/agent/mcp`` in a 2025-11-25 session (JSON answer: no progress token);
- ``list sessions``, no kernel involved: ``GET /api/agent/sessions`` vs ``tools/call session_list``.

The MCP call pays the JSON-RPC envelope, the session lookup, the authorizer call, the tool-result
rendering (text content plus the route's answer as structured content) and a larger answer.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from .common import BenchResult, Row, httpx, interleaved, jupyter_server, profile_path, quick, run_meta

NAME = "mcp_overhead"
TITLE = "MCP overhead: tools/call on /api/agent/mcp vs the route it wraps (same service, same server)"

REPEAT, QUICK_REPEAT, WARMUP = 300, 30, 20
EVAL_CASE, LIST_CASE = "eval 1+1, warm kernel", "list sessions"
ROUTE, MCP = "route (JSON)", "MCP tools/call (JSON)"


def run(options: argparse.Namespace) -> BenchResult:
    if httpx is None:
        raise RuntimeError("this benchmark needs httpx (pip install httpx, or the 'bench' extra)")
    repeat = QUICK_REPEAT if quick(options) else REPEAT
    with jupyter_server(profile_to=profile_path(options, NAME)) as server:
        auth = {"Authorization": f"token {server.token}"}
        with httpx.Client(base_url=server.url, headers=auth, timeout=120) as client:
            mcp = _session(client)
            eval_body = {"cells": [{"code": "1+1"}], "session": "bench"}
            assert client.post("api/agent/eval", json=eval_body).json()["output"] == "2\n"
            ids = iter(range(1, 10**9))

            def tool(name: str, arguments: dict[str, Any]) -> Any:
                call = {"jsonrpc": "2.0", "id": next(ids), "method": "tools/call"}
                call["params"] = {"name": name, "arguments": arguments}
                response = client.post("api/agent/mcp", content=json.dumps(call), headers=mcp)
                result = response.json()["result"]
                if result["isError"]:
                    raise RuntimeError(f"tools/call {name} failed: {result}")
                return result

            variants = {
                (EVAL_CASE, ROUTE): lambda: client.post("api/agent/eval", json=eval_body).raise_for_status(),
                (EVAL_CASE, MCP): lambda: tool("eval", eval_body),
                (LIST_CASE, ROUTE): lambda: client.get("api/agent/sessions").raise_for_status(),
                (LIST_CASE, MCP): lambda: tool("session_list", {}),
            }
            samples = interleaved(variants, repeat, WARMUP)
    result = BenchResult(
        NAME,
        TITLE,
        [
            Row(EVAL_CASE, ROUTE, samples[(EVAL_CASE, ROUTE)]),
            Row(EVAL_CASE, MCP, samples[(EVAL_CASE, MCP)], baseline=ROUTE),
            Row(LIST_CASE, ROUTE, samples[(LIST_CASE, ROUTE)]),
            Row(LIST_CASE, MCP, samples[(LIST_CASE, MCP)], baseline=ROUTE),
        ],
        meta=run_meta(),
    )
    result.meta.update(repetitions=repeat, warmup=WARMUP)
    for case in (EVAL_CASE, LIST_CASE):
        result.add_ratio(case, MCP, ROUTE, target=1.2, op="<=")
    added = {
        case: (result.row(case, MCP).stats["median"] - result.row(case, ROUTE).stats["median"]) * 1e3
        for case in (EVAL_CASE, LIST_CASE)
    }
    result.notes += [
        f"Median time MCP adds per call: {added[EVAL_CASE]:.2f} ms on an eval, {added[LIST_CASE]:.2f} ms on "
        "a session listing (JSON-RPC envelope, session lookup, authorizer, result rendering, larger answer).",
        f"{repeat} repetitions after {WARMUP} untimed warm-ups; the four variants interleaved on one "
        "keep-alive connection, rotating which goes first.",
    ]
    return result


def _session(client: Any) -> dict[str, str]:
    """Open an MCP session (protocol 2025-11-25): the headers of its later requests."""
    init = {"jsonrpc": "2.0", "id": 0, "method": "initialize"}
    init["params"] = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "bench"}}
    response = client.post("api/agent/mcp", json=init, headers={"Accept": "application/json"})
    response.raise_for_status()
    headers = {
        "Mcp-Session-Id": response.headers["mcp-session-id"],
        "MCP-Protocol-Version": "2025-11-25",
        "Accept": "application/json",
        "Content-Type": "application/json",
    }
    notified = client.post(
        "api/agent/mcp", json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers
    )
    notified.raise_for_status()
    return headers

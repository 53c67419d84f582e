"""What agent tokens add to a request: authentication (token lookup) and authorization (scopes, paths).

Two server subprocesses: one as shipped, one with agent tokens enabled (``AgentIdentityProvider`` and
``AgentAuthorizer``). The same requests, interleaved (rotating which goes first) after a warm-up, each
variant on its own keep-alive connection:

- ``GET /api/status``: a jupyter_server route that does almost nothing (authorized as ``read`` on ``api``);
- ``GET /api/contents/reports/a.txt``: a small file through the contents API (``read`` on ``contents``,
  and with path globs the path is normalized, resolved on disk and matched).

Variants: the server's own token on the plain server and on the agent-enabled server, an agent token with
scopes, an agent token with scopes and the path glob ``reports/**``. The figure of the issue is the median
time an agent token adds over the server's own token on the same server (target: at most 0.2 ms).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from .common import BenchResult, Row, httpx, interleaved, jupyter_server, profile_path, quick, run_meta

NAME = "auth"
TITLE = "Agent tokens: time an agent token adds to a request over the server's own token"

REPEAT, QUICK_REPEAT, WARMUP = 1500, 50, 50
AGENT_ARGS = [
    "--ServerApp.identity_provider_class=jupyter_agent_tools.auth.AgentIdentityProvider",
    "--ServerApp.authorizer_class=jupyter_agent_tools.auth.AgentAuthorizer",
]
STATUS, CONTENTS = "GET /api/status", "GET /api/contents/reports/a.txt"
PLAIN = "server token, agent tokens off"
OWN = "server token, agent tokens on"
AGENT = "agent token (read)"
SCOPED = "agent token (read, paths reports/**)"
TARGET_MS = 0.2


def run(options: argparse.Namespace) -> BenchResult:
    if httpx is None:
        raise RuntimeError("this benchmark needs httpx (pip install httpx, or the 'bench' extra)")
    repeat = QUICK_REPEAT if quick(options) else REPEAT
    with (
        jupyter_server() as plain,
        jupyter_server(extra_args=AGENT_ARGS, profile_to=profile_path(options, NAME)) as enabled,
    ):
        for server in (plain, enabled):
            (server.root_dir / "reports").mkdir()
            (server.root_dir / "reports" / "a.txt").write_text("a small file\n")
        own = {"Authorization": f"token {enabled.token}"}
        with httpx.Client(base_url=enabled.url, headers=own, timeout=60) as admin:
            agent = _token(admin, "bench", None)
            scoped = _token(admin, "bench-paths", ["reports/**"])
        clients = {
            PLAIN: httpx.Client(base_url=plain.url, headers={"Authorization": f"token {plain.token}"}),
            OWN: httpx.Client(base_url=enabled.url, headers=own),
            AGENT: httpx.Client(base_url=enabled.url, headers={"Authorization": f"token {agent}"}),
            SCOPED: httpx.Client(base_url=enabled.url, headers={"Authorization": f"token {scoped}"}),
        }
        try:
            variants: dict[tuple[str, str], Callable[[], Any]] = {}
            for variant, client in clients.items():
                for case, url in ((STATUS, "api/status"), (CONTENTS, "api/contents/reports/a.txt")):
                    variants[(case, variant)] = _getter(client, url)
            samples = interleaved(variants, repeat, WARMUP)
        finally:
            for client in clients.values():
                client.close()
    rows = []
    for case in (STATUS, CONTENTS):
        rows.append(Row(case, PLAIN, samples[(case, PLAIN)]))
        rows += [
            Row(case, v, samples[(case, v)], baseline=OWN if v != OWN else PLAIN)
            for v in (OWN, AGENT, SCOPED)
        ]
    result = BenchResult(NAME, TITLE, rows, meta=run_meta())
    result.meta.update(repetitions=repeat, warmup=WARMUP)
    notes = []
    for case in (STATUS, CONTENTS):
        result.add_ratio(case, OWN, PLAIN)
        for variant in (AGENT, SCOPED):
            result.add_ratio(case, variant, OWN)
            added = (result.row(case, variant).stats["median"] - result.row(case, OWN).stats["median"]) * 1e3
            result.add_check(
                case, f"median ms {variant} adds over the server's token", added, TARGET_MS, unit=" ms"
            )
        enabling = (result.row(case, OWN).stats["median"] - result.row(case, PLAIN).stats["median"]) * 1e3
        notes.append(
            f"{case}: enabling agent tokens changes a server-token request by {enabling:+.3f} ms (median)."
        )
    result.notes += [
        *notes,
        f"{repeat} repetitions after {WARMUP} untimed warm-ups; the eight variants interleaved, each on its "
        "own keep-alive connection, rotating which goes first. Two server subprocesses on this machine.",
    ]
    return result


def _token(client: Any, name: str, paths: list[str] | None) -> str:
    body: dict[str, Any] = {"name": name, "scopes": ["read"]}
    if paths:
        body["paths"] = paths
    response = client.post("api/agent/tokens", json=body)
    response.raise_for_status()
    return str(response.json()["token"])


def _getter(client: Any, url: str) -> Callable[[], Any]:
    def get() -> Any:
        response = client.get(url)
        if response.status_code != 200:
            raise RuntimeError(f"GET {url}: {response.status_code} {response.text[:200]}")
        return response

    return get

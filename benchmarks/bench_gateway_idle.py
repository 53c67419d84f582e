"""What idle eval sessions cost a kernel gateway (issue 46): requests per idle session per minute.

Two servers side by side, each in gateway mode against one real ``jupyter_kernel_gateway`` through its own
counting proxy (tests/gateway_harness.py's ``FaultProxy``, which sees every request the server sends):

- ``gateway defaults``: the server as it starts on a gateway (``EvalSessionManager.heartbeat_interval``
  60 s there; the sweep leaves liveness to the heartbeat);
- ``heartbeat 5 s``: ``--EvalSessionManager.heartbeat_interval=5``, the default before issue 46.

Each opens ``SESSIONS`` eval sessions (one ``print(1)`` each), then both stay idle for ``WINDOW`` seconds
while the proxies count the server's requests. Target: at most 1 request per idle session per minute with
the defaults. Before issue 46 the sweep also asked the gateway every 30 s (2 more a minute): measured on
the code before it (commit 07830f5) with this benchmark's setup, 14.0 per session per minute.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from .common import BenchResult, Row, jupyter_server, run_meta

NAME = "gateway_idle"
TITLE = "Idle eval sessions on a kernel gateway: requests per session per minute"

SESSIONS = 4
WINDOW, QUICK_WINDOW = 120.0, 20.0
DEFAULTS, OLD = "gateway defaults", "heartbeat 5 s (the default before issue 46)"
CASE = f"{SESSIONS} idle sessions"
TARGET = 1.0


def _harness() -> Any:
    tests = str(Path(__file__).resolve().parent.parent / "tests")
    if tests not in sys.path:
        sys.path.insert(0, tests)
    import gateway_harness

    return gateway_harness


def run(options: argparse.Namespace) -> BenchResult:
    harness = _harness()
    window = QUICK_WINDOW if getattr(options, "quick", False) else WINDOW
    gateway = harness.start_kernel_gateway()
    proxies = {name: harness.FaultProxy(gateway.url).start() for name in (DEFAULTS, OLD)}
    counted: dict[str, list[tuple[str, str, int]]] = {}
    try:
        extra = {DEFAULTS: [], OLD: ["--EvalSessionManager.heartbeat_interval=5"]}
        with (
            jupyter_server(extra_args=_args(proxies[DEFAULTS].url, gateway.token, extra[DEFAULTS])) as new,
            jupyter_server(extra_args=_args(proxies[OLD].url, gateway.token, extra[OLD])) as old,
            new.client() as new_client,
            old.client() as old_client,
        ):
            for client in (new_client, old_client):
                for i in range(SESSIONS):
                    answer = client.json(
                        "POST", "api/agent/eval", {"cells": [{"code": "print(1)"}], "session": f"s{i}"}
                    )
                    if answer["output"] != "1\n":
                        raise RuntimeError(f"eval failed: {answer}")
            for proxy in proxies.values():
                proxy.reset()
            started = time.monotonic()
            time.sleep(window)
            elapsed = time.monotonic() - started
            counted = {name: [r for r in proxy.requests] for name, proxy in proxies.items()}
            kernels = len(gateway.list_kernels())
    finally:
        for proxy in proxies.values():
            proxy.stop()
        gateway.stop()
    result = BenchResult(NAME, TITLE, [], meta=run_meta())
    rates = {}
    for name, requests in counted.items():
        rate = len(requests) / SESSIONS * 60 / elapsed
        rates[name] = rate
        paths = sorted({f"{method} {path.rsplit('/', 1)[0]}/…" for method, path, _ in requests})
        result.rows.append(
            Row(
                CASE,
                name,
                [elapsed],
                extra={
                    "requests": len(requests),
                    "per session per minute": round(rate, 2),
                    "kinds": ", ".join(paths) or "none",
                },
            )
        )
    result.add_check(
        CASE, f"gateway requests per idle session per minute, {DEFAULTS}", rates[DEFAULTS], TARGET
    )
    result.meta.update(window_seconds=round(elapsed, 1), sessions=SESSIONS, kernels_on_gateway=kernels)
    result.notes += [
        f"{SESSIONS} idle eval sessions per server, {elapsed:.0f} s idle (the 'median ms' column). "
        f"With the gateway defaults: {rates[DEFAULTS]:.2f} requests per session per minute; with the 5 s "
        f"heartbeat of before: {rates[OLD]:.2f} (the code before issue 46 also checked at each 30 s sweep: "
        "14.0 measured on it).",
        f"Kernels on the gateway during the window: {kernels} ({SESSIONS} per server; no warm pool on a "
        "gateway by default, one more per server before issue 46).",
        "Each request counted is a GET of a kernel's model (jupyter_server's is_alive of a gateway kernel); "
        "500 users with 4 sessions each: "
        f"{500 * SESSIONS * rates[DEFAULTS] / 60:.1f} requests a second with the defaults, "
        f"{500 * SESSIONS * 14 / 60:.0f} before.",
    ]
    return result


def _args(url: str, token: str, extra: list[str]) -> list[str]:
    return [f"--GatewayClient.url={url}", f"--GatewayClient.auth_token={token}", *extra]

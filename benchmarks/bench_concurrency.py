"""Benchmark 5 of issue 6: 4 sessions x 8 concurrent requests each; throughput, and per-session order.

Each request of session ``s`` runs ``order.append(k)`` (``k`` = its sequence number within the session) and
answers ``len(order)``. Bursts of 32 requests, measured from the first send to the last answer:

- ``raw clients, pipelined``: the floor: four warm kernels of the same server (``POST /api/kernels``), one
  ``jupyter_client`` AsyncKernelClient each, which sends its 8 ``execute_request`` at once and waits for
  every reply and idle (a kernel runs its shell requests in order);
- ``agent, 32 concurrent``: the 32 ``POST /api/agent/eval`` requests fired at once over 32 keep-alive
  connections, on four warm sessions;
- ``agent, sequential``: the same 32 requests one at a time (what concurrency buys).

After each burst every session's list must hold each number exactly once. With all 32 fired at once the
order in which the server *receives* the requests of a session is not defined, so order is checked
separately in ordered bursts: the first request of each session holds its kernel (``time.sleep``); requests
1..7 are then sent one by one, each only after the server reports it queued (``queue_depth`` of
``GET /api/agent/sessions``); every session must then run them in exactly that order, and each answer must
show its own position.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

from .common import (
    BenchResult,
    Row,
    Server,
    connect_raw_client,
    jupyter_server,
    profile_path,
    quick,
    run_meta,
    start_server_kernel,
)

NAME = "concurrency"
TITLE = "Concurrency: 4 sessions x 8 concurrent eval requests; throughput and per-session order"

SESSIONS, PER_SESSION = 4, 8
BURSTS, QUICK_BURSTS = 30, 3
ORDERED_BURSTS, QUICK_ORDERED_BURSTS = 3, 1
HOLD_SECONDS = 1.0
CASE = f"{SESSIONS} sessions x {PER_SESSION} requests"
RAW, CONCURRENT, SEQUENTIAL = "raw clients, pipelined", "agent, 32 concurrent", "agent, sequential"


def request_code(burst: int, k: int) -> str:
    return f"order_{burst}.append({k})\nlen(order_{burst})"


class AsyncAPI:
    """An httpx AsyncClient with the server's token and enough keep-alive connections for a burst."""

    def __init__(self, server: Server, connections: int = 48):
        import httpx

        self.client = httpx.AsyncClient(
            base_url=server.url,
            headers={"Authorization": f"token {server.token}"},
            timeout=300,
            limits=httpx.Limits(max_connections=connections, max_keepalive_connections=connections),
        )

    async def warm(self, n: int) -> None:
        """Open ``n`` keep-alive connections now, so that a burst does not pay for connecting."""
        await asyncio.gather(*(self.get("api/agent/sessions") for _ in range(n)))

    async def get(self, path: str) -> Any:
        response = await self.client.get(path)
        response.raise_for_status()
        return response.json()

    async def eval(self, session: str, code: str) -> dict[str, Any]:
        body = json.dumps({"cells": [{"code": code}], "session": session})
        response = await self.client.post("api/agent/eval", content=body)
        if response.status_code != 200:
            raise RuntimeError(f"eval in {session}: HTTP {response.status_code}: {response.text[:500]}")
        answer: dict[str, Any] = response.json()
        if answer["cells"][0]["status"] != "complete":
            raise RuntimeError(f"eval in {session} failed: {answer}")
        return answer

    async def close(self) -> None:
        await self.client.aclose()


async def raw_pipelined(kc: Any, codes: list[str]) -> list[dict[str, Any]]:
    """Send every execute at once on one client; wait for all the replies and idles; return the replies."""
    msg_ids = [kc.execute(code, allow_stdin=False, stop_on_error=False) for code in codes]
    pending_idle = set(msg_ids)
    while pending_idle:
        msg = await kc.get_iopub_msg(timeout=60)
        parent = msg["parent_header"].get("msg_id")
        if msg["header"]["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            pending_idle.discard(parent)
    replies: dict[str, dict[str, Any]] = {}
    while len(replies) < len(msg_ids):
        reply = await kc.get_shell_msg(timeout=60)
        parent = reply["parent_header"].get("msg_id")
        if parent in pending_idle or parent not in msg_ids:
            continue
        replies[parent] = reply["content"]
    return [replies[m] for m in msg_ids]


def run(options: argparse.Namespace) -> BenchResult:
    return asyncio.run(_run(options))


async def _run(options: argparse.Namespace) -> BenchResult:
    bursts = QUICK_BURSTS if quick(options) else BURSTS
    ordered_bursts = QUICK_ORDERED_BURSTS if quick(options) else ORDERED_BURSTS
    names = [f"s{i}" for i in range(SESSIONS)]
    samples: dict[str, list[float]] = {RAW: [], CONCURRENT: [], SEQUENTIAL: []}
    unordered_in_send_order = 0
    ordered_checked = 0
    with jupyter_server(profile_to=profile_path(options, NAME)) as server, server.client() as client:
        api = AsyncAPI(server)
        kernel_ids = [start_server_kernel(client) for _ in names]
        clients = [await connect_raw_client(server, k) for k in kernel_ids]
        try:
            await api.warm(SESSIONS * PER_SESSION + 8)
            for name in names:  # start and initialize the four sessions
                await api.eval(name, "1+1")

            async def read_lists(burst: int) -> list[list[int]]:
                answers = await asyncio.gather(*(api.eval(n, f"print(order_{burst})") for n in names))
                return [json.loads(a["cells"][0]["output"]) for a in answers]

            async def reset_lists(burst: int) -> None:
                await asyncio.gather(*(api.eval(n, f"order_{burst} = []") for n in names))
                for kc in clients:
                    await raw_pipelined(kc, [f"order_{burst} = []"])

            async def raw_burst(burst: int) -> None:
                codes = [request_code(burst, k) for k in range(PER_SESSION)]
                all_replies = await asyncio.gather(*(raw_pipelined(kc, codes) for kc in clients))
                for replies in all_replies:
                    if any(r["status"] != "ok" for r in replies):
                        raise RuntimeError(f"raw execute failed: {replies}")

            async def concurrent_burst(burst: int) -> None:
                await asyncio.gather(
                    *(api.eval(n, request_code(burst, k)) for k in range(PER_SESSION) for n in names)
                )

            async def sequential_burst(burst: int) -> None:
                for k in range(PER_SESSION):
                    for n in names:
                        await api.eval(n, request_code(burst, k))

            variants = {RAW: raw_burst, CONCURRENT: concurrent_burst, SEQUENTIAL: sequential_burst}
            order = list(variants)
            for b in range(-1, bursts):  # b == -1: warm-up, not timed
                for j, variant in enumerate(order[b % 3 :] + order[: b % 3]):
                    burst = (b + 1) * 3 + j
                    await reset_lists(burst)
                    start = time.perf_counter()
                    await variants[variant](burst)
                    elapsed = time.perf_counter() - start
                    if b >= 0:
                        samples[variant].append(elapsed)
                    if variant == RAW:  # a kernel runs its shell requests in order: check it did
                        check = f"assert order_{burst} == list(range({PER_SESSION})), order_{burst}"
                        for kc in clients:
                            (reply,) = await raw_pipelined(kc, [check])
                            if reply["status"] != "ok":
                                raise RuntimeError(
                                    f"raw clients: order or count wrong: {reply.get('evalue')}"
                                )
                        continue
                    lists = await read_lists(burst)
                    for name, got in zip(names, lists, strict=True):
                        if sorted(got) != list(range(PER_SESSION)):
                            raise RuntimeError(f"{variant}, session {name}: requests lost or repeated: {got}")
                    if variant == CONCURRENT and b >= 0:
                        unordered_in_send_order += sum(got == list(range(PER_SESSION)) for got in lists)
                if b >= 0 and (b + 1) % 10 == 0:
                    print(f"  burst {b + 1}/{bursts}", flush=True)

            for o in range(ordered_bursts):
                await ordered_burst(api, names, 10_000 + o)
                ordered_checked += 1
            print(f"  {ordered_checked} ordered burst(s): order held in every session", flush=True)
        finally:
            for kc in clients:
                kc.stop_channels()
            for kernel_id in kernel_ids:
                client.request("DELETE", f"api/kernels/{kernel_id}")
            await api.close()
        rss = server.rss_bytes()

    rows = []
    for variant in (RAW, CONCURRENT, SEQUENTIAL):
        per_second = SESSIONS * PER_SESSION / (sorted(samples[variant])[len(samples[variant]) // 2])
        rows.append(
            Row(
                CASE,
                variant,
                samples[variant],
                baseline=None if variant == RAW else RAW,
                extra={"requests/s (median burst)": round(per_second, 1)},
            )
        )
    result = BenchResult(NAME, TITLE, rows, meta=run_meta())
    total = bursts * SESSIONS
    result.meta.update(
        bursts=bursts,
        ordered_bursts=ordered_checked,
        order_held_in_ordered_bursts=True,
        concurrent_session_lists_in_send_order=f"{unordered_in_send_order}/{total}",
        server_rss_mb_at_end=None if rss is None else round(rss / 1e6, 1),
    )
    ratio = result.add_ratio(CASE, CONCURRENT, RAW, throughput=True)
    speedup = result.add_ratio(CASE, CONCURRENT, SEQUENTIAL, throughput=True)
    result.notes += [
        f"Throughput of 32 concurrent agent requests: {ratio['median_ratio']:.2f}x the raw pipelined clients "
        f"and {speedup['median_ratio']:.2f}x the same requests sent one at a time. No target was set for "
        "throughput.",
        f"Per-session order: held in all {ordered_checked} ordered bursts ({SESSIONS} sessions x "
        f"{PER_SESSION} requests, requests 1..7 queued behind a {HOLD_SECONDS:g} s first request, each "
        "sent after the server reported the previous one queued): every session ran them in the order "
        "received and every answer showed its own position. No request was lost or run twice in any "
        f"burst. In the fire-at-once bursts, {unordered_in_send_order} of {total} session lists came out "
        "in send order (there the arrival order at the server is not defined, so this is informational).",
        f"{bursts} timed bursts per variant after one untimed round, interleaved, rotating which goes "
        "first; each burst appends to fresh lists. The client (httpx, asyncio) runs in the benchmark "
        "process on the same 2 CPUs as the server and the four kernels.",
    ]
    return result


async def ordered_burst(api: AsyncAPI, names: list[str], burst: int) -> None:
    """Queue requests 1..7 of every session, one at a time, behind a holding request 0; check the order."""
    code0 = f"import time\norder_{burst} = [0]\ntime.sleep({HOLD_SECONDS})\nlen(order_{burst})"
    tasks: dict[str, list[asyncio.Task[dict[str, Any]]]] = {n: [] for n in names}
    for name in names:
        tasks[name].append(asyncio.ensure_future(api.eval(name, code0)))
    await _wait_sessions(api, {n: (True, 0) for n in names})
    for k in range(1, PER_SESSION):
        for name in names:
            tasks[name].append(asyncio.ensure_future(api.eval(name, request_code(burst, k))))
            await _wait_sessions(api, {name: (True, k)})
    depth = {s["name"]: s["queue_depth"] for s in (await api.get("api/agent/sessions"))["sessions"]}
    if any(depth[n] != PER_SESSION - 1 for n in names):
        raise RuntimeError(
            f"the hold ended before every request was queued ({depth}); raise HOLD_SECONDS on this machine"
        )
    for name in names:
        answers = await asyncio.gather(*tasks[name])
        outputs = [a["cells"][0]["output"] for a in answers]
        if outputs != [f"{k + 1}\n" for k in range(PER_SESSION)]:
            raise RuntimeError(f"session {name}: order not held: answers {outputs}")
        final = await api.eval(name, f"print(order_{burst})")
        if json.loads(final["cells"][0]["output"]) != list(range(PER_SESSION)):
            raise RuntimeError(f"session {name}: order not held: {final['cells'][0]['output']}")


async def _wait_sessions(api: AsyncAPI, want: dict[str, tuple[bool, int]], timeout: float = 10.0) -> None:
    """Poll until each named session is (busy, queue_depth) as wanted."""
    deadline = time.monotonic() + timeout
    while True:
        state = {
            s["name"]: (s["busy"], s["queue_depth"])
            for s in (await api.get("api/agent/sessions"))["sessions"]
        }
        if all(state.get(n) == w for n, w in want.items()):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"sessions did not reach {want} in {timeout:g} s: {state}")
        await asyncio.sleep(0.002)

"""Issue 36.10: one 100 MB output message (an unflushed print), the raw client vs the agent's answers.

A cell prints 100 MB of 100-byte lines without flushing: ipykernel sends it as ONE iopub stream message.
Interleaved on two warm kernels of one server (the stream benchmark's helpers):

- ``raw client``: a ``jupyter_client`` AsyncKernelClient of this process drains iopub until idle;
- ``agent stream``: ``POST /api/agent/eval`` as NDJSON on a warm session, every line decoded;
- ``agent JSON``: the same eval answered as one JSON object (its tail; the artifact holds it all).

The server receives the message whole, checks its signature, decodes it, sanitizes and counts the text
and writes it to the artifact before any of it can go to the client: that serial work is what the agent
adds to the raw client's time. Also one line of 100 MB without a newline
(``sys.stdout.write``), which a regex once rescanned whole per message (4x slower). Target: the agent stream
at >= 0.75x the raw client's throughput.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

from .bench_stream import MB, agent_stream, cell_code
from .common import (
    BenchResult,
    Row,
    connect_raw_client,
    jupyter_server,
    profile_path,
    quick,
    raw_execute,
    run_meta,
    start_server_kernel,
)

NAME = "one_message"
TITLE = "One 100 MB output message (unflushed print): raw client vs agent NDJSON stream and JSON answer"

SIZE_MB, REPEAT = 100, 5
QUICK_SIZE_MB, QUICK_REPEAT = 10, 1
TARGET = 0.75
RAW, STREAM, JSON_ANSWER = "raw client (drain iopub)", "agent stream (NDJSON)", "agent JSON answer"


def run(options: argparse.Namespace) -> BenchResult:
    return asyncio.run(_run(options))


async def _run(options: argparse.Namespace) -> BenchResult:
    size_mb, repeat = (QUICK_SIZE_MB, QUICK_REPEAT) if quick(options) else (SIZE_MB, REPEAT)
    cases = {
        f"{size_mb} MB in one message": cell_code(size_mb, flush=False),
        # one line with no newline at all (progress bars, \r output): the sink must not rescan it
        # (its return value assigned: shown as the cell's result it would be counted as output too)
        f"{size_mb} MB in one message, no newline": f"import sys; _ = sys.stdout.write('y' * {size_mb * MB})",
    }
    samples = {(case, variant): [] for case in cases for variant in (RAW, STREAM, JSON_ANSWER)}
    with jupyter_server(profile_to=profile_path(options, NAME)) as server, server.client() as client:
        client.json("POST", "api/agent/eval", {"cells": [{"code": "1+1"}], "session": "one"})
        kernel_id = start_server_kernel(client)
        kc = await connect_raw_client(server, kernel_id)
        try:
            for case, code in cases.items():
                body = {"cells": [{"code": code}], "session": "one", "timeout": 300}
                await raw_execute(kc, code, timeout=600)  # warm-up of both paths
                agent_stream(client, body)
                for i in range(repeat):
                    order = (RAW, STREAM, JSON_ANSWER) if i % 2 == 0 else (JSON_ANSWER, STREAM, RAW)
                    for variant in order:
                        elapsed = await _timed(variant, kc, client, code, body, size_mb)
                        samples[case, variant].append(elapsed)
                        print(f"  {case}, {variant}: {size_mb / elapsed:.1f} MB/s", flush=True)
        finally:
            kc.stop_channels()
            client.request("DELETE", f"api/kernels/{kernel_id}")
    rows = [
        Row(
            case,
            variant,
            samples[case, variant],
            baseline=None if variant == RAW else RAW,
            extra={"MB/s (median run)": round(size_mb / statistics.median(samples[case, variant]), 1)},
        )
        for case in cases
        for variant in (RAW, STREAM, JSON_ANSWER)
    ]
    result = BenchResult(NAME, TITLE, rows, meta=run_meta())
    result.meta.update(size_bytes=size_mb * MB, repetitions=repeat)
    for case in cases:
        result.add_ratio(case, STREAM, RAW, target=TARGET, op=">=", throughput=True)
        result.add_ratio(case, JSON_ANSWER, RAW, op=">=", throughput=True)
    result.notes += [
        f"{repeat} runs of each variant, alternating the order, after a warm-up of both kernels; the "
        "machine (2 CPUs) is shared by the kernel, the server and this client.",
        "What the agent adds is serial: the server can start on the message only once it has all of it "
        "(signature, JSON decode, then the sink's control check, line count and artifact write); the raw "
        "client does the same decode in its own process. See one_message_notes.md for the profile.",
    ]
    return result


async def _timed(variant: str, kc: Any, client: Any, code: str, body: dict[str, Any], size_mb: int) -> float:
    """Seconds ``variant`` takes to get all ``size_mb`` MB of ``code``'s output."""
    start = time.perf_counter()
    if variant == RAW:
        reply, got = await raw_execute(kc, code, timeout=600)
        ok = reply["status"] == "ok" and got == size_mb * MB
    elif variant == STREAM:
        _, _, _, result = agent_stream(client, body)
        ok = result["cells"][0]["total_bytes"] == size_mb * MB
    else:
        answer = client.json("POST", "api/agent/eval", body)
        ok = answer["cells"][0]["total_bytes"] == size_mb * MB
    elapsed = time.perf_counter() - start
    if not ok:
        raise RuntimeError(f"{variant}: the run did not get all {size_mb} MB")
    return elapsed

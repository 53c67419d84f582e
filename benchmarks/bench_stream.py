"""Benchmark 2 of issue 6: streaming a large output through the NDJSON eval stream, and the server's memory.

A cell prints 100 MB in lines of 100 bytes (1,000 lines per ``print``). Interleaved, on two warm kernels of
one server:

- ``raw client``: a ``jupyter_client`` AsyncKernelClient of this process, connected to a kernel the server
  started through ``POST /api/kernels``, drains iopub until ``status: idle`` (then takes the reply);
- ``agent stream``: ``POST /api/agent/eval`` with ``Accept: application/x-ndjson`` on a warm session; the
  client reads the events as they come and decodes every line (as the raw client decodes every message).

Throughput is the printed bytes over the time from sending to the end. Server memory: before each run the
peak RSS of the server process is reset (``/proc/<pid>/clear_refs``), and after it the peak (``VmHWM``) is
compared with the RSS before.

Then, on the same session:

- ``JSON answer``: the unflushed 100 MB as one ``application/json`` eval (the answer carries the tail and
  the artifact id; the artifact is checked to hold every byte printed);
- ``slow reader``: the flushed 100 MB as an NDJSON stream read at 1 MB/s through a socket with a small
  receive buffer (the server's backlog bound, ``stream_backlog_bytes``, turns what the reader cannot take
  into ``gap`` events; the artifact is checked to hold every byte printed).

Targets (issue 16): agent stream >= 0.9x the raw client's throughput (flushed); the server's peak RSS
growth during an agent run <= the raw row's growth (same case) + 32 MB, for the flushed and unflushed
streams, the JSON answer and the slow reader.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import socket
import statistics
import time
from typing import Any

from .common import (
    BenchResult,
    Client,
    Row,
    Server,
    connect_raw_client,
    jupyter_server,
    profile_path,
    quick,
    raw_execute,
    run_meta,
    start_server_kernel,
)

NAME = "stream"
TITLE = "Stream throughput and server memory: 100 MB of printed lines, NDJSON eval stream vs raw iopub"

MB = 1_000_000
LINE_BYTES, LINES_PER_PRINT = 100, 1000
SIZE_MB, REPEAT = 100, 4
QUICK_SIZE_MB, QUICK_REPEAT = 10, 1
RSS_TARGET = 32 * MB  # over the raw row's growth
THROUGHPUT_TARGET = 0.9
SLOW_READ_BYTES_PER_S = 1_000_000
RAW, AGENT = "raw client (drain iopub)", "agent stream (NDJSON)"
FLUSHED, UNFLUSHED = "flushed every 1,000 lines", "unflushed (kernel batches)"
NDJSON = "application/x-ndjson"
EVAL_TIMEOUT = 120


def cell_code(megabytes: int, flush: bool) -> str:
    """Code printing ``megabytes`` MB as numbered lines of LINE_BYTES bytes, LINES_PER_PRINT per print."""
    prints = megabytes * MB // (LINE_BYTES * LINES_PER_PRINT)
    line = f"f'{{i:08d}} ' + 'x' * {LINE_BYTES - 10} + '\\n'"
    return (
        f"block = ''.join({line} for i in range({LINES_PER_PRINT}))\n"
        f"for _ in range({prints}):\n"
        f"    print(block, end='', flush={flush})\n"
    )


def agent_stream(
    client: Client, body: dict[str, Any], gaps: list[int] | None = None
) -> tuple[int, int, int, dict[str, Any]]:
    """POST the eval as an NDJSON stream; return (chunk text bytes, events, largest chunk, the result).

    ``gaps`` (if given) gets the bytes of each ``gap`` event: output the server did not send because the
    client fell behind by more than ``stream_backlog_bytes`` (or one message was larger than that).
    """
    conn = client._conn
    if conn is None:
        raise RuntimeError("the stream benchmark needs httpx (pip install httpx)")
    text_bytes = events = largest = 0
    result: dict[str, Any] | None = None
    line = bytearray()  # the unfinished line; a line (one event) can be megabytes long

    def handle(raw: bytes | bytearray) -> None:
        nonlocal text_bytes, events, largest, result
        event = json.loads(raw)
        events += 1
        kind = event["type"]
        if kind == "chunk":
            size = len(event["text"].encode())
            text_bytes += size
            largest = max(largest, size)
        elif kind == "gap" and gaps is not None:
            gaps.append(int(event["bytes"]))
        elif kind == "result":
            result = event["result"]
        elif kind == "error":
            raise RuntimeError(f"eval stream error: {event}")

    with conn.stream("POST", "api/agent/eval", content=json.dumps(body), headers={"Accept": NDJSON}) as r:
        if r.status_code != 200:
            raise RuntimeError(f"eval stream: HTTP {r.status_code}: {r.read()[:500]!r}")
        for data in r.iter_raw():  # split lines in linear time: only new data is searched
            start = 0
            while (end := data.find(b"\n", start)) >= 0:
                if line:
                    line += data[start:end]
                    handle(line)
                    line.clear()
                else:
                    handle(data[start:end])
                start = end + 1
            line += data[start:]
    if result is None:
        raise RuntimeError("eval stream ended without a result event")
    return text_bytes, events, largest, result


def expected_text(megabytes: int) -> bytes:
    """What :func:`cell_code` prints (both variants print the same text)."""
    block = "".join(f"{i:08d} " + "x" * (LINE_BYTES - 10) + "\n" for i in range(LINES_PER_PRINT))
    return (block * (megabytes * MB // (LINE_BYTES * LINES_PER_PRINT))).encode()


def _artifact_matches(client: Client, artifact_id: str | None, size_mb: int) -> bool:
    """Whether the artifact holds exactly what the kernel printed (no output lost)."""
    if not artifact_id:
        return False
    status, content = client.request("GET", f"api/agent/artifacts/{artifact_id}")
    return (
        status == 200 and hashlib.sha256(content).digest() == hashlib.sha256(expected_text(size_mb)).digest()
    )


def slow_stream(server: Server, body: dict[str, Any], rate: float) -> tuple[int, int, dict[str, Any]]:
    """POST an NDJSON eval over a raw socket (HTTP/1.0: no chunking) with a 16 KB receive buffer, reading
    ``rate`` bytes/s; return (bytes received, gap events, the result)."""
    host, port = server.url.split("//", 1)[1].rstrip("/").split(":")
    payload = json.dumps(body).encode()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
    sock.connect((host, int(port)))
    sock.sendall(
        (
            "POST /api/agent/eval HTTP/1.0\r\n"
            f"Host: {host}:{port}\r\nAuthorization: token {server.token}\r\nAccept: {NDJSON}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
        ).encode()
        + payload
    )
    received = gaps = 0
    result: dict[str, Any] | None = None
    pending = bytearray()
    headers_done = False
    start = time.monotonic()
    chunk = 64 * 1024
    with sock:
        while data := sock.recv(chunk):
            received += len(data)
            pending += data
            if not headers_done and b"\r\n\r\n" in pending:
                head, _, rest = bytes(pending).partition(b"\r\n\r\n")
                if b" 200 " not in head.split(b"\r\n", 1)[0]:
                    raise RuntimeError(f"slow stream: {head[:200]!r}")
                pending, headers_done = bytearray(rest), True
            if headers_done:
                *lines, tail = bytes(pending).split(b"\n")
                pending = bytearray(tail)
                for line in lines:
                    if b'"type": "gap"' in line[:40] or b'"type":"gap"' in line[:40]:
                        gaps += 1
                    elif line.startswith(b'{"type": "result"') or line.startswith(b'{"type":"result"'):
                        result = json.loads(line)["result"]
            # read at ``rate``: the time this much should have taken
            ahead = received / rate - (time.monotonic() - start)
            if ahead > 0:
                time.sleep(ahead)
    if pending.strip():
        last = json.loads(pending)
        if last.get("type") == "result":
            result = last["result"]
    if result is None:
        raise RuntimeError("slow stream ended without a result event")
    return received, gaps, result


def _json_and_slow_runs(server: Server, client: Client, size_mb: int) -> list[dict[str, Any]]:
    """The JSON answer of the unflushed output and the 1 MB/s reader of the flushed one (one run each)."""
    runs = []
    body = {"cells": [{"code": cell_code(size_mb, False)}], "session": "stream", "timeout": EVAL_TIMEOUT}
    _, before = _memory_window(server)
    start = time.perf_counter()
    answer = client.json("POST", "api/agent/eval", body)
    seconds = time.perf_counter() - start
    peak = server.memory().get("VmHWM", 0)
    cell = answer["cells"][0]
    last_line = expected_text(1)[-LINE_BYTES:].decode()
    whole = _artifact_matches(client, cell["artifact_id"], size_mb)
    runs.append(
        {
            "case": f"{size_mb} MB, {UNFLUSHED}",
            "variant": "agent JSON answer",
            "flushed": False,
            "seconds": seconds,
            "growth_mb": (peak - before) / 1e6,
            "figures": {"answer KB": round(len(json.dumps(answer)) / 1e3, 1), "artifact complete": whole},
            "note": f"JSON answer of {size_mb} MB unflushed: status {cell['status']}, total_bytes "
            f"{cell['total_bytes']}, {cell['output_bytes']} bytes of tail in the answer (ends with the last "
            f"line printed: {cell['output'].endswith(last_line)}), artifact {cell['artifact_id']} holds "
            f"every byte printed: {whole}.",
        }
    )
    body = {"cells": [{"code": cell_code(size_mb, True)}], "session": "stream", "timeout": 600}
    _, before = _memory_window(server)
    start = time.perf_counter()
    received, gaps, result = slow_stream(server, body, SLOW_READ_BYTES_PER_S)
    seconds = time.perf_counter() - start
    peak = server.memory().get("VmHWM", 0)
    cell = result["cells"][0]
    whole = _artifact_matches(client, cell["artifact_id"], size_mb)
    runs.append(
        {
            "case": f"{size_mb} MB, {FLUSHED}",
            "variant": "agent stream, reader at 1 MB/s",
            "flushed": True,
            "seconds": seconds,
            "growth_mb": (peak - before) / 1e6,
            "figures": {
                "MB received": round(received / 1e6, 1),
                "gap events": gaps,
                "artifact complete": whole,
            },
            "note": f"Slow reader ({SLOW_READ_BYTES_PER_S / 1e6:g} MB/s, 16 KB receive buffer) of "
            f"{size_mb} MB flushed: received {received / 1e6:.1f} MB in {seconds:.0f} s with {gaps} gap "
            "event(s) (what it "
            f"could not take in time; never silently: each gap says how much), status {cell['status']}, "
            f"artifact {cell['artifact_id']} holds every byte printed: {whole}.",
        }
    )
    return runs


def _cold_run(server: Server, client: Client, size_mb: int) -> dict[str, float]:
    """The first agent stream after the server started (untimed warm-up): its memory, reported apart."""
    body = {"cells": [{"code": cell_code(size_mb, True)}], "session": "stream", "timeout": EVAL_TIMEOUT}
    _, before = _memory_window(server)
    agent_stream(client, body, [])
    mem = server.memory()
    return {
        "peak_growth_mb": round((mem.get("VmHWM", 0) - before) / 1e6, 1),
        "retained_mb": round((mem.get("VmRSS", 0) - before) / 1e6, 1),
    }


def _message_text(runs: list[tuple[int, int]]) -> str:
    return ", ".join(f"({count}, {largest / MB:.1f})" for count, largest in runs)


def run(options: argparse.Namespace) -> BenchResult:
    return asyncio.run(_run(options))


def _memory_window(server: Server) -> tuple[bool, int]:
    reset = server.reset_peak_memory()
    return reset, server.memory().get("VmRSS", 0)


async def _run(options: argparse.Namespace) -> BenchResult:
    size_mb, repeat = (QUICK_SIZE_MB, QUICK_REPEAT) if quick(options) else (SIZE_MB, REPEAT)
    expected = size_mb * MB
    rows: list[Row] = []
    cases: dict[str, dict[str, Any]] = {}
    failures: list[dict[str, Any]] = []  # agent runs that did not complete (left out of the timings)
    lost: list[dict[str, Any]] = []  # runs that completed with less output than printed
    skipped: dict[str, list[int]] = {}  # per case: bytes the agent stream reported as gaps, per run
    peak_reset = True
    with jupyter_server(profile_to=profile_path(options, NAME)) as server, server.client() as client:
        warm = client.json("POST", "api/agent/eval", {"cells": [{"code": "1+1"}], "session": "stream"})
        assert warm["cells"][0]["output"] == "2\n", warm
        kernel_id = start_server_kernel(client)
        kc = await connect_raw_client(server, kernel_id)
        try:
            await raw_execute(kc, "1+1", timeout=30)
            rss_at_start = server.memory().get("VmRSS", 0)
            cold = _cold_run(server, client, size_mb)
            await raw_execute(kc, cell_code(size_mb, True), timeout=600)  # the raw path's warm-up
            for flush in (True, False):
                code = cell_code(size_mb, flush)
                # A run that has not ended after EVAL_TIMEOUT s is a failure, reported (timed_out) by the
                # eval itself: e.g. when the kernel dropped iopub messages to a slow subscriber.
                body = {"cells": [{"code": code}], "session": "stream", "timeout": EVAL_TIMEOUT}
                case = f"{size_mb} MB, " + (FLUSHED if flush else UNFLUSHED)
                samples: dict[str, list[float]] = {RAW: [], AGENT: []}
                memory: dict[str, list[dict[str, float]]] = {RAW: [], AGENT: []}
                messages: dict[str, list[tuple[int, int]]] = {RAW: [], AGENT: []}
                skipped[case] = []
                for i in range(repeat):
                    for variant in (RAW, AGENT) if i % 2 == 0 else (AGENT, RAW):
                        reset, before = _memory_window(server)
                        peak_reset = peak_reset and reset
                        start = time.perf_counter()
                        if variant == RAW:
                            stats: dict[str, int] = {}
                            reply, got = await raw_execute(kc, code, timeout=600, stats=stats)
                            if reply["status"] != "ok":
                                raise RuntimeError(f"raw execute failed: {reply}")
                            messages[RAW].append((stats["stream_messages"], stats["largest_stream_message"]))
                        else:
                            gap_sizes: list[int] = []
                            got, events, largest, result = agent_stream(client, body, gap_sizes)
                            cell = result["cells"][0]
                            messages[AGENT].append((events, largest))
                            skipped[case].append(sum(gap_sizes))
                            got += sum(gap_sizes)  # told, not lost: the artifact has it
                        elapsed = time.perf_counter() - start
                        mem = server.memory()
                        if variant == AGENT and (cell["status"] != "complete" or result["timed_out"]):
                            # e.g. the status: idle that ends the run never reached the server
                            failures.append(
                                {"case": case, "variant": variant, "seconds": round(elapsed, 1), "bytes": got}
                            )
                            print(f"  {case}: {variant}: FAILED: {json.dumps(result)[:300]}", flush=True)
                            continue
                        if got != expected:  # iopub is PUB/SUB: a subscriber that falls behind loses messages
                            lost.append(
                                {
                                    "case": case,
                                    "variant": variant,
                                    "bytes_lost": expected - got,
                                    # what reached the server from the kernel (the eval's own count)
                                    "server_received_bytes": cell["total_bytes"] if variant == AGENT else 0,
                                }
                            )
                            print(f"  {case}: {variant}: {expected - got} bytes of output lost", flush=True)
                        samples[variant].append(elapsed)
                        memory[variant].append(
                            {
                                "rss_before_mb": before / 1e6,
                                "peak_mb": mem.get("VmHWM", 0) / 1e6,
                                "rss_after_mb": mem.get("VmRSS", 0) / 1e6,
                            }
                        )
                        print(f"  {case}: {variant}: {expected / MB / elapsed:.1f} MB/s", flush=True)
                cases[case] = {"memory_mb": memory, "messages": messages}
                for variant in (RAW, AGENT):
                    peak_growth = max(m["peak_mb"] - m["rss_before_mb"] for m in memory[variant])
                    retained = max(m["rss_after_mb"] - m["rss_before_mb"] for m in memory[variant])
                    rows.append(
                        Row(
                            case,
                            variant,
                            samples[variant],
                            baseline=None if variant == RAW else RAW,
                            extra={
                                "MB/s (median run)": round(
                                    expected / MB / statistics.median(samples[variant]), 1
                                ),
                                "server peak RSS growth MB (max)": round(peak_growth, 1),
                                "retained MB (max)": round(retained, 1),
                                **(
                                    {"gap MB (max)": round(max(skipped[case], default=0) / MB, 1)}
                                    if variant == AGENT
                                    else {}
                                ),
                            },
                        )
                    )
            extra_runs = _json_and_slow_runs(server, client, size_mb)
            recoveries = dict(client.json("GET", "api/agent/sessions")["totals"])
        finally:
            kc.stop_channels()
            client.request("DELETE", f"api/kernels/{kernel_id}")
        rss_at_end = server.memory().get("VmRSS", 0)

    result = BenchResult(NAME, TITLE, rows, meta=run_meta())
    result.meta.update(
        size_bytes=expected,
        repetitions=repeat,
        cases=cases,
        peak_rss_reset_worked=peak_reset,
        cold_first_agent_stream=cold,
        server_rss_mb_at_start=round(rss_at_start / 1e6, 1),
        server_rss_mb_at_end=round(rss_at_end / 1e6, 1),
        rss_growth_target_mb_over_raw=RSS_TARGET / 1e6,
        failed_runs=failures,
        runs_with_lost_output=lost,
        gap_bytes_per_run=skipped,
        session_recoveries=recoveries,
    )
    raw_growth: dict[bool, float] = {}
    for case, figures in cases.items():
        flushed = case.endswith(FLUSHED)
        ratio = result.add_ratio(
            case, AGENT, RAW, target=THROUGHPUT_TARGET if flushed else None, op=">=", throughput=True
        )
        growth = result.row(case, AGENT).extra["server peak RSS growth MB (max)"]
        raw_growth[flushed] = result.row(case, RAW).extra["server peak RSS growth MB (max)"]
        bound = result.add_check(
            case,
            f"{AGENT}: server peak RSS growth over the raw row's",
            growth - raw_growth[flushed],
            RSS_TARGET / 1e6,
            unit=" MB",
        )
        if flushed:
            result.add_check(
                case,
                f"{AGENT}: MB the client was not sent (gap events; it reads as fast as it can)",
                max(skipped[case], default=0) / 1e6,
                0.0,
                unit=" MB",
            )
        messages = figures["messages"]
        result.notes.append(
            f"{case}: throughput {ratio['median_ratio']:.2f}x raw"
            + (f" (target >= {THROUGHPUT_TARGET}x)" if flushed else " (no target)")
            + f"; server peak RSS growth {growth:.1f} MB during an agent stream, "
            f"{raw_growth[flushed]:.1f} MB while the raw client streams "
            f"(target: at most {RSS_TARGET / 1e6:.0f} MB more: "
            f"{'met' if bound['met'] else '**not met**'}). Kernel messages (count, largest MB) per run: raw "
            f"{_message_text(messages[RAW])}; agent NDJSON events {_message_text(messages[AGENT])}."
        )
    for run in extra_runs:
        flushed = run["flushed"]
        result.rows.append(
            Row(
                run["case"],
                run["variant"],
                [run["seconds"]],
                extra={
                    "MB/s": round(expected / MB / run["seconds"], 1),
                    "server peak RSS growth MB": round(run["growth_mb"], 1),
                    **run["figures"],
                },
            )
        )
        result.add_check(
            run["case"],
            f"{run['variant']}: server peak RSS growth over the raw row's "
            f"({'flushed' if flushed else 'unflushed'})",
            run["growth_mb"] - raw_growth[flushed],
            RSS_TARGET / 1e6,
            unit=" MB",
        )
        result.notes.append(run["note"])
    if recoveries.get("lost_idle"):
        result.notes.append(
            f"**Idle status assumed lost** in {recoveries['lost_idle']} agent run(s) (session totals "
            f"{recoveries}): the execute_reply came and iopub then stayed silent for the executor's idle "
            "grace (2 s) while the server was busy, so the run ended without its last output messages; "
            "the eval logs it (lost_idle) and its answer starts with a notice that the end of the output "
            "may be "
            "missing (OUTPUT_MAY_BE_INCOMPLETE). In these runs the server received less than the kernel "
            "printed (see the incomplete runs): the kernel dropped messages."
        )
    if failures or lost:
        result.notes.append(
            f"**Incomplete runs**: {len(failures)} agent run(s) did not complete (left out of the timings): "
            f"{failures}; {len(lost)} run(s) completed with output missing: {lost}. The kernel publishes "
            "output on a ZMQ PUB socket, which drops messages for a subscriber that falls too far behind."
        )
    result.notes += [
        "Peak RSS growth = VmHWM after the run minus VmRSS before it, with the peak reset just before the "
        "run"
        + ("" if peak_reset else " (the reset failed: VmHWM is the lifetime peak, so growth is overstated)")
        + "; retained = VmRSS after minus before. The raw rows show what the server does by itself while "
        "another client streams: jupyter_server watches every kernel's iopub for activity, so it receives "
        "every message too.",
        "Unflushed, ipykernel batches everything printed between its 0.2 s flushes into one stream "
        "message: a fast loop sends tens of MB in one message, which any process on the iopub channel, "
        "the server included, has to hold whole. Flushed every 1,000 lines, messages are 100 KB.",
        "The agent stream also writes the full output to an artifact file (the eval keeps only the tail "
        "in memory); the raw client keeps nothing.",
        f"{repeat} runs of each variant per case, alternating which goes first, after a warm-up of both "
        "kernels.",
        "Where the time goes (`--profile`: results/stream.profile.txt, pyinstrument on the server; the "
        "profile spans the whole benchmark, raw runs and the slow reader included, and slows the server "
        "down): the eval's connection receives each kernel message, checks its HMAC and decodes its JSON "
        "(header dates left as strings), records the kernel's activity for jupyter_server (whose own "
        "watcher is stopped while the connection is open: KernelService.hold_activity), writes the text to "
        "the "
        "artifact and counts its lines (sink), and sends NDJSON lines whose text is escaped on bytes. In "
        "the raw rows the server's only work is jupyter_server's activity watcher (record_activity: HMAC, "
        "header dates parsed with dateutil, a debug log record). The raw client decodes in its own "
        "process, in parallel; the agent stream's client decodes the same text once more as JSON lines. "
        "Kernel, server and client share 2 CPUs.",
        "Memory: the eval connection takes kernel messages in as fast as it can, up to iopub_buffer_bytes "
        "(16 MB) waiting for the executor, and ZMQ holds at most iopub_hwm (2) messages more; past that "
        "the kernel holds them (it drops messages past 1000, so the intake must keep up: with ZMQ's "
        "2-message queue alone it did not, and the kernel dropped 0.2-1.6 MB per 100 MB run). The stream "
        "holds at most stream_backlog_bytes (16 MB) for a client that reads slower (past it: gap events, "
        "the artifact keeps everything), and a big message is sent as chunk events of at most 1 MB. An "
        "unflushed print still arrives as one message of up to 100 MB, which the server holds whole while "
        "it decodes it: jupyter_server's watcher in the raw rows, the eval's connection alone in the "
        "agent rows (it holds the kernel's activity, so the watcher does not receive a second copy).",
        f"The first agent stream after the server started is an untimed warm-up (then one raw run): peak "
        f"RSS growth {cold['peak_growth_mb']} MB, {cold['retained_mb']} MB still resident after it. The "
        "timed runs reuse that memory; it is not counted against the target above.",
    ]
    return result

"""Shared benchmark machinery: a real Jupyter server subprocess, an HTTP client, timing, result files."""

from __future__ import annotations

import datetime
import functools
import json
import os
import platform
import shutil
import statistics
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jupyter_agent_tools.testing.server import (  # noqa: F401 - re-exported for the benchmark modules
    CONNECTION_ERRORS,
    Client,
    Server,
    free_port,
    httpx,
)
from jupyter_agent_tools.testing.server import jupyter_server as _jupyter_server

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
RESULTS = HERE / "results"

# ------------------------------------------------------------------------------------------ the server

# The launcher lives in the package (tests and downstream projects use it too); benchmarks add the
# pyinstrument report when a server ran under the profiler.
jupyter_server = functools.partial(_jupyter_server, on_stop=lambda run, out: write_profile_summary(run, out))


def write_profile_summary(session_path: Path, out: Path, threshold: float = 0.005) -> None:
    """Render a pyinstrument session of the server as text: the functions with the most own time, then
    the call tree with frames under ``threshold`` of the total hidden (library frames included)."""
    from pyinstrument.session import Session

    session = Session.load(str(session_path))
    root = session.root_frame()
    if root is None:
        out.write_text("(empty profile)\n")
        return
    whole = root.time
    loop = _find_frame(root, "run_forever")  # the event loop: the server's work after startup
    if loop is not None:
        root = loop
    total = root.time or 1e-9

    def name(frame: Any) -> str:  # function and file, not the line: a function's call sites merge
        where = frame.file_path_short or ""
        label = f"{frame.class_name}.{frame.function}" if frame.class_name else frame.function
        return f"{label}  {where}".rstrip()

    own: dict[str, float] = {}
    stack: list[tuple[Any, Any]] = [(root, None)]
    while stack:
        frame, parent = stack.pop()
        children = list(frame.children)
        stack.extend((c, frame) for c in children)
        self_time = frame.time - sum(c.time for c in children)
        owner = parent if (frame.is_synthetic or frame.function == "[self]") and parent is not None else frame
        if self_time > 0:
            own[name(owner)] = own.get(name(owner), 0.0) + self_time
    lines = [
        "Profile of the Jupyter server process: pyinstrument, main thread, wall-clock samples "
        f"({session.sample_count} samples over {session.duration:.1f} s, CPU {session.cpu_time:.1f} s). "
        "Idle time in the event loop shows as epoll.poll.",
        f"Shown: the event loop after startup, {root.time:.1f} s of the {whole:.1f} s profiled.",
        "",
        "== Functions by own time (seconds, % of the whole run) ==",
    ]
    for label, seconds in sorted(own.items(), key=lambda kv: -kv[1])[:40]:
        lines.append(f"{seconds:8.3f}  {100 * seconds / total:5.1f}%  {label}")
    lines += ["", f"== Call tree (frames >= {100 * threshold:g}% of the run) =="]

    def walk(frames: list[Any], depth: int) -> None:
        """Print ``frames`` (same function, e.g. from different call lines) as one node, then children."""
        lines.append(f"{'  ' * depth}{sum(f.time for f in frames):8.3f}  {name(frames[0])}")
        groups: dict[str, list[Any]] = {}
        for frame in frames:
            for child in frame.children:
                if child.function != "[self]":
                    groups.setdefault(name(child), []).append(child)
        for group in sorted(groups.values(), key=lambda g: -sum(f.time for f in g)):
            if sum(f.time for f in group) >= threshold * total:
                walk(group, depth + 1)

    walk([root], 0)
    out.write_text("\n".join(lines) + "\n")


def _find_frame(root: Any, function: str) -> Any:
    stack = [root]
    while stack:
        frame = stack.pop(0)
        if frame.function == function:
            return frame
        stack.extend(frame.children)
    return None


# ----------------------------------------------------------------------------------- raw kernel clients


def start_server_kernel(client: Client, kernel_name: str = "python3") -> str:
    """Start a kernel in the server through its own ``POST /api/kernels``; return its id."""
    model = client.json("POST", "api/kernels", {"name": kernel_name}, expect=201)
    return str(model["id"])


def wait_for_pool(client: Client, timeout: float = 120.0) -> None:
    """Wait until the server's warm kernel pool has a kernel ready (``GET /api/agent/sessions``)."""
    deadline = time.monotonic() + timeout
    while client.json("GET", "api/agent/sessions")["pool"]["ready"] < 1:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the kernel pool did not fill within {timeout:g} s")
        time.sleep(0.05)


async def connect_raw_client(server: Server, kernel_id: str, ready_timeout: float = 60.0) -> Any:
    """A ``jupyter_client`` AsyncKernelClient on a kernel of the server, from its connection file.

    It has its own session id (so it never competes with the server's clients for replies) and is ready
    (``wait_for_ready``) when returned. Call ``stop_channels()`` when done.
    """
    from uuid import uuid4

    from jupyter_client.asynchronous import AsyncKernelClient

    path = server.connection_file(kernel_id)
    deadline = time.monotonic() + ready_timeout
    while not path.exists() and time.monotonic() < deadline:  # written by the server as the kernel starts
        await _sleep(0.05)
    kc = AsyncKernelClient()
    kc.load_connection_file(str(path))
    kc.session.session = uuid4().hex
    kc.start_channels(shell=True, iopub=True, stdin=False, hb=False, control=False)
    try:
        await kc.wait_for_ready(timeout=ready_timeout)
    except BaseException:
        kc.stop_channels()
        raise
    return kc


async def _sleep(seconds: float) -> None:
    import asyncio

    await asyncio.sleep(seconds)


async def raw_execute(
    kc: Any, code: str, timeout: float = 600.0, stats: dict[str, int] | None = None
) -> tuple[dict[str, Any], int]:
    """Execute ``code`` and wait for both ``status: idle`` (iopub) and the ``execute_reply`` (shell).

    iopub is drained as messages arrive; returns the reply's content and the UTF-8 bytes of stream text
    seen. This is the floor an eval is compared to: send, reply, idle, and nothing else. ``stats`` (if
    given) gets the number of stream messages and the largest one's text bytes.
    """
    msg_id = kc.execute(code, allow_stdin=False, stop_on_error=False)
    stream_bytes = 0
    while True:
        msg = await kc.get_iopub_msg(timeout=timeout)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        kind = msg["header"]["msg_type"]
        if kind == "stream":
            size = len(msg["content"]["text"].encode())
            stream_bytes += size
            if stats is not None:
                stats["stream_messages"] = stats.get("stream_messages", 0) + 1
                stats["largest_stream_message"] = max(stats.get("largest_stream_message", 0), size)
        elif kind == "status" and msg["content"]["execution_state"] == "idle":
            break
    while True:
        reply = await kc.get_shell_msg(timeout=timeout)
        if reply["parent_header"].get("msg_id") == msg_id:
            return reply["content"], stream_bytes


class PollingRawClient:
    """The fastest honest raw client of a kernel: blocking ZMQ sockets of its own (a DEALER on shell, a
    SUB on iopub) and one ``zmq.Poller`` on both, so the ``execute_reply`` and the iopub ``status: idle``
    are awaited together, in whichever order they come, with no event loop in between.

    Honest: every message is received whole, its HMAC checked and its JSON decoded by jupyter_client's
    ``Session`` (what any client must do to know which message it got). The floor an eval is compared to.
    """

    def __init__(self, connection_file: Path):
        import zmq
        from jupyter_client.session import Session

        info = json.loads(connection_file.read_text())
        self.session = Session(key=info["key"].encode(), signature_scheme=info["signature_scheme"])
        self.context = zmq.Context()
        url = f"{info['transport']}://{info['ip']}:"
        self.shell = self.context.socket(zmq.DEALER)
        self.shell.setsockopt(zmq.LINGER, 0)
        self.shell.connect(url + str(info["shell_port"]))
        self.iopub = self.context.socket(zmq.SUB)
        self.iopub.setsockopt(zmq.LINGER, 0)
        self.iopub.setsockopt(zmq.SUBSCRIBE, b"")
        self.iopub.connect(url + str(info["iopub_port"]))
        self.poller = zmq.Poller()
        self.poller.register(self.shell, zmq.POLLIN)
        self.poller.register(self.iopub, zmq.POLLIN)

    def wait_for_ready(self, timeout: float = 60.0) -> None:
        """Send ``kernel_info_request`` until iopub delivers (the SUB socket joins late) and it answers."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                self.execute("", timeout=1.0)
                return
            except TimeoutError:
                continue
        raise TimeoutError("the kernel did not answer")

    def execute(self, code: str, timeout: float = 30.0) -> dict[str, Any]:
        """Run ``code``; return the ``execute_reply`` content once it and ``status: idle`` both came."""
        import zmq

        content = {
            "code": code,
            "silent": False,
            "store_history": True,
            "user_expressions": {},
            "allow_stdin": False,
            "stop_on_error": False,
        }
        msg_id = self.session.send(self.shell, "execute_request", content)["header"]["msg_id"]
        reply: dict[str, Any] | None = None
        idle = False
        deadline = time.monotonic() + timeout
        while reply is None or not idle:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no reply and idle within {timeout} s")
            for socket, _ in self.poller.poll(left * 1000):
                while True:
                    _, msg = self.session.recv(socket, mode=zmq.NOBLOCK)
                    if msg is None:  # nothing more on this socket now
                        break
                    if msg["parent_header"].get("msg_id") != msg_id:
                        continue
                    if socket is self.shell:
                        reply = msg["content"]
                    elif msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                        idle = True
        return reply

    def close(self) -> None:
        self.shell.close()
        self.iopub.close()
        self.context.term()


def polling_raw_client(server: Server, kernel_id: str, ready_timeout: float = 60.0) -> PollingRawClient:
    """A :class:`PollingRawClient` on a kernel the server started, ready when returned."""
    path = server.connection_file(kernel_id)
    deadline = time.monotonic() + ready_timeout
    while not path.exists() and time.monotonic() < deadline:  # written by the server as the kernel starts
        time.sleep(0.05)
    client = PollingRawClient(path)
    try:
        client.wait_for_ready(ready_timeout)
    except BaseException:
        client.close()
        raise
    return client


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages, or None where the OS does not say."""
    return [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None


# ---------------------------------------------------------------------------------------------- timing


def interleaved(
    variants: dict[Any, Callable[[], object]], repeat: int, warmup: int
) -> dict[Any, list[float]]:
    """Time each of ``variants`` ``repeat`` times after ``warmup`` untimed rounds, interleaved: every round
    calls each variant once, rotating which goes first, so drift of the machine falls on all of them alike.
    Returns the durations in seconds, by variant key."""
    samples: dict[Any, list[float]] = {key: [] for key in variants}
    order = list(variants)
    for i in range(-warmup, repeat):
        shift = i % len(order)
        for key in order[shift:] + order[:shift]:
            start = time.perf_counter()
            variants[key]()
            elapsed = time.perf_counter() - start
            if i >= 0:
                samples[key].append(elapsed)
    return samples


def percentile(samples: Sequence[float], q: float) -> float:
    """The q-quantile (0..1) with linear interpolation."""
    ordered = sorted(samples)
    if len(ordered) == 1:
        return ordered[0]
    pos = (len(ordered) - 1) * q
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def summarize(samples: Sequence[float]) -> dict[str, float]:
    """Figures of a list of durations (seconds): n, median, p90, min, max, mean."""
    return {
        "n": len(samples),
        "median": statistics.median(samples),
        "p90": percentile(samples, 0.9),
        "min": min(samples),
        "max": max(samples),
        "mean": statistics.fmean(samples),
    }


# --------------------------------------------------------------------------------------------- results


@dataclass
class Row:
    """One measured variant of one case; ``baseline`` names the row of the same case it is compared to."""

    case: str
    variant: str
    samples: list[float]
    baseline: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def stats(self) -> dict[str, float]:
        return summarize(self.samples)


@dataclass
class BenchResult:
    """What one benchmark measured, with its targets, ready to print and save."""

    name: str
    title: str
    rows: list[Row]
    notes: list[str] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    ratios: list[dict[str, Any]] = field(default_factory=list)
    checks: list[dict[str, Any]] = field(default_factory=list)

    def add_check(
        self, case: str, what: str, measured: float, target: float, op: str = "<=", unit: str = ""
    ) -> dict[str, Any]:
        """Record a target that is not a ratio of two rows' medians (a memory bound, a computed ratio)."""
        check = {
            "case": case,
            "what": what,
            "measured": measured,
            "target": target,
            "op": op,
            "unit": unit,
            "met": _compare(measured, op, target),
        }
        self.checks.append(check)
        return check

    def targets(self) -> list[dict[str, Any]]:
        """Every target of this result, ratio or check: benchmark, case, what, measured, target, met."""
        found = []
        for q in self.ratios:
            if q.get("target") is None:
                continue
            what = "throughput" if q.get("kind") == "throughput" else "time"
            found.append(
                {
                    "benchmark": self.name,
                    "case": q["case"],
                    "what": f"{q['variant']} / {q['baseline']} ({what})",
                    "measured": q["median_ratio"],
                    "target": f"{q['op']} {q['target']:g}",
                    "met": q["met"],
                }
            )
        for c in self.checks:
            found.append(
                {
                    "benchmark": self.name,
                    "case": c["case"],
                    "what": c["what"],
                    "measured": c["measured"],
                    "target": f"{c['op']} {c['target']:g}{c['unit']}",
                    "met": c["met"],
                }
            )
        return found

    def row(self, case: str, variant: str) -> Row:
        return next(r for r in self.rows if r.case == case and r.variant == variant)

    def add_ratio(
        self,
        case: str,
        variant: str,
        baseline: str,
        target: float | None = None,
        op: str = "<=",
        throughput: bool = False,
    ) -> dict[str, Any]:
        """Record median and p90 ratios of ``variant`` over ``baseline`` for ``case``, with a target.

        The ratios are of durations (lower is better); with ``throughput`` they are of speeds, i.e.
        baseline duration over variant duration (higher is better), for the same amount of work.
        """
        a, b = self.row(case, variant).stats, self.row(case, baseline).stats
        if throughput:  # the same work in less time: speed ratio = duration ratio inverted
            a, b = b, a
        ratio = {
            "case": case,
            "variant": variant,
            "baseline": baseline,
            "kind": "throughput" if throughput else "duration",
            "median_ratio": a["median"] / b["median"],
            "p90_ratio": a["p90"] / b["p90"],
            "target": target,
            "op": op,
        }
        if target is not None:
            ratio["met"] = _compare(float(ratio["median_ratio"]), op, target)
        self.ratios.append(ratio)
        return ratio

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "title": self.title,
            "meta": self.meta,
            "rows": [
                {
                    "case": r.case,
                    "variant": r.variant,
                    "baseline": r.baseline,
                    "stats_seconds": r.stats,
                    "samples_seconds": r.samples,
                    **({"extra": r.extra} if r.extra else {}),
                }
                for r in self.rows
            ],
            "ratios": self.ratios,
            "checks": self.checks,
            "notes": self.notes,
        }

    def markdown(self) -> str:
        lines = [f"## {self.title}", ""]
        when = self.meta.get("date", "")
        machine = self.meta.get("machine", {})
        if when or machine:
            lines += [
                f"Measured {when} on {machine.get('cpus', '?')} CPUs, "
                f"Python {machine.get('python', '?')}, jupyter_server {machine.get('jupyter_server', '?')}, "
                f"commit {self.meta.get('commit', '?')}.{_load_text(self.meta)}",
                "",
            ]
        shown_extra = any(r.extra for r in self.rows)
        lines += [
            "| case | variant | n | median ms | p90 ms | median vs baseline |"
            + (" figures |" if shown_extra else ""),
            "|---|---|---|---|---|---|" + ("---|" if shown_extra else ""),
        ]
        for r in self.rows:
            s = r.stats
            if r.baseline:
                base = self.row(r.case, r.baseline).stats
                rel = f"{s['median'] / base['median']:.2f}x {r.baseline}"
            else:
                rel = "baseline"
            median, p90 = s["median"] * 1e3, s["p90"] * 1e3
            row = f"| {r.case} | {r.variant} | {s['n']} | {median:.1f} | {p90:.1f} | {rel} |"
            if shown_extra:
                row += " " + ", ".join(f"{k} {_fmt(v)}" for k, v in r.extra.items()) + " |"
            lines.append(row)
        if self.ratios:
            lines += ["", "| case | ratio | median | p90 | target | met |", "|---|---|---|---|---|---|"]
            for q in self.ratios:
                target = "" if q["target"] is None else f"{q['op']} {q['target']:g}"
                met = "" if "met" not in q else ("yes" if q["met"] else "**no**")
                what = "throughput" if q.get("kind") == "throughput" else "time"
                lines.append(
                    f"| {q['case']} | {q['variant']} / {q['baseline']} ({what}) | {q['median_ratio']:.2f} | "
                    f"{q['p90_ratio']:.2f} | {target} | {met} |"
                )
        if self.checks:
            lines += ["", "| case | check | measured | target | met |", "|---|---|---|---|---|"]
            for c in self.checks:
                lines.append(
                    f"| {c['case']} | {c['what']} | {c['measured']:.2f}{c['unit']} | "
                    f"{c['op']} {c['target']:g}{c['unit']} | {'yes' if c['met'] else '**no**'} |"
                )
        if self.notes:
            lines += [""] + [f"- {note}" for note in self.notes]
        return "\n".join(lines) + "\n"


def _compare(value: float, op: str, target: float) -> bool:
    if op == "<=":
        return value <= target
    if op == "<":
        return value < target
    if op == ">=":
        return value >= target
    raise ValueError(f"unknown comparison {op!r}")


def targets_from_json(documents: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The targets of saved results (``results/*.json``), in the shape of :meth:`BenchResult.targets`."""
    found: list[dict[str, Any]] = []
    for doc in documents:
        result = BenchResult(doc["name"], doc["title"], [], ratios=doc.get("ratios", []))
        result.checks = doc.get("checks", [])
        for target in result.targets():
            target["date"] = doc.get("meta", {}).get("date", "")
            found.append(target)
    return found


def targets_table(targets: Sequence[dict[str, Any]]) -> str:
    """A markdown table of targets: benchmark, case, what, measured, target, met."""
    lines = [
        "| benchmark | case | target of | measured | target | met |",
        "|---|---|---|---|---|---|",
    ]
    for t in targets:
        met = "yes" if t["met"] else "**no**"
        lines.append(
            f"| {t['benchmark']} | {t['case']} | {t['what']} | {t['measured']:.2f} | {t['target']} | {met} |"
        )
    return "\n".join(lines) + "\n"


def _fmt(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def _load_text(meta: dict[str, Any]) -> str:
    start = meta.get("machine", {}).get("load_average_at_start")
    end = meta.get("load_average_at_end")
    if not start:
        return ""
    text = f" Load average (1/5/15 min) {'/'.join(f'{x:.2f}' for x in start)} at start"
    if end:
        text += f", {'/'.join(f'{x:.2f}' for x in end)} at end"
    return text + "."


def profile_path(options: Any, name: str) -> Path | None:
    """Where to write the server's profile when ``--profile`` was given: ``results/<name>.profile.txt``."""
    if not getattr(options, "profile", False):
        return None
    RESULTS.mkdir(exist_ok=True)
    return RESULTS / f"{name}.profile.txt"


def quick(options: Any) -> bool:
    return bool(getattr(options, "quick", False))


def _version(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return "not installed"


def run_meta() -> dict[str, Any]:
    """When, where and on what a benchmark ran."""
    commit = "unknown"
    if shutil.which("git"):
        proc = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        )
        commit = proc.stdout.strip() or commit
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit,
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "jupyter_server": _version("jupyter_server"),
            "nbformat": _version("nbformat"),
            "tornado": _version("tornado"),
            "http_client": "httpx" if httpx is not None else "http.client",
            "load_average_at_start": load_average(),
        },
    }


def write_results(result: BenchResult) -> list[Path]:
    """Write ``results/<name>.json`` and ``.md``, and rebuild ``results/README.md`` from every table."""
    RESULTS.mkdir(exist_ok=True)
    json_path = RESULTS / f"{result.name}.json"
    md_path = RESULTS / f"{result.name}.md"
    json_path.write_text(json.dumps(result.to_json(), indent=1, sort_keys=True) + "\n")
    md_path.write_text(result.markdown())
    return [json_path, md_path, rebuild_readme()]


def rebuild_readme() -> Path:
    """Rebuild ``results/README.md``: the targets of every saved result, then every ``*.md`` beside it
    (the benchmarks' tables and hand-written analyses such as ``stream_notes.md``)."""
    readme = RESULTS / "README.md"
    documents = [json.loads(p.read_text()) for p in sorted(RESULTS.glob("*.json"))]
    parts = [
        "# Benchmark results (latest run of each)",
        "",
        "Written by `python -m benchmarks` (`python3 dev.py bench`); each table also exists as JSON beside "
        "this file. Ratios compare variants measured side by side in the same run.",
        "",
        "## Targets",
        "",
        "Every target of the latest run of each benchmark: the measured value (a median ratio, or a bound "
        "in MB), the target and whether it was met. Details and the reasons for a miss are in the sections "
        "below and in the profiles (`*.profile.txt`).",
        "",
        targets_table(targets_from_json(documents)),
    ]
    for path in sorted(RESULTS.glob("*.md")):
        if path.name != "README.md":
            parts.append(path.read_text())
    readme.write_text("\n".join(parts))
    return readme

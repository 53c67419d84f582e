"""Load: several concurrent agents on loopback, mixing notebook edits of shared notebooks and evals.

A real server subprocess. Each agent (a thread with its own keep-alive connection) loops until the time is
up, choosing at random: insert a cell into one of the shared notebooks (its content names the agent and
a counter), run an eval in its session that increments the agent's own counter variable there (JSON or
NDJSON stream), read a notebook, or (rarely) run a per-call eval. Afterwards it checks:

- every acknowledged edit is in its notebook exactly once, and nothing else was added;
- every eval got exactly one answer (a stream exactly one ``result`` event, last);
- no session lost its state: each agent's counter went 1, 2, 3, ... without a gap or a reset;
- nothing leaked: the server's open file descriptors (``/proc/<pid>/fd``) and the kernels in
  ``/api/kernels`` are back to what they were after warm-up.

``python -m benchmarks load`` runs it for a minute (``--quick``: 15 s); ``tests/test_crash.py`` runs
``run_load(duration=20)`` (marker ``load``) and requires its ``problems`` to be empty. Downstream
deployments can run it against their own build the same way.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from jupyter_agent_tools.testing.server import Server, jupyter_server

NOTEBOOKS = ("shared-a.ipynb", "shared-b.ipynb")
CONTENTS_NOTEBOOK = "saved-by-contents-api.ipynb"  # written through /api/contents, read through ours
# Refused requests (method, path, body, status): names that are not plain names, an op count past the
# limit, a number too big for a float. None may change anything.
HOSTILE: tuple[tuple[str, str, Any, int], ...] = (
    ("POST", "api/agent/eval", {"cells": [{"code": "1"}], "session": ".."}, 400),
    ("DELETE", "api/agent/sessions/%2E%2E", None, 404),
    (
        "POST",
        "api/agent/notebooks/shared-a.ipynb",
        {"ops": [{"action": "delete", "cell_index": 0}] * 1001},
        400,
    ),
    ("POST", "api/agent/eval", {"cells": [{"code": "1"}], "kernel_name": "no-such-kernel"}, 400),
)


@dataclass
class LoadReport:
    """What a load run did and what it found wrong (``problems`` empty means every invariant held)."""

    duration: float
    agents: int
    sessions: int
    latencies: dict[str, list[float]] = field(default_factory=dict)
    counts: Counter[str] = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)
    fds_before: int = 0
    fds_after: int = 0
    kernels_before: int = 0
    kernels_after: int = 0


def _agent_kernels(client: Any, timeout: float = 30.0) -> int:
    """The server's kernels but the warm pool's, once the pool is full again (nothing being started)."""
    deadline = time.monotonic() + timeout
    while True:
        pool = client.json("GET", "api/agent/sessions")["pool"]
        settled = pool["starting"] == 0 and pool["ready"] == pool["size"]
        if settled or time.monotonic() > deadline:
            return len(client.json("GET", "api/kernels")) - int(pool["ready"])
        time.sleep(0.1)


def _fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _stream(server: Server, body: dict[str, Any], timeout: float = 120) -> tuple[int, list[dict[str, Any]]]:
    request = urllib.request.Request(
        server.url + "api/agent/eval",
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Authorization": f"token {server.token}", "Accept": "application/x-ndjson"},
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return response.status, [json.loads(line) for line in response.read().splitlines() if line]


class _Agent(threading.Thread):
    def __init__(
        self, index: int, server: Server, session: str, deadline: float, seed: int, report: LoadReport
    ):
        super().__init__(daemon=True, name=f"agent-{index}")
        self.index, self.server, self.session, self.deadline = index, server, session, deadline
        self.rng = random.Random(seed)
        self.report = report
        self.acked: list[tuple[str, str]] = []  # (notebook, content)
        self.counter = 0
        self.lock = threading.Lock()
        self.problems: list[str] = []
        self.latencies: dict[str, list[float]] = {}

    def _time(self, kind: str, started: float) -> None:
        self.latencies.setdefault(kind, []).append(time.perf_counter() - started)

    def _check_count(self, output: str, answer: Any) -> None:
        self.counter += 1
        if output.strip() != str(self.counter):
            self.problems.append(
                f"agent {self.index}: session {self.session} state lost or a run doubled: expected "
                f"{self.counter}, got {output!r} ({str(answer)[:300]})"
            )
            self.counter = int(output.strip()) if output.strip().isdigit() else 0

    def _contents_save_or_hostile(self, client: Any, k: int) -> None:
        """Save the contents-API notebook as JupyterLab does (whole notebook, in place), or send a
        request that must be refused without touching anything."""
        started = time.perf_counter()
        if self.rng.random() < 0.5:
            nb = new_notebook(cells=[new_markdown_cell(f"saved by agent {self.index} #{k}")])
            status, raw = client.request(
                "PUT", f"api/contents/{CONTENTS_NOTEBOOK}", {"type": "notebook", "content": nb}
            )
            if status != 200:
                self.problems.append(f"contents save answered {status}: {raw[:200]!r}")
            self._time("contents save", started)
            return
        for method, path, body, expected in HOSTILE:
            status, raw = client.request(method, path, body)
            if status != expected:
                self.problems.append(f"{method} {path}: {status}, expected {expected}: {raw[:200]!r}")
        self._time("hostile", started)

    def run(self) -> None:
        var = f"agent_{self.index}_count"
        code = f"{var} = globals().get({var!r}, 0) + 1\nprint({var})"
        k = 0
        with self.server.client(timeout=120) as client:
            while time.perf_counter() < self.deadline:
                choice = self.rng.random()
                started = time.perf_counter()
                try:
                    if choice < 0.45:
                        notebook = self.rng.choice(NOTEBOOKS)
                        content = f"agent {self.index} edit {k}"
                        k += 1
                        status, raw = client.request(
                            "POST",
                            f"api/agent/notebooks/{notebook}",
                            {"action": "insert", "content": content},
                        )
                        if status == 200:
                            self.acked.append((notebook, content))
                            self._time("edit", started)
                        else:
                            self.problems.append(f"edit answered {status}: {raw[:200]!r}")
                    elif choice < 0.55:
                        status, raw = client.request(
                            "GET", f"api/agent/notebooks/{self.rng.choice((*NOTEBOOKS, CONTENTS_NOTEBOOK))}"
                        )
                        if status != 200:
                            self.problems.append(f"read answered {status}: {raw[:200]!r}")
                        self._time("read", started)
                    elif choice < 0.60:
                        self._contents_save_or_hostile(client, k)
                    elif choice < 0.80:
                        status, raw = client.request(
                            "POST", "api/agent/eval", {"cells": [{"code": code}], "session": self.session}
                        )
                        answer = json.loads(raw)
                        if status != 200:
                            self.problems.append(f"eval answered {status}: {raw[:200]!r}")
                            continue
                        self._check_count(answer["output"], answer)
                        self._time("eval (json)", started)
                    elif choice < 0.97:
                        status, events = _stream(
                            self.server, {"cells": [{"code": code}], "session": self.session}
                        )
                        results = [e for e in events if e.get("type") == "result"]
                        if status != 200 or len(results) != 1 or events[-1].get("type") != "result":
                            self.problems.append(
                                f"stream: status {status}, {len(results)} result events, last "
                                f"{events[-1] if events else None}"
                            )
                            continue
                        self._check_count(results[0]["result"]["output"], results[0])
                        self._time("eval (stream)", started)
                    else:
                        status, raw = client.request(
                            "POST",
                            "api/agent/eval",
                            {"cells": [{"code": "print(6 * 7)"}], "mode": "per-call"},
                        )
                        if status != 200 or json.loads(raw)["output"] != "42\n":
                            self.problems.append(f"per-call eval answered {status}: {raw[:200]!r}")
                        self._time("eval (per-call)", started)
                except Exception as e:  # a transport failure is a problem to report, not a crash
                    self.problems.append(f"agent {self.index}: {type(e).__name__}: {e}")


def run_load(duration: float = 60.0, agents: int = 6, sessions: int = 3, seed: int = 0) -> LoadReport:
    """Start a server, run the agents for ``duration`` seconds, check every invariant."""
    report = LoadReport(duration=duration, agents=agents, sessions=sessions)
    with jupyter_server(
        extra_args=[f"--SessionManager.max_sessions={sessions}", "--SessionManager.idle_timeout=0"]
    ) as server:
        root: Path = server.root_dir
        for name in NOTEBOOKS:
            nb = new_notebook(cells=[new_markdown_cell(f"# {name}"), new_code_cell("x = 1")])
            nbformat.write(nb, str(root / name))
        nbformat.write(new_notebook(cells=[new_markdown_cell("first")]), str(root / CONTENTS_NOTEBOOK))
        names = [f"load-{i}" for i in range(sessions)]
        with server.client() as client:
            for name in names:  # warm-up: the sessions' kernels exist before the baseline
                client.json("POST", "api/agent/eval", {"cells": [{"code": "1"}], "session": name})
            report.kernels_before = _agent_kernels(client)
        time.sleep(0.5)
        report.fds_before = _fd_count(server.process.pid)

        deadline = time.perf_counter() + duration
        threads = [
            _Agent(i, server, names[i % sessions], deadline, seed * 1000 + i, report) for i in range(agents)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=duration + 300)
            if thread.is_alive():
                report.problems.append(f"{thread.name} did not finish")

        for thread in threads:
            report.problems += thread.problems
            for kind, samples in thread.latencies.items():
                report.latencies.setdefault(kind, []).extend(samples)
                report.counts[kind] += len(samples)

        with server.client() as client:
            # every acknowledged edit is in its notebook exactly once, and nothing else was added
            for name in NOTEBOOKS:
                cells = client.json("GET", f"api/agent/notebooks/{name}")["cells"]
                sources = Counter(c["source"] for c in cells[2:])
                wanted = Counter(content for t in threads for nb, content in t.acked if nb == name)
                if sources != wanted:
                    missing = wanted - sources
                    extra = sources - wanted
                    report.problems.append(
                        f"{name}: missing {list(missing)[:5]}, unexpected {list(extra)[:5]}"
                    )
                nbformat.validate(nbformat.read(str(root / name), as_version=nbformat.NO_CONVERT))
            nbformat.validate(nbformat.read(str(root / CONTENTS_NOTEBOOK), as_version=nbformat.NO_CONVERT))
            leftovers = sorted(
                p.name for p in root.iterdir() if p.suffix == ".invalid" or p.name.startswith(".~")
            )
            if leftovers:
                report.problems.append(f"files left by interrupted or 'recovered' saves: {leftovers}")
            listing = client.json("GET", "api/agent/sessions")
            alive = {s["name"]: s for s in listing["sessions"]}
            for name in names:
                if name not in alive or alive[name]["restarts"]:
                    report.problems.append(f"session {name} lost: {alive.get(name)}")
            report.counts["session restarts/evictions"] = sum(listing["totals"].values())
            for _ in range(50):  # per-call kernels finish shutting down after their answer
                report.kernels_after = _agent_kernels(client)
                if report.kernels_after <= report.kernels_before:
                    break
                time.sleep(0.1)
        if report.kernels_after != report.kernels_before:
            report.problems.append(f"kernels: {report.kernels_before} before, {report.kernels_after} after")
        for _ in range(50):  # closed keep-alive connections take a moment to be reaped
            report.fds_after = _fd_count(server.process.pid)
            if report.fds_after <= report.fds_before + 2:
                break
            time.sleep(0.1)
        if report.fds_after > report.fds_before + 2:
            report.problems.append(f"descriptors: {report.fds_before} before, {report.fds_after} after")
    return report

"""Load: the bounded load driver of :mod:`benchmarks.load` for a minute (``--quick``: 15 s),
with latencies per request kind; any violated invariant fails the benchmark."""

from __future__ import annotations

import argparse

from benchmarks.load import run_load

from .common import BenchResult, Row, run_meta

NAME = "load"
TITLE = "Load: concurrent agents mixing shared-notebook edits and evals (invariants + latency)"
NOTEBOOKS = ("shared-a.ipynb", "shared-b.ipynb")


def run(options: argparse.Namespace) -> BenchResult:
    duration = 15.0 if getattr(options, "quick", False) else 60.0
    report = run_load(duration=duration)
    rows = [
        Row(case="mixed load", variant=kind, samples=samples)
        for kind, samples in sorted(report.latencies.items())
    ]
    total = sum(len(s) for s in report.latencies.values())
    notes = [
        f"{report.agents} agents, {report.sessions} sessions, {duration:.0f} s: {total} requests "
        f"({total / duration:.1f}/s); counts {dict(report.counts)}",
        f"file descriptors {report.fds_before} -> {report.fds_after}; kernels {report.kernels_before} -> "
        f"{report.kernels_after}",
        "invariants: " + ("all held" if not report.problems else f"VIOLATED: {report.problems[:5]}"),
    ]
    result = BenchResult(NAME, TITLE, rows, notes=notes, meta=run_meta())
    if report.problems:
        print("\n".join(report.problems[:20]))
        raise AssertionError(f"load invariants violated: {len(report.problems)} problem(s)")
    return result

"""A pytest plugin: with ``CI`` set, a missing piece fails the run instead of skipping."""

from __future__ import annotations

import os
from typing import Any

import pytest

# With CI set, a missing piece fails the run: a test that would skip because Chromium, npm, the proxy, tmux or
# a test-extra package is missing fails instead, saying what is missing. A skip that is right on any machine
# (the test does not apply to this platform or user) says so with NOT_APPLICABLE at the start of its reason.
NOT_APPLICABLE = "not applicable here:"


def strict() -> bool:
    """Whether ``CI`` is set (read at each report: tests/test_ci_strict.py sets it in its own runs)."""
    return bool(os.environ.get("CI"))


def _skip_reason(report: pytest.CollectReport | pytest.TestReport) -> str:
    longrepr = report.longrepr
    return str(longrepr[2]) if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)


def _fail_missing_piece(report: pytest.CollectReport | pytest.TestReport) -> None:
    if not (report.skipped and strict()):
        return
    reason = _skip_reason(report).removeprefix("Skipped: ")
    if reason.startswith(NOT_APPLICABLE):
        return
    report.outcome = "failed"
    report.longrepr = f"CI is set, so a missing piece fails instead of skipping: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    outcome = yield
    report = outcome.get_result()
    if report.skipped and not hasattr(report, "wasxfail"):
        _fail_missing_piece(report)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Any:
    outcome = yield
    _fail_missing_piece(outcome.get_result())

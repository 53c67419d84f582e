"""The browser tests' harness: with ``CI`` set, a missing Chromium fails the browser tests instead of
skipping them (a CI run cannot be green with the browser untested). (Without ``CI`` they skip: what every
run on a machine without Chromium shows.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def collect(ci: bool) -> subprocess.CompletedProcess[str]:
    """Collect the RTC browser test with no Chromium where the harness looks for it."""
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "PYTEST_XDIST_WORKER")}
    env["AGENT_TOOLS_CHROMIUM"] = str(TESTS / "no-such-chromium")
    if ci:
        env["CI"] = "true"
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-n",
            "0",
            "-q",
            "-rs",
            "test_rtc_browser.py",
        ],
        cwd=TESTS,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_missing_chromium_fails_the_browser_tests_under_ci() -> None:
    result = collect(ci=True)
    output = result.stdout + result.stderr
    assert result.returncode not in (0, 5), output[-3000:]
    assert "no Chromium at" in output and "CI is set" in output, output[-3000:]

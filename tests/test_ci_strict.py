"""With CI set, a test that would skip for a missing piece fails; one marked not applicable still skips."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.quick  # the fast tier: no server, no kernel

TESTS = Path(__file__).resolve().parent

SKIPPING = """
import pytest

pytest.importorskip("a_package_nobody_has")
"""

SKIPPING_IN_A_TEST = """
import shutil

import pytest


@pytest.mark.skipif(shutil.which("no-such-browser") is None, reason="no-such-browser is not installed")
def test_needs_a_browser():
    pass


def test_not_for_this_platform():
    pytest.skip("not applicable here: only on another platform")


def test_xfail():
    pytest.xfail("known")
"""


def run(tmp_path: Path, source: str, ci: bool) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_sample.py").write_text(source)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")])
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"  # the sample needs only ci_strict: start in a second, not 4
    if ci:
        env["CI"] = "true"
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "ci_strict",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:xdist",
            "-q",
            "-rA",
            str(tmp_path / "test_sample.py"),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_missing_package_skips_without_ci_and_fails_with_it(tmp_path: Path) -> None:
    assert run(tmp_path, SKIPPING, ci=False).returncode == 5  # skipped: no test ran
    strict = run(tmp_path, SKIPPING, ci=True)
    assert strict.returncode == 2, strict.stdout  # a collection error: the run fails
    assert "a missing piece fails instead of skipping" in strict.stdout


def test_a_skip_marked_not_applicable_stays_a_skip_with_ci(tmp_path: Path) -> None:
    lenient = run(tmp_path, SKIPPING_IN_A_TEST, ci=False)
    assert "2 skipped, 1 xfailed" in lenient.stdout, lenient.stdout
    strict = run(tmp_path, SKIPPING_IN_A_TEST, ci=True)
    assert strict.returncode == 1 and "1 skipped, 1 xfailed, 1 error" in strict.stdout, strict.stdout
    assert "no-such-browser is not installed" in strict.stdout

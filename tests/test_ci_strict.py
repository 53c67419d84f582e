"""With CI set, a test that would skip for a missing piece fails; one marked not applicable still skips."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.quick  # the fast tier: no server, no kernel

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


def run(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, source: str, ci: bool
) -> pytest.RunResult:
    """A pytest run of ``source`` with the plugin (in this process: no interpreter and imports to start)."""
    pytester.makepyfile(test_sample=source)
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")  # the sample needs only ci_strict
    if ci:
        monkeypatch.setenv("CI", "true")
    else:
        monkeypatch.delenv("CI", raising=False)
    return pytester.runpytest_inprocess(
        "-p", "ci_strict", "-p", "no:cacheprovider", "-p", "no:xdist", "-q", "-rA"
    )


def test_a_missing_package_skips_without_ci_and_fails_with_it(pytester, monkeypatch) -> None:
    assert run(pytester, monkeypatch, SKIPPING, ci=False).ret == 5  # skipped: no test ran
    strict = run(pytester, monkeypatch, SKIPPING, ci=True)
    assert strict.ret == 2, strict.stdout.str()  # a collection error: the run fails
    assert "a missing piece fails instead of skipping" in strict.stdout.str()


def test_a_skip_marked_not_applicable_stays_a_skip_with_ci(pytester, monkeypatch) -> None:
    lenient = run(pytester, monkeypatch, SKIPPING_IN_A_TEST, ci=False).stdout.str()
    assert "2 skipped, 1 xfailed" in lenient, lenient
    strict = run(pytester, monkeypatch, SKIPPING_IN_A_TEST, ci=True)
    out = strict.stdout.str()
    assert strict.ret == 1 and "1 skipped, 1 xfailed, 1 error" in out, out
    assert "no-such-browser is not installed" in out

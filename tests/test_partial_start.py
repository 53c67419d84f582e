"""A server whose extension failed to load still stops on SIGTERM (a real server subprocess).

The extension's services are built one after another; when one fails (here a configuration value that
its validation refuses), jupyter_server logs the failure, serves on without the extension, and at
SIGTERM still asks the extension to stop: stopping must then stop only what was built, and never raise.
"""

from __future__ import annotations

import signal
import subprocess
import time

import pytest

from jupyter_agent_tools.testing.server import jupyter_server

pytestmark = pytest.mark.timeout(180)


def test_a_server_whose_extension_failed_to_load_exits_on_sigterm() -> None:
    # EvalSessionManager is built after the ledger and the notebook store: a partial start
    with jupyter_server(extra_args=["--EvalSessionManager.max_sessions=0"]) as server:
        log = server.log_path.read_text(errors="replace")
        assert "max_sessions" in log and "jupyter_agent_tools" in log, log[-2000:]
        server.process.send_signal(signal.SIGTERM)
        started = time.monotonic()
        try:
            server.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail("the server did not exit on SIGTERM:\n" + server.log_path.read_text()[-3000:])
        assert time.monotonic() - started < 30
        assert "object has no attribute" not in server.log_path.read_text(errors="replace")

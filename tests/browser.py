"""What the browser tests share: a real ``jupyter lab`` with this extension, with real-time collaboration or
without it (``rtc=False``: jupyter-collaboration installed but disabled, as most JupyterLab users run), its
state in a private directory, and headless Debian Chromium driven by Playwright (its own browser download
is never used). Chromium comes from the system (``apt-get install chromium``, done by ``python3 dev.py
test`` when run as root); the tests that use it skip only when it is missing, and with ``CI`` set they
fail instead (a CI run cannot be green with the browser untested)."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

import jupyter_agent_tools
from jupyter_agent_tools.testing.server import on_a_free_port, wait_serving

CHROMIUM = os.environ.get("AGENT_TOOLS_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

MISSING = f"no Chromium at {CHROMIUM} (python3 dev.py test installs Debian's chromium when run as root)"
if os.environ.get("CI") and not os.access(CHROMIUM, os.X_OK):
    pytest.fail(f"{MISSING}; CI is set, so the browser tests fail instead of skipping", pytrace=False)
needs_chromium = pytest.mark.skipif(not os.access(CHROMIUM, os.X_OK), reason=MISSING)


def http(method: str, url: str, token: str, body: Any = None, timeout: float = 30) -> tuple[int, Any]:
    """One request with the server's token: (status, the JSON answer or None)."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(
        url, data=data, method=method, headers={"Authorization": f"token {token}"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def wait_until(page: Any, seen: Callable[[], Any], seconds: float, failure: str) -> None:
    """Let the page run (its events reach the test's handlers) until ``seen()`` holds; fail saying
    ``failure`` after ``seconds``."""
    deadline = time.monotonic() + seconds
    while not seen():
        assert time.monotonic() < deadline, failure
        page.wait_for_timeout(50)


def launch(playwright: Any) -> Any:
    """Headless Debian Chromium (Playwright gives every launch a fresh temporary profile)."""
    return playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)


def this_frontend(tmp_path: Path) -> dict[str, str]:
    """The environment that makes a lab load the frontend built into the package under test (a checkout's
    ``jupyter_agent_tools/labextension``, e.g. a worktree's) before an installed copy: ``JUPYTER_PATH``
    comes first in JupyterLab's extension path (in a virtual environment the environment's directory
    comes before the user's). Nothing when the package has none built (an installed wheel has its own)."""
    built = Path(jupyter_agent_tools.__file__).parent / "labextension"
    if not (built / "package.json").is_file():
        return {}
    shutil.copytree(built, tmp_path / "jupyter-path" / "labextensions" / "jupyter-agent-tools")
    return {
        "JUPYTER_PATH": os.pathsep.join(
            filter(None, [str(tmp_path / "jupyter-path"), os.environ.get("JUPYTER_PATH")])
        )
    }


@contextmanager
def running_lab(
    tmp_path: Path, rtc: bool = True, config: dict[str, dict[str, Any]] | None = None
) -> Iterator[dict[str, Any]]:
    """A ``jupyter lab`` subprocess on 127.0.0.1 with a token, all its state under ``tmp_path``:
    ``{"base", "token", "root", "log"}``; with ``rtc=False`` real-time collaboration is off
    (``YDocExtension.disable_rtc``: the page keeps its own copy of a notebook, as plain JupyterLab);
    ``config``: more server configuration, by class (merged into the classes' settings here)."""
    root = tmp_path / "root"
    root.mkdir()
    config_dir = tmp_path / "config"
    config_dir.mkdir()
    settings: dict[str, dict[str, Any]] = {
        "ServerApp": {
            "jpserver_extensions": {
                "jupyterlab": True,
                "jupyter_server_fileid": True,
                "jupyter_server_ydoc": True,
                "jupyter_agent_tools": True,
            }
        },
        "YDocExtension": {
            "disable_rtc": not rtc,
            "document_save_delay": 0.5,
            "session_store_path": str(tmp_path / "sessions.json"),
        },
        "SQLiteYStore": {"db_path": str(tmp_path / "ystore.db")},
        "BaseFileIdManager": {"db_path": str(tmp_path / "fileid.db")},
    }
    for name, values in (config or {}).items():
        settings[name] = {**settings.get(name, {}), **values}
    (config_dir / "jupyter_server_config.json").write_text(json.dumps(settings))
    # No news or update checks (no network; no toast over the page's screenshots).
    notification = tmp_path / "lab-settings" / "@jupyterlab" / "apputils-extension"
    notification.mkdir(parents=True)
    (notification / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False})
    )
    token = secrets.token_hex(16)
    env = {
        **os.environ,
        **this_frontend(tmp_path),
        "JUPYTER_CONFIG_DIR": str(config_dir),
        "JUPYTER_DATA_DIR": str(tmp_path / "data"),
        "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
        "JUPYTERLAB_SETTINGS_DIR": str(tmp_path / "lab-settings"),
        "JUPYTERLAB_WORKSPACES_DIR": str(tmp_path / "lab-workspaces"),
    }
    log_path = tmp_path / "lab.log"
    process: subprocess.Popen[bytes] | None = None
    port = 0

    def start(on_port: int) -> None:
        """Start the lab on ``on_port`` and wait until it answers; PortTaken if another process holds it
        (the lab exits then, instead of moving to another port the test would not know)."""
        nonlocal process, port
        port = on_port
        command = [
            sys.executable,
            "-m",
            "jupyterlab",
            "--ip=127.0.0.1",
            f"--port={port}",
            "--port-retries=0",
            "--no-browser",
            "--allow-root",
            f"--IdentityProvider.token={token}",
            f"--ServerApp.root_dir={root}",
            "--LabApp.expose_app_in_browser=True",  # window.jupyterapp: a test can run the page's commands
        ]
        with log_path.open("ab") as log:
            process = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT)
        wait_serving(
            "jupyter lab",
            process,
            lambda: http("GET", f"http://127.0.0.1:{port}/api/status", token, timeout=2)[0],
            200,
            60,
            stop,
            lambda: log_path.read_text(errors="replace")[-3000:],
        )

    def stop() -> None:
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def restart() -> None:
        """Stop the server and start it again on the same port, with the same state."""
        stop()
        start(port)

    try:
        on_a_free_port(start)
        yield {
            "base": f"http://127.0.0.1:{port}",
            "token": token,
            "root": root,
            "log": log_path,
            "restart": restart,
        }
    finally:
        stop()

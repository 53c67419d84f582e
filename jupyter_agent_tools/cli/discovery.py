"""Which Jupyter server to talk to: flags, then environment variables, then the running servers.

The running servers are the ``jpserver-<pid>.json`` files jupyter_server writes in the Jupyter runtime
directory (what ``jupyter server list`` reads). They are read here directly, with the same rules as
``jupyter_server.serverapp.list_running_servers`` (a file whose process is gone is ignored), because
importing ``jupyter_server.serverapp`` costs seconds on every call of a command that agents run often.
Unlike it, this never deletes another process's files.

A record is trusted only if nobody else could have written it (on Unix): the directory belongs to the user
(or root) and no group or other user may write to it, and the file is a regular file (not a link) that
belongs to the user and that no group or other user may write to. Other records are ignored, so a token
from the environment is never sent to a URL someone else wrote (a sticky world-writable directory such as
``/tmp`` fails: anyone may add a file there).
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SERVER_FILE = re.compile(r"jpserver-(.+)\.json$")
NOT_FOUND = (
    "no running Jupyter server found: start one (`jupyter lab` or `jupyter server`), "
    "or set JUPYTER_AGENT_URL and JUPYTER_AGENT_TOKEN (or pass --url and --token)"
)


class ServerNotFound(Exception):
    """No server was named and none is running."""


class EmptyToken(ServerNotFound):
    """A token was given but is empty: falling back to another (the server's own) would act with rights
    the caller did not ask for."""


class _Untrusted(Exception):
    """A server record someone else could have written."""


@dataclass(frozen=True)
class ServerInfo:
    """Where a server listens, its token, and where that came from (for messages)."""

    url: str
    token: str
    source: str  # "--url", "JUPYTER_AGENT_URL" or the jpserver-*.json file it was read from
    root_dir: str | None = None
    pid: int | None = None


def runtime_dir() -> Path:
    """The Jupyter runtime directory (``JUPYTER_RUNTIME_DIR`` or jupyter_core's default)."""
    from jupyter_core.paths import jupyter_runtime_dir

    return Path(jupyter_runtime_dir())


def _pid_alive(pid: int) -> bool:
    if os.name == "nt":  # os.kill(pid, 0) would terminate the process on Windows
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    except OSError:
        return False
    return True


def _untrusted_dir(directory: Path) -> str | None:
    """Why records in ``directory`` cannot be trusted (someone else could write there), or None."""
    if os.name == "nt":
        return None
    info = os.stat(directory)
    if info.st_uid not in (os.geteuid(), 0):
        return f"{directory} belongs to another user (uid {info.st_uid})"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"other users may write to {directory} (fix: chmod go-w {directory})"
    return None


def _read_record(path: Path) -> tuple[str, float]:
    """The text and mtime of a record the user wrote, or :class:`_Untrusted` saying why it is not
    trusted."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())  # of the file opened, not of whatever the name points to later
        if not stat.S_ISREG(info.st_mode):
            raise _Untrusted(f"{path} is not a regular file")
        if os.name != "nt" and info.st_uid != os.geteuid():
            raise _Untrusted(f"{path} belongs to another user (uid {info.st_uid})")
        if os.name != "nt" and info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise _Untrusted(f"other users may write to {path}")
        return handle.read().decode("utf-8"), info.st_mtime


def running_servers(
    directory: Path | None = None, ignored: list[str] | None = None
) -> list[tuple[Path, dict[str, Any]]]:
    """The running servers recorded in ``directory`` (default: the runtime dir), newest file first.

    Only trusted records count (see the module's docstring); why the others were ignored is appended to
    ``ignored``.
    """
    directory = directory if directory is not None else runtime_dir()
    found: list[tuple[float, Path, dict[str, Any]]] = []
    try:
        names = [name for name in os.listdir(directory) if SERVER_FILE.match(name)]
        distrust = _untrusted_dir(directory) if names else None
    except OSError:
        return []
    if distrust is not None:
        if ignored is not None:
            ignored.append(f"{len(names)} server record(s) ignored: {distrust}")
        return []
    for name in names:
        path = directory / name
        try:
            text, mtime = _read_record(path)
            info = json.loads(text)
        except _Untrusted as e:
            if ignored is not None:
                ignored.append(f"server record ignored: {e}")
            continue
        except (OSError, ValueError):  # being written, gone meanwhile, or a link
            continue
        if not isinstance(info, dict) or not isinstance(info.get("pid"), int) or not _pid_alive(info["pid"]):
            continue
        if not isinstance(info.get("url"), str) or not info["url"].startswith(("http://", "https://")):
            continue  # a server on a Unix socket (http+unix://) is not supported
        found.append((mtime, path, info))
    found.sort(key=lambda item: (-item[0], str(item[1])))
    return [(path, info) for _, path, info in found]


def _root(info: Mapping[str, Any]) -> Path | None:
    root = info.get("root_dir") or info.get("notebook_dir")
    if not isinstance(root, str) or not root:
        return None
    return Path(os.path.realpath(os.path.expanduser(root)))


def _contains(root: Path, cwd: Path) -> bool:
    return cwd == root or root in cwd.parents


def _same_url(a: str, b: str) -> bool:
    return a.rstrip("/") == b.rstrip("/")


def check_not_empty(token: str | None, env: Mapping[str, str]) -> None:
    """:class:`EmptyToken` when the token given (``--token``, else ``JUPYTER_AGENT_TOKEN``) is empty."""
    if token is not None:
        if not token.strip():
            raise EmptyToken("--token is empty: pass the token itself (or leave --token out)")
        return
    if "JUPYTER_AGENT_TOKEN" in env and not env["JUPYTER_AGENT_TOKEN"].strip():
        raise EmptyToken(
            "JUPYTER_AGENT_TOKEN is set but empty (did the command that set it fail?): set it to a token "
            "(`jupyter agent token create NAME --scopes ...` prints one), or unset it to use the token of "
            "the server found otherwise"
        )


def find_server(
    url: str | None = None,
    token: str | None = None,
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
    directory: Path | None = None,
    note: Callable[[str], None] | None = None,
) -> ServerInfo:
    """The server to use.

    ``url``/``token`` (the flags) win; else ``JUPYTER_AGENT_URL`` and ``JUPYTER_AGENT_TOKEN`` (the token
    falls back to ``JUPYTER_TOKEN``, then ``JUPYTERHUB_API_TOKEN`` (a hub API token for a single-user
    server's URL), then to the token a running server with that URL recorded); else the
    running server whose root directory holds ``cwd`` (the deepest such root; without one, the newest
    server) with the token it recorded (``--token``, then the environment's token, when it recorded
    none). Only trusted records count (see the module's docstring). ``note`` is told which server was
    picked when several run, and why records were ignored. Raises :class:`ServerNotFound`, and
    :class:`EmptyToken` for an empty ``--token`` or ``JUPYTER_AGENT_TOKEN`` (e.g. from a command that
    failed), which never falls back to another token.
    """
    env = os.environ if env is None else env
    check_not_empty(token, env)
    env_token = env.get("JUPYTER_AGENT_TOKEN") or env.get("JUPYTER_TOKEN") or env.get("JUPYTERHUB_API_TOKEN")
    source = "--url"
    if url is None and env.get("JUPYTER_AGENT_URL"):
        url, source = env["JUPYTER_AGENT_URL"], "JUPYTER_AGENT_URL"
    if url is not None:
        token = token if token is not None else env_token
        if token is None:  # the token a local server with this URL recorded, if any
            for _, info in running_servers(directory):
                if _same_url(str(info["url"]), url):
                    token = str(info.get("token") or "")
                    break
        return ServerInfo(url, token or "", source)

    ignored: list[str] = []
    servers = running_servers(directory, ignored)
    if note is not None:
        for reason in ignored:
            note(reason)
    if not servers:
        raise ServerNotFound(NOT_FOUND)
    here = Path(os.path.realpath(cwd if cwd is not None else os.getcwd()))
    holding = [(p, i) for p, i in servers if (r := _root(i)) is not None and _contains(r, here)]
    if holding:
        # the most specific root wins; among equal roots, the newest file (the list is newest first)
        path, info = max(holding, key=lambda item: len((_root(item[1]) or Path()).parts))
        why = "its root directory holds the current directory"
    else:
        path, info = servers[0]
        why = "the newest; none has a root directory holding the current directory"
    picked = ServerInfo(
        url=str(info["url"]),
        token=token if token is not None else str(info.get("token") or env_token or ""),
        source=str(path),
        root_dir=str(_root(info)) if _root(info) is not None else None,
        pid=int(info["pid"]),
    )
    if len(servers) > 1 and note is not None:
        note(
            f"{len(servers)} Jupyter servers are running; using {picked.url} (root {picked.root_dir}): {why}"
        )
    return picked

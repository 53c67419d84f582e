"""Which of a local kernel's TCP ports another process listens on (Linux ``/proc``).

jupyter_client picks a kernel's ports by binding port 0 and releasing it, in the server's process: until
the kernel binds them, any other process may take one (another user's server on a shared host, another
kernel), and the kernel then fails to bind it ("Address already in use"). ipykernel does not even exit
then: it hangs at interpreter exit, alive and never answering.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

LISTEN = "0A"  # TCP_LISTEN, as /proc/net/tcp writes a socket's state


def ports_taken(pid: int, ports: Iterable[int]) -> list[int] | None:
    """Of ``ports``, those a socket in LISTEN state holds that is not open in process ``pid`` or one of
    its descendants (a kernel may be a wrapper's child), read from ``/proc`` in the process's own network
    namespace. None when that cannot be told: no ``/proc`` (not Linux), the process gone or unreadable, or
    its children not listed (kernels without ``CONFIG_PROC_CHILDREN``).

    The listening sockets are read before the process's own: a socket the kernel binds in between is then
    found among its own, never taken for another process's. Takes milliseconds (measured ~4 ms per table
    with 40 sockets: Linux walks its whole TCP hash tables to write them): call it off the event loop.
    """
    wanted = set(ports)
    try:
        listening = _listening(pid, wanted)
        if not listening:
            return []
        own = _socket_inodes(_tree(pid))
    except OSError:  # no /proc, the process exited, or another user's
        return None
    return sorted(port for port, inodes in listening.items() if not inodes & own)


def _listening(pid: int, ports: set[int]) -> dict[int, set[int]]:
    """The inodes of the LISTEN sockets on each of ``ports`` (IPv4 and IPv6) in ``pid``'s namespace."""
    found: dict[int, set[int]] = {}
    for table in ("tcp", "tcp6"):
        path = f"/proc/{pid}/net/{table}"
        if table == "tcp6" and not os.path.exists(path):  # IPv6 disabled
            continue
        with open(path, encoding="ascii") as lines:
            next(lines, None)  # the header
            for line in lines:
                # sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
                fields = line.split(None, 10)
                if len(fields) < 10 or fields[3] != LISTEN:
                    continue
                port = int(fields[1].rpartition(":")[2], 16)
                if port in ports:
                    found.setdefault(port, set()).add(int(fields[9]))
    return found


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants (``/proc/<pid>/task/<tid>/children``); raises when ``pid``'s are not
    listed."""
    tree, todo = [], [pid]
    while todo:
        current = todo.pop()
        try:
            for tid in os.listdir(f"/proc/{current}/task"):
                with open(f"/proc/{current}/task/{tid}/children", encoding="ascii") as children:
                    todo.extend(int(child) for child in children.read().split())
        except FileNotFoundError:
            if current == pid:
                raise
            continue  # a descendant that exited meanwhile: its sockets are gone with it
        tree.append(current)
    return tree


def _socket_inodes(pids: list[int]) -> set[int]:
    """The inodes of the sockets open in ``pids`` (``/proc/<pid>/fd/N -> socket:[inode]``); raises when
    the first one's cannot be listed."""
    inodes: set[int] = set()
    for pid in pids:
        fd_dir = f"/proc/{pid}/fd"
        try:
            fds = os.listdir(fd_dir)
        except FileNotFoundError:
            if pid == pids[0]:
                raise
            continue  # a descendant that exited meanwhile
        for fd in fds:
            try:
                target = os.readlink(f"{fd_dir}/{fd}")
            except OSError:  # closed meanwhile
                continue
            if target.startswith("socket:["):
                inodes.add(int(target[8:-1]))
    return inodes

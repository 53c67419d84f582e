"""execution/ports.py: which of a starting kernel's ports another process listens on, read from /proc."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

from jupyter_agent_tools.execution.ports import ports_taken

pytestmark = [pytest.mark.quick, pytest.mark.skipif(not os.path.isdir("/proc/self/net"), reason="/proc")]

LISTEN_AND_WAIT = (
    "import socket, sys\n"
    "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(1)\n"
    "print(s.getsockname()[1], flush=True); sys.stdin.read()\n"
)


@pytest.fixture
def listening() -> Iterator[int]:
    """A port this process listens on."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        yield held.getsockname()[1]


@pytest.fixture
def child() -> Iterator[tuple[int, int]]:
    """(pid, port) of a child process listening on a port of its own."""
    process = subprocess.Popen(
        [sys.executable, "-c", LISTEN_AND_WAIT], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert process.stdout is not None
    yield process.pid, int(process.stdout.readline())
    process.communicate("")


def test_another_process_listening_on_a_port_is_told(listening, child):
    pid, own = child
    assert ports_taken(pid, [own, listening]) == [listening]


def test_ports_of_the_process_and_its_descendants_are_its_own(listening, child):
    """A kernel spec may start the kernel as a wrapper's child: the child's ports are the kernel's."""
    _, descendant = child
    assert ports_taken(os.getpid(), [listening, descendant]) == []


def test_a_port_nobody_listens_on_is_not_taken(child):
    with socket.socket() as bound:  # bound, not listening: what jupyter_client's choice of a port leaves
        bound.bind(("127.0.0.1", 0))
        assert ports_taken(child[0], [bound.getsockname()[1]]) == []


def test_a_process_that_is_gone_tells_nothing(listening):
    process = subprocess.Popen([sys.executable, "-c", ""])
    process.wait()
    assert ports_taken(process.pid, [listening]) is None

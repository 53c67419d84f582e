"""The test harness's servers listen on a port that is theirs: when another process (here a ZeroMQ socket,
as a kernel's) takes the free port the harness picked before the server binds it, the server starts again
on another port instead of the tests talking to the squatter (what broke the browser tests once in CI)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from jupyter_agent_tools.testing import server as harness


@pytest.fixture
def squatted_port() -> Iterator[int]:
    """A port of 127.0.0.1 held by a ZeroMQ ROUTER socket, the kind a kernel binds."""
    context = zmq.Context()
    socket = context.socket(zmq.ROUTER)
    port = socket.bind_to_random_port("tcp://127.0.0.1")
    try:
        yield port
    finally:
        socket.close(linger=0)
        context.term()


def test_a_server_whose_port_was_taken_starts_on_another(
    squatted_port: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    picked = [squatted_port]  # the first "free" port is the squatted one: the race, made certain
    real_free_port = harness.free_port
    monkeypatch.setattr(harness, "free_port", lambda: picked.pop() if picked else real_free_port())
    with harness.jupyter_server(tmp_path / "root", startup_timeout=60) as server:
        assert not picked, "the harness did not try the taken port"
        assert f":{squatted_port}/" not in server.url
        with server.client(timeout=30) as client:
            status, _ = client.request("GET", "api/agent/sessions")
        assert status == 200


def test_a_port_taken_on_every_attempt_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    tried: list[int] = []

    def start(port: int) -> None:
        tried.append(port)
        raise harness.PortTaken(f"port {port} is not available")

    ports = iter(range(40001, 40100))
    monkeypatch.setattr(harness, "free_port", lambda: next(ports))
    with pytest.raises(harness.PortTaken, match="port 40003 is not available"):
        harness.on_a_free_port(start, attempts=3)
    assert tried == [40001, 40002, 40003]


def test_free_ports_come_from_below_the_range_kernels_get_theirs_from() -> None:
    """A kernel's ports (jupyter_client binds port 0) come from the OS's ephemeral range; a port chosen
    below it cannot be taken by a kernel started before the server binds it."""
    floor = harness._ephemeral_floor()
    assert floor - harness.PORTS_BELOW_EPHEMERAL[0] >= 1000, "this machine's ephemeral range starts too low"
    ports = {harness.free_port() for _ in range(20)}
    assert all(harness.PORTS_BELOW_EPHEMERAL[0] <= port < floor for port in ports), ports
    assert len(ports) > 1  # chosen at random: workers do not all try the same one first

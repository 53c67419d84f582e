"""Kernel death and restart in session mode, with real ipykernel kernels that really die."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from jupyter_agent_tools.execution.eval_answer import OUTPUT_MAY_BE_INCOMPLETE
from jupyter_agent_tools.testing.kernelspecs import RUN_IPYKERNEL, script_kernelspec

pytestmark = pytest.mark.timeout(180)

STATE_LOST = "Kernel died during this call while running cell"
DEAD_BEFORE = "Kernel had died and was restarted before this call"
BY_MANAGER = "Kernel was restarted by the server since the last call"


def server_config(**sessions: Any) -> dict[str, Any]:
    return {
        "ServerApp": {"jpserver_extensions": {"jupyter_agent_tools": True}},
        "EvalSessionManager": {"heartbeat_interval": 0, **sessions},
    }


@pytest.fixture
def jp_server_config() -> dict[str, Any]:
    return server_config()


def agent_app(jp_serverapp):
    return jp_serverapp.web_app.settings["jupyter_agent_tools"]


async def kernel_pid(evaluate, session: str) -> int:
    return int((await evaluate("import os; print(os.getpid())", session=session))["output"])


async def test_kernel_death_during_run_restarts_and_reruns(evaluate, jp_root_dir, api):
    (jp_root_dir / "work").mkdir()
    await evaluate("before = 1", session="s", cwd="work", env={"FLAVOR": "mint"})
    die_once = (
        "import os, pathlib\n"
        "marker = pathlib.Path('died-once')\n"
        "if not marker.exists():\n"
        "    marker.touch()\n"
        "    os._exit(1)\n"
        "print('survived in', os.path.basename(os.getcwd()), os.environ['FLAVOR'])\n"
        "print('before' in globals())"
    )
    result = await evaluate(die_once, session="s", cwd="work", env={"FLAVOR": "mint"})
    assert result["restarted"] is True
    assert result["cells"][0]["status"] == "complete"
    assert result["cells"][0]["output"] == "survived in work mint\nFalse\n"
    assert STATE_LOST in result["output"]
    _, listing = await api("GET", "sessions")
    (entry,) = [s for s in listing["sessions"] if s["name"] == "s"]
    assert entry["restarts"] == 1 and entry["recoveries"]["restarts"] == 1


async def test_second_death_in_one_call_gives_up_and_next_call_starts_clean(evaluate, jp_serverapp):
    first = await evaluate("1", session="doomed")
    result = await evaluate("import os; os._exit(1)", session="doomed")
    assert result["error"].startswith("Python kernel restarted too many times in this session: ")
    assert result["output"].endswith(result["error"])
    assert result["restarted"] is True
    assert first["kernel_id"] not in jp_serverapp.kernel_manager.list_kernel_ids()
    after = await evaluate("print('fresh')", session="doomed")
    assert after["output"] == "fresh\n"


async def test_a_cell_that_kills_the_kernel_is_told_as_one_story(evaluate, api):
    """Which cell the kernel died in, that state is lost, what was re-run: never "state persists"."""
    result = await evaluate("x = 1", "import os; os._exit(1)", session="crash")
    output = result["output"]
    assert output.startswith("[Kernel died during this call while running cell 2 and was restarted;")
    assert "[2/2]\n(no output: the kernel died while running this cell)" in output
    assert "Cell 2 failed (exit code 1). The kernel died while running it." in output
    assert "their state persists" not in output
    assert result["error"].startswith("Python kernel restarted too many times in this session: the kernel ")
    assert "died while running cell 2, and again on the re-run" in result["error"]
    assert output.endswith(result["error"]) and result["restarted"] is True
    assert [c["status"] for c in result["cells"]] == ["complete", "error"]


class TestDeadBeforeRun:
    @pytest.fixture
    def jp_server_config(self) -> dict[str, Any]:
        config = server_config(heartbeat_interval=0)
        config["KernelManager"] = {"autorestart": False}
        return config

    async def test_kernel_found_dead_before_run_is_restarted(self, evaluate, api):
        pid = await kernel_pid(evaluate, "victim")
        await evaluate("x = 1", session="victim", env={"K": "v"})
        os.kill(pid, signal.SIGKILL)
        await asyncio.sleep(0.5)
        result = await evaluate(
            f"import os\nprint('x' in globals(), os.environ['K'], os.getpid() != {pid})",
            session="victim",
            env={"K": "v"},
        )
        assert result["restarted"] is True
        assert result["cells"][0]["output"] == "False v True\n"
        assert DEAD_BEFORE in result["output"]
        _, listing = await api("GET", "sessions")
        (entry,) = [s for s in listing["sessions"] if s["name"] == "victim"]
        assert entry["recoveries"]["restarts"] == 1


async def test_kernel_killed_while_idle_any_path_recovers(evaluate):
    """With the manager's auto-restart racing us, whichever path wins, state loss is reported."""
    pid = await kernel_pid(evaluate, "racer")
    await evaluate("x = 1", session="racer")
    os.kill(pid, signal.SIGKILL)
    result = await evaluate("print('x' in globals())", session="racer")
    assert result["restarted"] is True
    assert result["cells"][0]["output"] == "False\n"
    assert any(n in result["output"] for n in (DEAD_BEFORE, BY_MANAGER, STATE_LOST))


class TestHeartbeat:
    @pytest.fixture
    def jp_server_config(self) -> dict[str, Any]:
        config = server_config(heartbeat_interval=0.3)
        config["KernelManager"] = {"autorestart": False}
        return config

    async def test_heartbeat_detects_dead_idle_kernel(self, evaluate, api, jp_serverapp):
        first = await evaluate("import os; print(os.getpid())", session="hb")
        pid = int(first["output"])
        os.kill(pid, signal.SIGKILL)
        for _ in range(100):
            _, listing = await api("GET", "sessions")
            (entry,) = [s for s in listing["sessions"] if s["name"] == "hb"]
            if entry["recoveries"].get("deaths"):
                break
            await asyncio.sleep(0.1)
        assert entry["recoveries"]["deaths"] == 1
        assert entry["kernel_id"] is None
        # The session lets go of the kernel id before the (awaited) shutdown of what is left of it ends.
        for _ in range(100):
            if first["kernel_id"] not in jp_serverapp.kernel_manager.list_kernel_ids():
                break
            await asyncio.sleep(0.1)
        assert first["kernel_id"] not in jp_serverapp.kernel_manager.list_kernel_ids()
        result = await evaluate("print('back')", session="hb")
        assert result["restarted"] is True and DEAD_BEFORE in result["output"]
        assert result["cells"][0]["output"] == "back\n"


class TestManagerRestart:
    async def test_a_restart_through_the_kernel_manager_reruns_init(
        self, evaluate, jp_serverapp, jp_root_dir
    ):
        """What JupyterLab's "Restart Kernel" does to a session's kernel: the same kernel id, a new process;
        the next call says so and runs the init step again."""
        (jp_root_dir / "here").mkdir()
        first = await evaluate("import os; print(os.getpid())", session="m", cwd="here", env={"E": "1"})
        pid = int(first["output"])
        await jp_serverapp.kernel_manager.restart_kernel(first["kernel_id"])
        result = await evaluate(
            "import os\nprint(os.path.basename(os.getcwd()), os.environ['E'], os.getpid())",
            session="m",
            cwd="here",
            env={"E": "1"},
        )
        assert result["restarted"] is True and BY_MANAGER in result["output"], result["output"]
        where, env, new_pid = result["cells"][0]["output"].split()
        assert (where, env) == ("here", "1") and int(new_pid) != pid
        assert result["kernel_id"] == first["kernel_id"]  # the manager restarted the same kernel

    async def test_a_dead_kernel_of_ours_is_not_also_restarted_by_its_manager(self, evaluate, jp_serverapp):
        """A session's kernel is replaced by the session's recovery only: the manager's auto-restarter,
        racing it, restarted a process nobody used and failed with InvalidStateError in the log."""
        first = await evaluate("import os; print(os.getpid())", session="solo")
        kernel = jp_serverapp.kernel_manager.get_kernel(first["kernel_id"])
        restarts: list[str] = []
        kernel.add_restart_callback(lambda: restarts.append("restart"), "restart")
        os.kill(int(first["output"]), signal.SIGKILL)
        await asyncio.sleep(kernel.restarter_class.time_to_dead.default_value * 2 + 1)
        assert restarts == []
        result = await evaluate("print('fresh')", session="solo")
        assert result["restarted"] is True and result["cells"][0]["output"] == "fresh\n"


async def test_failed_execute_counts_as_kernel_loss(evaluate, jp_serverapp):
    """A connection that can no longer send (here: its channels were stopped under it) is recovered."""
    await evaluate("y = 2", session="broken-conn")
    session = agent_app(jp_serverapp).eval_service.sessions.get("broken-conn")
    await session.connection.close()
    result = await evaluate("print('y' in globals())", session="broken-conn")
    assert result["restarted"] is True
    assert result["cells"][0]["output"] == "False\n"


class TestLostIdle:
    """Nothing is lost to a slow reader any more (tests/test_runs_bounds.py::TestOutputUnderLoad); past
    the connection's bounds (iopub_buffer_bytes, then iopub_spill_bytes) messages are still dropped."""

    @pytest.fixture
    def jp_server_config(self) -> dict[str, Any]:
        return {
            **server_config(),
            "KernelService": {"iopub_buffer_bytes": 100_000, "iopub_spill_bytes": 1_000_000},
        }

    async def test_lost_idle_status_does_not_hang_the_session(self, evaluate, api, tmp_path):
        """Block the server's event loop while the kernel floods iopub past what the connection may hold
        (its buffer and its spill file, both made small here): the connection drops the rest, the final
        idle status among them. The call must end shortly after its reply instead of waiting for its timeout.

        The kernel floods only once the loop is blocked, and the loop stays blocked until the flood (and so
        the idle after it) has been sent: the end of the output is always dropped."""
        await evaluate("1", session="flood")
        started, go, done = (str(tmp_path / name) for name in ("started", "go", "done"))
        code = (
            "import os, sys, time\n"
            f"open({started!r}, 'w').close()\n"
            f"while not os.path.exists({go!r}):\n    time.sleep(0.01)\n"
            "for i in range(5000):\n    sys.stdout.write(f'{i:04d}' * 1000 + '\\n'); sys.stdout.flush()\n"
            f"open({done!r}, 'w').close()\n"
        )
        call = asyncio.ensure_future(evaluate(code, session="flood", timeout=60))
        while not os.path.exists(started):
            await asyncio.sleep(0.01)
        open(go, "w").close()
        deadline = time.monotonic() + 30
        while not os.path.exists(done) and time.monotonic() < deadline:
            time.sleep(0.01)  # the server shares this event loop: nothing reads iopub meanwhile
        time.sleep(0.5)  # the reply and the idle after the flood are sent (and the idle dropped)
        result = await call
        cell = result["cells"][0]
        assert result["timed_out"] is False
        assert cell["status"] == "complete"
        assert not cell["output"].endswith("4999\n")
        assert cell["total_lines"] < 5000  # messages were really lost
        assert OUTPUT_MAY_BE_INCOMPLETE in result["output"]  # and the answer says so
        _, listing = await api("GET", "sessions")
        (entry,) = [s for s in listing["sessions"] if s["name"] == "flood"]
        assert entry["recoveries"].get("lost_idle") == 1
        assert (await evaluate("print('next')", session="flood"))["output"] == "next\n"


async def test_a_kernel_that_dies_before_answering_is_started_again_once(evaluate, api, dies_once_kernelspec):
    result = await evaluate("print('up')", session="ports", kernel_name=dies_once_kernelspec)
    assert result["output"] == "up\n"
    _, listing = await api("GET", "sessions")
    assert listing["totals"]["create_retries"] == 1


class TestKernelDeadAtStartUp:
    """A kernel that dies at start-up because another process took one of its ports ("Address already in
    use", seen in CI under two workers) was restarted by its manager's restarter on the same cached ports,
    where it could never answer, yet it was alive to ``is_alive``: the start waited ``ready_timeout`` and
    failed with 503. Here its restarts are made to find the port still taken (they never answer) and the
    restarter polls faster than the start checks for a dead kernel (once a second), so before the fix it
    always resurrected the kernel first."""

    @pytest.fixture
    def jp_server_config(self) -> dict[str, Any]:
        return {
            **server_config(),
            "KernelService": {"ready_timeout": 20},
            "KernelPool": {"size": 0},
            "IOLoopKernelRestarter": {"time_to_dead": 0.2},
        }

    @pytest.fixture
    def port_lost_kernelspec(self, jp_kernel_dir: Path, tmp_path: Path) -> str:
        seen = tmp_path / "connection-files"
        code = (
            "import os, runpy, sys, time\n"
            f"seen = {str(seen)!r}\n"
            "files = open(seen).read().split() if os.path.exists(seen) else []\n"
            "this = sys.argv[sys.argv.index('-f') + 1]\n"
            "open(seen, 'a').write(this + '\\n')\n"
            "if this in files:  # restarted by its manager, on the port still taken: never answers\n"
            "    time.sleep(600)\n"
            "if not files:  # the first kernel loses a port\n"
            "    time.sleep(0.3)\n"
            "    sys.exit(1)\n" + RUN_IPYKERNEL
        )
        return script_kernelspec(jp_kernel_dir, "port_lost", code, "Port lost")

    async def test_another_kernel_is_started_instead(self, evaluate, api, port_lost_kernelspec, tmp_path):
        result = await evaluate("print('up')", session="ports", kernel_name=port_lost_kernelspec)
        assert result["output"] == "up\n"
        _, listing = await api("GET", "sessions")
        assert listing["totals"]["create_retries"] == 1
        started = (tmp_path / "connection-files").read_text().split()
        assert len(started) == len(set(started)) == 2, started  # never restarted on its old ports


@pytest.mark.skipif(not os.path.isdir("/proc/self/net"), reason="told from Linux /proc only")
class TestPortTakenBeforeTheKernelBoundIt:
    """A kernel whose port another process took between jupyter_client choosing it (bind to port 0, release,
    in the server's process) and the kernel binding it fails with "Address already in use", and ipykernel
    then hangs instead of exiting: alive to ``is_alive``, it made the start wait the whole ``ready_timeout``
    and fail with 503 (seen on a hub, where every user's server runs on one host). The race cannot be made
    to happen on demand: here the first kernel is given, as its iopub port, a port this process (the
    server's) holds listening, which is what the kernel meets when it loses the race."""

    @pytest.fixture
    def jp_server_config(self) -> dict[str, Any]:
        return {**server_config(), "KernelService": {"ready_timeout": 30}}

    @pytest.fixture
    def held_port(self) -> Any:
        held = socket.socket()
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        yield held.getsockname()[1]
        held.close()

    @pytest.fixture
    def kernel_pids(self, monkeypatch: pytest.MonkeyPatch, held_port: int) -> list[int]:
        from jupyter_client.connect import LocalPortCache
        from jupyter_client.provisioning.local_provisioner import LocalProvisioner

        choose, launch = LocalPortCache.find_available_port, LocalProvisioner.launch_kernel
        chosen: list[int] = []
        pids: list[int] = []

        def find_available_port(self: Any, ip: str) -> int:
            chosen.append(choose(self, ip))
            return held_port if len(chosen) == 2 else chosen[-1]  # the first kernel's iopub port

        async def launch_kernel(self: Any, cmd: list[str], **kwargs: Any) -> Any:
            info = await launch(self, cmd, **kwargs)
            pids.append(self.pid)
            return info

        monkeypatch.setattr(LocalPortCache, "find_available_port", find_available_port)
        monkeypatch.setattr(LocalProvisioner, "launch_kernel", launch_kernel)
        return pids

    async def test_another_kernel_is_started_at_once(self, evaluate, api, kernel_pids):
        began = time.monotonic()
        result = await evaluate("print('up')", session="taken")
        took = time.monotonic() - began
        assert result["output"] == "up\n"
        assert took < 20, f"{took:.1f} s: the start waited for ready_timeout (30 s)"
        _, listing = await api("GET", "sessions")
        assert listing["totals"]["create_retries"] == 1
        first, second = kernel_pids
        assert second != first and os.path.exists(f"/proc/{second}")
        assert not os.path.exists(f"/proc/{first}")  # killed and reaped, not left hanging


class TestPortCheckOff(TestPortTakenBeforeTheKernelBoundIt):
    """``KernelService.check_ports = False`` (a kernelspec whose ports another process serves): a kernel
    whose port is held elsewhere is left to answer within ``ready_timeout``."""

    @pytest.fixture
    def jp_server_config(self) -> dict[str, Any]:
        return {**server_config(), "KernelService": {"ready_timeout": 3, "check_ports": False}}

    async def test_another_kernel_is_started_at_once(self, evaluate, api, kernel_pids):
        began = time.monotonic()
        status, answer = await api("POST", "eval", body={"cells": [{"code": "1"}], "session": "held"})
        took = time.monotonic() - began
        assert status == 503 and "didn't respond in 3 seconds" in answer["message"], answer
        assert took >= 3  # waited for ready_timeout: no port check ended it early

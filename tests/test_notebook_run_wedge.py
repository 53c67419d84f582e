"""The notebook run's kernel when it will not stop or will not answer (real kernels, real processes).

A cell that ignores SIGINT and spins cannot be interrupted: the run restarts the notebook's kernel through
the server's kernel manager (same kernel id, as JupyterLab's "Restart Kernel"), says which cell would not
stop, and the next run works at once. A kernel that never answers (a kernelspec whose process starts and
never speaks ZMQ, written by the test) answers 503 with Retry-After within the call's bounds, never 500.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import nbformat
import psutil
import pytest
from nbformat.v4 import new_code_cell, new_notebook
from test_notebook_run import make, run

from jupyter_agent_tools.testing.kernelspecs import script_kernelspec

TIMEOUT = 2  # the wedged run's timeout (s)
INTERRUPT_TIMEOUT = 1.0
READY_TIMEOUT = (
    10.0  # KernelService.ready_timeout: far above TIMEOUT, so a wait bounded by TIMEOUT is visible
)
WEDGE = (
    "import os, signal\nprint(os.getpid(), flush=True)\n"
    "signal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass"
)
SILENT = {"name": "silent", "display_name": "Silent", "language": "python"}


@pytest.fixture
def silent_kernelspec(jp_kernel_dir: Path, tmp_path: Path) -> str:
    """A kernelspec whose process starts and never answers (no ZMQ at all), in the test's private dirs."""
    code = "import time\nwhile True:\n    time.sleep(60)\n"
    return script_kernelspec(jp_kernel_dir, SILENT["name"], code, SILENT["display_name"])


@pytest.fixture
def jp_server_config(silent_kernelspec: str) -> dict[str, Any]:
    return {
        "ServerApp": {"jpserver_extensions": {"jupyter_agent_tools": True}},
        "CellExecutor": {"interrupt_grace": INTERRUPT_TIMEOUT},
        "KernelService": {"ready_timeout": READY_TIMEOUT},
        # the silent process ignores shutdown requests: do not wait long for it at teardown
        "KernelManager": {"shutdown_wait_time": 1.0},
    }


async def sessions(jp_fetch: Any, path: str) -> list[dict[str, Any]]:
    listing = json.loads((await jp_fetch("api", "sessions")).body)
    return [s for s in listing if s["path"] == path]


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


async def test_a_cell_ignoring_the_interrupt_restarts_the_notebook_kernel_and_the_next_run_works(
    api, jp_fetch, jp_root_dir
):
    make(jp_root_dir, "wedge.ipynb", "x = 1", WEDGE, "print('x' in globals())")
    before = await run(api, "wedge.ipynb", cell_ids=["c0"])
    kernel_id = before["kernel_id"]

    started = time.monotonic()
    first = await run(api, "wedge.ipynb", all=True, timeout=TIMEOUT)
    first_seconds = time.monotonic() - started
    assert [c["status"] for c in first["cells"]] == ["complete", "cancelled", "not_run"]
    assert first["restarted"] is True and first["timed_out"] is True
    output = first["output"]
    assert "Cell 1 (id c1) did not stop after the interrupt" in output, output
    assert "restarted" in output and "state is lost" in output, output
    assert "died" not in output, output  # it did not die: it was restarted because it would not stop
    spun = int(first["cells"][1]["output"].split()[0])
    assert gone(spun), "the kernel process that ignored the interrupt still runs"
    assert first["kernel_id"] == kernel_id  # restarted in place, as JupyterLab's Restart Kernel does
    (model,) = await sessions(jp_fetch, "wedge.ipynb")
    assert model["kernel"]["id"] == kernel_id
    assert first_seconds < TIMEOUT + INTERRUPT_TIMEOUT + READY_TIMEOUT

    started = time.monotonic()
    second = await run(api, "wedge.ipynb", cell_ids=["c2"], timeout=TIMEOUT)
    second_seconds = time.monotonic() - started
    assert second["cells"][0]["output"] == "False\n"  # the restarted kernel: x is gone
    assert second["kernel_id"] == kernel_id and second["restarted"] is False
    assert second_seconds < TIMEOUT, f"the run after the restart took {second_seconds:.1f} s"


async def test_an_existing_kernel_that_does_not_answer_is_a_503_within_the_call_timeout(
    jp_fetch, jp_root_dir, silent_kernelspec
):
    nb = new_notebook(cells=[new_code_cell("1")], metadata={"kernelspec": SILENT})
    nbformat.write(nb, str(jp_root_dir / "silent.ipynb"))
    body = {"path": "silent.ipynb", "type": "notebook", "name": "s", "kernel": {"name": silent_kernelspec}}
    await jp_fetch("api", "sessions", method="POST", body=json.dumps(body))  # as JupyterLab opens it
    started = time.monotonic()
    response = await jp_fetch(
        "api",
        "agent",
        "notebooks",
        "silent.ipynb",
        "run",
        method="POST",
        body=json.dumps({"all": True, "timeout": TIMEOUT}),
        raise_error=False,
        request_timeout=READY_TIMEOUT * 3,
    )
    seconds = time.monotonic() - started
    answer = json.loads(response.body)
    assert response.code == 503, answer
    assert int(response.headers["Retry-After"]) > 0
    assert "did not answer" in answer["message"] and "nothing was run" in answer["message"], answer
    assert seconds < READY_TIMEOUT, f"the attach waited {seconds:.1f} s, past the call's timeout"
    assert len(await sessions(jp_fetch, "silent.ipynb")) == 1  # a person's kernel is left alone


async def test_a_new_kernel_that_never_answers_is_a_503_and_left_behind_nowhere(
    jp_fetch, jp_root_dir, silent_kernelspec
):
    nb = new_notebook(cells=[new_code_cell("1")], metadata={"kernelspec": SILENT})
    nbformat.write(nb, str(jp_root_dir / "fresh-silent.ipynb"))
    response = await jp_fetch(
        "api",
        "agent",
        "notebooks",
        "fresh-silent.ipynb",
        "run",
        method="POST",
        body=json.dumps({"all": True, "timeout": TIMEOUT}),
        raise_error=False,
        request_timeout=READY_TIMEOUT * 3,
    )
    answer = json.loads(response.body)
    assert response.code == 503, answer
    assert int(response.headers["Retry-After"]) > 0
    assert "did not answer" in answer["message"], answer
    assert await sessions(jp_fetch, "fresh-silent.ipynb") == []  # the session the run created is gone
    kernels = json.loads((await jp_fetch("api", "kernels")).body)
    assert [k for k in kernels if k["name"] == silent_kernelspec] == []

"""POST /api/agent/notebooks/{path}/run: a notebook's own cells in its own kernel, outputs written back."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook
from samples import KERNELSPEC, PNG_1PX

from jupyter_agent_tools.testing.kernelspecs import script_kernelspec


@pytest.fixture
def jp_server_config() -> dict[str, Any]:
    return {
        "ServerApp": {"jpserver_extensions": {"jupyter_agent_tools": True}},
        "NotebookRunner": {"max_output_bytes_stored": 4096},
        "CellExecutor": {"interrupt_grace": 2.0},
    }


def make(root: Path, name: str, *sources: str, markdown_at: int | None = None) -> Path:
    cells = [new_code_cell(source) for source in sources]
    if markdown_at is not None:
        cells.insert(markdown_at, new_markdown_cell("# notes"))
    for i, cell in enumerate(cells):
        cell["id"] = f"c{i}"
    nb = new_notebook(cells=cells, metadata={"kernelspec": dict(KERNELSPEC)})
    path = root / name
    nbformat.write(nb, str(path))
    return path


def stored(path: Path) -> nbformat.NotebookNode:
    nb = nbformat.read(str(path), as_version=nbformat.NO_CONVERT)
    nbformat.validate(nb)
    return nb


async def run(api: Any, name: str, expect: int = 200, **body: Any) -> dict[str, Any]:
    if not {"cell_ids", "cell_indices", "all"} & set(body):
        body["all"] = True
    status, answer = await api("POST", "notebooks", name, "run", body=body)
    assert status == expect, answer
    return dict(answer)


EVERY_KIND = [
    "print('a')\nprint('b')",
    "import sys\nsys.stderr.write('warn\\n')\n40 + 2",
    "from IPython.display import display, Image, HTML, clear_output\n"
    "import base64\n"
    f"display(Image(data=base64.b64decode('{PNG_1PX}')))\n"
    "display(HTML('<b>x</b>'))",
    "from IPython.display import display, clear_output\n"
    "print('old frame')\nclear_output(wait=True)\nprint('new frame')\n"
    "h = display('0%', display_id=True)\nh.update('100%')",
    "1/0",
]


async def test_outputs_of_every_kind_land_in_the_file(api, jp_root_dir):
    path = make(jp_root_dir, "kinds.ipynb", *EVERY_KIND)
    answer = await run(api, "kinds.ipynb", stop_on_error=False, all=True)
    assert [c["status"] for c in answer["cells"]] == ["complete"] * 4 + ["error"]
    cells = stored(path).cells
    assert cells[0].outputs == [{"output_type": "stream", "name": "stdout", "text": "a\nb\n"}]
    kinds = [o["output_type"] for o in cells[1].outputs]
    assert kinds == ["stream", "execute_result"]
    assert cells[1].outputs[1]["data"]["text/plain"] == "42"
    assert cells[1].outputs[1]["execution_count"] == cells[1].execution_count
    image, html = cells[2].outputs
    assert image["data"]["image/png"].strip() == PNG_1PX and html["data"]["text/html"] == "<b>x</b>"
    texts = [o.get("text") or o.get("data", {}).get("text/plain") for o in cells[3].outputs]
    assert texts == ["new frame\n", "'100%'"]  # cleared on the next output; display updated in place
    (error,) = cells[4].outputs
    assert error["ename"] == "ZeroDivisionError" and error["traceback"]
    counts = [c.execution_count for c in cells]
    assert counts == sorted(counts) and len(set(counts)) == 5
    assert answer["hash"] and answer["kernel_id"]
    assert "[1/5] cell 0 (id c0)" in answer["output"] and "ZeroDivisionError" in answer["output"]
    assert "Cell 4 (id c4) failed (exit code 1)" in answer["output"], answer["output"]


async def test_state_is_shared_with_the_session_jupyterlab_opened(api, jp_fetch, jp_root_dir):
    make(jp_root_dir, "shared.ipynb", "x = 41", "print(x + 1)")
    response = await jp_fetch(
        "api",
        "sessions",
        method="POST",
        body=json.dumps(
            {"path": "shared.ipynb", "type": "notebook", "name": "s", "kernel": {"name": "python3"}}
        ),
    )
    lab_kernel = json.loads(response.body)["kernel"]["id"]
    first = await run(api, "shared.ipynb", cell_ids=["c0"])
    assert first["kernel_id"] == lab_kernel
    second = await run(api, "shared.ipynb", cell_indices=[1])
    assert second["cells"][0]["output"] == "42\n"


async def test_without_a_session_one_is_created_as_jupyterlab_would(api, jp_fetch, jp_root_dir):
    make(jp_root_dir, "fresh.ipynb", "y = 7")
    answer = await run(api, "fresh.ipynb")
    sessions = json.loads((await jp_fetch("api", "sessions")).body)
    (model,) = [s for s in sessions if s["path"] == "fresh.ipynb"]
    assert model["kernel"]["id"] == answer["kernel_id"] and model["type"] == "notebook"


async def test_stop_on_error_and_skipped_markdown(api, jp_root_dir):
    make(jp_root_dir, "err.ipynb", "a = 1", "raise ValueError('no')", "b = 2", markdown_at=1)
    answer = await run(api, "err.ipynb", all=True)
    assert [(c["cell_id"], c["status"]) for c in answer["cells"]] == [
        ("c0", "complete"),
        ("c1", "skipped"),
        ("c2", "error"),
        ("c3", "not_run"),
    ]
    answer = await run(api, "err.ipynb", all=True, stop_on_error=False)
    assert answer["cells"][3]["status"] == "complete"


async def test_cells_run_in_notebook_order(api, jp_root_dir):
    make(jp_root_dir, "order.ipynb", "seq = ['first']", "seq.append('second')", "print(seq)")
    answer = await run(api, "order.ipynb", cell_ids=["c2", "c0", "c1"])
    assert [c["cell_id"] for c in answer["cells"]] == ["c0", "c1", "c2"]
    assert answer["cells"][2]["output"] == "['first', 'second']\n"


async def test_bad_requests_run_nothing(api, jp_root_dir):
    path = make(jp_root_dir, "bad.ipynb", "print('ran')")
    before = path.read_bytes()
    for body, fragment in [
        ({"cell_ids": ["nope"]}, "No cell with id 'nope'"),
        ({"cell_indices": [5]}, "No cell at index 5"),
        ({"all": True, "cell_ids": ["c0"]}, "exactly one of"),
        ({"all": True, "expected_hash": "0" * 64}, "changed since it was read"),
        ({"all": True, "timeout": "soon"}, "'timeout' must be a number"),
    ]:
        status, answer = await api("POST", "notebooks", "bad.ipynb", "run", body=body)
        assert status in (400, 409) and fragment in answer["message"], (body, answer)
    assert path.read_bytes() == before


async def test_unknown_kernelspec_answers_400_and_creates_nothing(api, jp_fetch, jp_root_dir):
    spec = {"name": "nope", "display_name": "x"}
    nb = new_notebook(cells=[new_code_cell("1")], metadata={"kernelspec": spec})
    nbformat.write(nb, str(jp_root_dir / "nokernel.ipynb"))
    status, answer = await api("POST", "notebooks", "nokernel.ipynb", "run", body={"all": True})
    assert status == 400 and "No such kernel: 'nope'" in answer["message"] and "python3" in answer["message"]
    assert json.loads((await jp_fetch("api", "sessions")).body) == []


async def test_timeout_interrupts_and_the_kernel_stays_usable(api, jp_root_dir):
    make(jp_root_dir, "slow.ipynb", "import time\ntime.sleep(30)", "print('never')")
    answer = await run(api, "slow.ipynb", all=True, timeout=1)
    assert answer["timed_out"] is True
    assert [c["status"] for c in answer["cells"]] == ["cancelled", "not_run"]
    again = await run(api, "slow.ipynb", cell_ids=["c1"])
    assert again["cells"][0]["output"] == "never\n"


async def test_a_huge_print_is_bounded_in_the_file(api, jp_fetch, jp_root_dir):
    path = make(jp_root_dir, "huge.ipynb", "for i in range(200_000):\n    print(f'line {i}')")
    answer = await run(api, "huge.ipynb", timeout=120)
    assert path.stat().st_size < 64 * 1024  # NotebookRunner.max_output_bytes_stored=4096 in this server
    text = "".join(stored(path).cells[0].outputs[0]["text"])
    assert "[Output truncated: showing" in text and text.startswith("line 0\n")
    artifact = text.rsplit("artifact ", 1)[1].split(".]")[0].strip()
    full = (await jp_fetch("api", "agent", "artifacts", artifact)).body.decode()
    assert full.count("\n") == 200_000 and full.endswith("line 199999\n")
    assert answer["cells"][0]["truncated"] is True


async def test_a_kernel_killed_mid_run_is_reported_not_rerun(api, jp_root_dir):
    marker = jp_root_dir / "runs.txt"
    make(
        jp_root_dir,
        "killed.ipynb",
        f"open({str(marker)!r}, 'a').write('x')\nimport os, time\ntime.sleep(0.5)\nos.kill(os.getpid(), 9)",
        "print('after')",
    )
    answer = await run(api, "killed.ipynb", all=True, timeout=60)
    assert answer["restarted"] is True
    assert [c["status"] for c in answer["cells"]] == ["error", "not_run"]
    assert "nothing was run again" in answer["output"]
    assert marker.read_text() == "x"  # ran once
    await asyncio.sleep(1)
    again = await run(api, "killed.ipynb", cell_ids=["c1"], timeout=60)  # the server restarted it
    assert again["cells"][0]["output"] == "after\n"


async def test_a_cell_deleted_during_the_run_gets_no_outputs(api, jp_root_dir):
    path = make(jp_root_dir, "deleted.ipynb", "import time\ntime.sleep(2)\nprint('late')", "print('kept')")
    call = asyncio.ensure_future(run(api, "deleted.ipynb", all=True))
    await asyncio.sleep(1)
    status, _ = await api("POST", "notebooks", "deleted.ipynb", body={"action": "delete", "cell_id": "c0"})
    assert status == 200
    answer = await call
    assert [c["outputs_written"] for c in answer["cells"]] == [False, True]
    cells = stored(path).cells
    assert [c.id for c in cells] == ["c1"] and cells[0].outputs[0]["text"] == "kept\n"


async def test_closing_the_stream_interrupts(jp_http_port, jp_base_url, jp_auth_header, jp_root_dir, api):
    code = "import time\nfor i in range(600):\n    print(i, flush=True)\n    time.sleep(0.05)"
    make(jp_root_dir, "stream.ipynb", code)
    reader, writer = await asyncio.open_connection("127.0.0.1", jp_http_port)
    body = json.dumps({"all": True, "timeout": 120}).encode()
    headers = "".join(f"{k}: {v}\r\n" for k, v in jp_auth_header.items())
    writer.write(
        f"POST {jp_base_url}api/agent/notebooks/stream.ipynb/run HTTP/1.1\r\n"
        f"Host: 127.0.0.1:{jp_http_port}\r\n{headers}"
        f"Accept: application/x-ndjson\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    await writer.drain()
    seen = b""
    while b'"chunk"' not in seen:
        seen += await asyncio.wait_for(reader.read(4096), 30)
    writer.close()
    for _ in range(100):  # the cell would print for 30 s: the run must end long before
        await asyncio.sleep(0.1)
        _, listing = await api("GET", "sessions")
        if not any(s["busy"] for s in listing["sessions"]):
            break
    else:
        raise AssertionError("closing the stream did not end the run")
    status, answer = await api("POST", "notebooks", "stream.ipynb", "run", body={"all": True, "timeout": 1})
    assert status == 200 and answer["cells"][0]["output"].startswith("0\n")


def with_kernelspec(path: Path, name: str) -> None:
    nb = nbformat.read(str(path), as_version=4)
    nb.metadata["kernelspec"] = {"name": name, "display_name": name, "language": "python"}
    nbformat.write(nb, str(path))


def create_retries(events: Any) -> list[str]:
    return [e["outcome"] for e in events("recovery") if e["kind"] == "create_retries"]


async def test_a_notebook_kernel_that_dies_before_answering_is_replaced_once(
    api, jp_root_dir, dies_once_kernelspec, agent_audit_events
):
    """The kernel a run started exits before its first answer, as one that lost a TCP port to another
    process does: the run starts another (new ports) once, as eval does, and says so in the totals and
    the audit events."""
    path = make(jp_root_dir, "ports.ipynb", "print('up')")
    with_kernelspec(path, dies_once_kernelspec)
    answer = await run(api, "ports.ipynb")
    assert answer["cells"][0]["output"] == "up\n", answer
    _, listing = await api("GET", "sessions")
    assert listing["totals"]["create_retries"] == 1
    assert create_retries(agent_audit_events) == ["retrying", "recovered"]


async def test_a_notebook_kernel_that_never_answers_is_a_503_that_says_it_exited(
    api, jp_fetch, jp_root_dir, jp_kernel_dir, jp_serverapp, agent_audit_events
):
    script_kernelspec(jp_kernel_dir, "exits", "import sys; sys.exit(3)", "Exits")
    path = make(jp_root_dir, "exits.ipynb", "print('never')")
    with_kernelspec(path, "exits")
    before = path.read_bytes()
    kernels = jp_serverapp.web_app.settings["jupyter_agent_tools"].eval_service.kernels
    kernels.ready_timeout = 600.0  # the wait a kernel that never answers would cost
    began = time.monotonic()
    answer = await run(api, "exits.ipynb", expect=503)
    assert "exited before it answered" in answer["message"] and "nothing was run" in answer["message"]
    assert time.monotonic() - began < kernels.ready_timeout / 2  # told it exited, not sat out the wait
    assert path.read_bytes() == before
    assert json.loads((await jp_fetch("api", "sessions")).body) == []  # the kernels it started are gone
    assert create_retries(agent_audit_events) == ["retrying", "failed"]
    await run(api, "exits.ipynb", expect=503)  # and again, the same way: nothing was left behind

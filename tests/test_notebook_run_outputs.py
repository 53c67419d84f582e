"""What a notebook run stores and answers: outputs bounded per cell, images as placeholders in the answer,
notebooks that go away or lie outside the root (real server, real kernels)."""

from __future__ import annotations

import asyncio
import base64
import json
import sys
import threading
from pathlib import Path
from typing import Any

import nbformat
import pytest
from contract import NDJSON, Contract
from nbformat.v4 import new_code_cell, new_notebook
from samples import KERNELSPEC, PNG
from test_notebook_run import make, run, stored

from jupyter_agent_tools.api_document import openapi_document

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from jupyter_agent_tools.testing.server import jupyter_server

CELL_BYTES = 64 * 1024
MB = 1024 * 1024
CONTRACT = Contract(openapi_document())
RUN = "/api/agent/notebooks/{path}/run"


@pytest.fixture
def jp_server_config() -> dict[str, Any]:
    return {
        "ServerApp": {"jpserver_extensions": {"jupyter_agent_tools": True}},
        "NotebookRunner": {"max_output_bytes_stored": 4096, "max_cell_bytes_stored": CELL_BYTES},
        "CellExecutor": {"interrupt_grace": 2.0},
    }


async def artifact_lines(jp_fetch: Any, artifact_id: str) -> list[dict[str, Any]]:
    body = (await jp_fetch("api", "agent", "artifacts", artifact_id)).body.decode()
    return [json.loads(line) for line in body.splitlines()]


def placeholder_text(output: dict[str, Any]) -> str:
    return "".join(output["data"]["text/plain"])


# ------------------------------------------------------------------------------ outputs per cell


async def test_a_display_flood_stores_one_placeholder_past_max_run_cell_bytes_and_the_rest_in_an_artifact(
    api, jp_fetch, jp_root_dir
):
    code = (
        "from IPython.display import display\n"
        "for i in range(300):\n"
        "    display({'text/plain': f'{i:04d}' + 'z' * 2000}, raw=True)\n"
        "print('done')"
    )
    path = make(jp_root_dir, "flood.ipynb", code)
    answer = await run(api, "flood.ipynb", timeout=120)
    assert path.stat().st_size < CELL_BYTES + 16 * 1024  # 600 KB were displayed
    outputs = stored(path).cells[0].outputs
    kept, placeholder = outputs[:-1], outputs[-1]
    assert [o["data"]["text/plain"][:4] for o in kept] == [f"{i:04d}" for i in range(len(kept))]
    left_out = 300 - len(kept) + 1  # and the print
    omitted = answer["cells"][0]["outputs_omitted"]
    assert omitted["outputs"] == left_out and omitted["updates"] == 0
    assert omitted["bytes"] == (300 - len(kept)) * 2004 + len("done\n")
    text = placeholder_text(placeholder)
    assert f"{left_out} outputs" in text and "NotebookRunner.max_cell_bytes_stored" in text
    assert f"artifact {omitted['artifact_id']}" in text
    assert placeholder["metadata"]["jupyter_agent_tools"]["omitted"] == omitted
    lines = await artifact_lines(jp_fetch, omitted["artifact_id"])
    assert [line["data"]["text/plain"][:4] for line in lines[:-1]] == [
        f"{i:04d}" for i in range(len(kept), 300)
    ]
    assert lines[-1] == {"output_type": "stream", "name": "stdout", "text": "done\n"}
    assert answer["cells"][0]["output"].endswith("done\n")  # the answer's text still has everything's tail


async def test_an_image_larger_than_the_cell_budget_is_left_out_whole(api, jp_fetch, jp_root_dir):
    code = (
        "from IPython.display import display\nimport base64\n"
        "image = base64.b64encode(bytes(range(256)) * 400).decode()\n"
        "display({'image/png': image}, raw=True)\n"
        "print('after')"
    )
    path = make(jp_root_dir, "image.ipynb", code)
    answer = await run(api, "image.ipynb", timeout=60)
    (placeholder,) = stored(path).cells[0].outputs
    assert "2 outputs" in placeholder_text(placeholder)
    assert path.stat().st_size < 8 * 1024
    cell = answer["cells"][0]
    assert cell["displays"] == []  # the answer gives the images the notebook stores
    image, after = await artifact_lines(jp_fetch, cell["outputs_omitted"]["artifact_id"])
    assert image["data"]["image/png"] == base64.b64encode(bytes(range(256)) * 400).decode()
    assert after["text"] == "after\n"


async def test_cleared_frames_do_not_count_and_a_left_out_frame_is_replaced_in_the_artifact(
    api, jp_fetch, jp_root_dir
):
    small = (
        "from IPython.display import display, clear_output\n"
        "for i in range(300):\n"  # 300 KB in all, one frame at a time
        "    clear_output(wait=True)\n"
        "    display({'text/plain': f'frame {i} ' + 'f' * 1000}, raw=True)"
    )
    big = (
        "from IPython.display import display, clear_output\nimport base64\n"
        "for i in range(50):\n"  # each frame is larger than the cell's budget
        "    clear_output(wait=True)\n"
        "    display({'image/png': base64.b64encode(bytes([i]) * 100_000).decode()}, raw=True)"
    )
    path = make(jp_root_dir, "frames.ipynb", small, big)
    answer = await run(api, "frames.ipynb", timeout=120)
    first, second = stored(path).cells
    assert [o["data"]["text/plain"][:10] for o in first.outputs] == ["frame 299 "]
    assert answer["cells"][0]["outputs_omitted"] is None
    (placeholder,) = second.outputs
    assert "1 output " in placeholder_text(placeholder)
    (frame,) = await artifact_lines(jp_fetch, answer["cells"][1]["outputs_omitted"]["artifact_id"])
    assert frame["data"]["image/png"] == base64.b64encode(bytes([49]) * 100_000).decode()


FLOOD = (
    "from IPython.display import display\n"
    "for i in range(600):\n"
    "    display({'text/plain': str(i) + 'z' * 250_000}, raw=True)"
)


def test_server_memory_stays_bounded_during_a_display_flood(tmp_path):
    """600 displays of 250 KB (150 MB): the server holds what one cell stores (4 MiB by default) and one
    message at a time, not what the kernel displayed."""
    flood = 600 * 250_000
    with jupyter_server(root_dir=tmp_path / "root") as server, server.client() as client:
        for name, code in (("warm.ipynb", "1"), ("flood.ipynb", FLOOD)):
            nb = new_notebook(cells=[new_code_cell(code, id="c0")], metadata={"kernelspec": KERNELSPEC})
            nbformat.write(nb, str(server.root_dir / name))
        client.json("POST", "api/agent/notebooks/warm.ipynb/run", {"all": True})
        baseline = server.rss_bytes()
        assert baseline and server.reset_peak_memory()
        peak, stop = [0], threading.Event()

        def sample() -> None:
            while not stop.is_set():
                peak[0] = max(peak[0], server.rss_bytes() or 0)
                stop.wait(0.05)

        sampler = threading.Thread(target=sample)
        sampler.start()
        try:
            answer = client.json("POST", "api/agent/notebooks/flood.ipynb/run", {"all": True, "timeout": 600})
        finally:
            stop.set()
            sampler.join()
        grown = max(peak[0], server.memory()["VmHWM"]) - baseline
        size = (server.root_dir / "flood.ipynb").stat().st_size
    print(f"\nflood of {flood / MB:.0f} MB: peak RSS growth {grown / MB:.0f} MB, file {size / MB:.1f} MB")
    assert answer["cells"][0]["status"] == "complete" and answer["cells"][0]["outputs_omitted"]["outputs"]
    assert size < 5 * MB
    assert grown < flood / 2, f"server peak RSS grew by {grown / MB:.0f} MB for {flood / MB:.0f} MB displayed"


# ---------------------------------------------------------------------------------- images


IMAGE_CELL = (
    "from IPython.display import display, Image\nimport base64\n"
    f"display(Image(data=base64.b64decode('{PNG}')))"
)


async def test_the_run_answer_gives_images_as_placeholders_with_their_output_url(api, jp_fetch, jp_root_dir):
    make(jp_root_dir, "plot.ipynb", "print('before')", IMAGE_CELL)
    answer = await run(api, "plot.ipynb", timeout=60)
    (image,) = answer["cells"][1]["displays"]
    url = "/api/agent/notebooks/plot.ipynb/cells/c1/outputs/0?mime=image/png"
    assert image == {"type": "image", "mime": "image/png", "bytes": len(base64.b64decode(PNG)), "url": url}
    assert PNG not in json.dumps(answer)
    # not "(no output)": it shows an image
    assert answer["output"].endswith("[2/2] cell 1 (id c1)\n(no text output)")
    path, _, query = url.partition("?")
    response = await jp_fetch(*path.strip("/").split("/"), params={"mime": query.split("=", 1)[1]})
    assert response.body == base64.b64decode(PNG)

    CONTRACT.assert_response("POST", RUN, 200, answer)

    asked = await run(api, "plot.ipynb", cell_ids=["c1"], include_images=True, timeout=60)
    assert asked["cells"][0]["displays"] == [{**image, "data": PNG}]
    CONTRACT.assert_response("POST", RUN, 200, asked)

    lines: list[bytes] = []  # the stream sends the image too, when the cell ends
    await jp_fetch(
        *["api", "agent", "notebooks", "plot.ipynb", "run"],
        method="POST",
        body=json.dumps({"cell_ids": ["c1"], "timeout": 60}),
        headers={"Accept": NDJSON},
        streaming_callback=lines.append,
        request_timeout=120,
    )
    events = [json.loads(line) for line in b"".join(lines).splitlines()]
    for event in events:
        CONTRACT.assert_response("POST", RUN, 200, event, NDJSON)
    kinds = [e["type"] for e in events if e["type"] != "heartbeat"]
    assert kinds == ["cell_start", "display", "cell_end", "result"]
    assert events[1]["display"] == image and events[-1]["result"]["cells"][0]["displays"] == [image]

    body = {"all": True, "include_images": 1}
    status, refused = await api("POST", "notebooks", "plot.ipynb", "run", body=body)
    assert status == 400 and "'include_images' must be" in refused["message"]


# ----------------------------------------------------------------------------------- paths


async def test_a_notebook_deleted_mid_run_answers_what_ran_and_that_its_outputs_were_not_written(
    api, jp_root_dir
):
    started, flag = jp_root_dir.parent / "started.flag", jp_root_dir.parent / "go.flag"
    first = (
        "import os, time\n"
        f"open({str(started)!r}, 'w').close()\n"
        "print('before')\n"
        f"while not os.path.exists({str(flag)!r}):\n"
        "    time.sleep(0.02)\n"
        "print('after')"
    )
    path = make(jp_root_dir, "gone.ipynb", first, "print('second cell')")
    call = asyncio.ensure_future(run(api, "gone.ipynb", timeout=60))
    try:
        for _ in range(1500):
            if started.exists() or call.done():
                break
            await asyncio.sleep(0.02)
        assert started.exists(), "the first cell did not start"
        path.unlink()
    finally:
        flag.touch()
    answer = await call
    assert [c["status"] for c in answer["cells"]] == ["complete", "complete"]
    assert [c["outputs_written"] for c in answer["cells"]] == [False, False]
    assert "Notebook not found: gone.ipynb" in answer["outputs_error"]
    notice = "[The outputs could not be written into the notebook: Notebook not found: gone.ipynb"
    assert answer["output"].startswith(notice)
    assert "before\nafter" in answer["output"] and "second cell" in answer["output"]
    assert answer["hash"] is None and not path.exists()


async def test_a_link_to_a_notebook_outside_the_root_is_refused_before_anything_runs(
    api, jp_fetch, jp_root_dir
):
    outside = jp_root_dir.parent / "outside"
    outside.mkdir()
    marker = outside / "ran.txt"
    target = make(outside, "secret.ipynb", f"open({str(marker)!r}, 'w').write('ran')")
    before = target.read_bytes()
    (jp_root_dir / "link.ipynb").symlink_to(target)
    status, answer = await api("POST", "notebooks", "link.ipynb", "run", body={"all": True})
    assert status == 403, answer
    assert "resolves outside the server's root" in answer["message"]
    assert "nothing was run" in answer["message"]
    await asyncio.sleep(0.5)  # nothing was started that could still write the marker
    assert not marker.exists() and target.read_bytes() == before
    assert json.loads((await jp_fetch("api", "sessions")).body) == []
    # a link that stays inside the root runs as before
    inside = make(jp_root_dir, "real.ipynb", "print('ok')")
    (jp_root_dir / "alias.ipynb").symlink_to(inside)
    assert (await run(api, "alias.ipynb"))["cells"][0]["output"] == "ok\n"

"""Issue 29 items 3-6 over HTTP: insert-and-run in one call, images from runs, eval in a notebook's own
kernel, and the notebook's kernel (describe, interrupt, restart, shutdown)."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import pytest
from samples import PNG_1PX
from test_notebook_run import make, stored


@pytest.fixture
def jp_server_config() -> dict[str, Any]:
    return {"ServerApp": {"jpserver_extensions": {"jupyter_agent_tools": True}}}


async def post(api: Any, *parts: str, expect: int = 200, **body: Any) -> dict[str, Any]:
    status, answer = await api("POST", *parts, body=body)
    assert status == expect, answer
    return dict(answer)


async def test_insert_and_run_is_one_call_one_edit_and_one_ledger_entry(api, jp_root_dir):
    path = make(jp_root_dir, "ins.ipynb", "x = 20")
    _, read = await api("GET", "notebooks", "ins.ipynb")
    ops = [
        {"action": "insert", "cell_id": "new", "content": "print(x + 22)"},
        {"action": "insert", "cell_type": "markdown", "content": "# note"},
    ]
    answer = await post(api, "notebooks", "ins.ipynb", "run", ops=ops, expected_hash=read["hash"])
    # only the inserted code cell ran (x was never set in this kernel: it fails, and says so)
    assert [c["cell_id"] for c in answer["cells"]] == ["new"]
    assert answer["cells"][0]["status"] == "error" and "NameError" in answer["output"]
    assert answer["edit"]["results"][0]["details"]["cellId"] == "new"
    cells = stored(path).cells
    assert [c.get("id") for c in cells][:2] == ["c0", "new"] and len(cells) == 3
    assert cells[1].outputs[0]["ename"] == "NameError"
    # naming cells runs those, in the edited notebook (an id the ops gave included)
    answer = await post(
        api,
        "notebooks",
        "ins.ipynb",
        "run",
        ops=[{"action": "edit", "cell_id": "new", "content": "print(x * 2)"}],
        cell_ids=["c0", "new"],
    )
    assert answer["cells"][1]["output"] == "40\n"
    assert stored(path).cells[1].outputs[0]["text"] == "40\n"
    _, changes = await api("GET", "notebooks", "ins.ipynb", "changes")
    newest = changes["changes"][0]
    assert newest["kind"] == "run" and answer["change_id"] == newest["id"], newest


async def test_run_with_ops_checks_expected_hash_and_the_ops_before_anything(api, jp_root_dir):
    path = make(jp_root_dir, "guard.ipynb", "print('ran')")
    before = path.read_bytes()
    ops = [{"action": "insert", "content": "print(1)"}]
    for body, status, fragment in [
        ({"ops": ops, "expected_hash": "0" * 64}, 409, "changed since"),
        ({"ops": [{"action": "delete", "cell_id": "zz"}]}, 400, "zz"),
        ({"ops": []}, 400, "non-empty array"),
        ({"ops": ops, "cell_ids": ["nope"]}, 400, "No cell with id 'nope'"),
    ]:
        answer = await post(api, "notebooks", "guard.ipynb", "run", expect=status, **body)
        assert fragment in answer["message"], answer
    assert path.read_bytes() == before


async def test_images_from_runs_as_placeholders_or_base64(api, jp_root_dir, jp_fetch):
    code = (
        "from IPython.display import Image, display\nimport base64\n"
        f"display(Image(data=base64.b64decode('{PNG_1PX}')))"
    )
    make(jp_root_dir, "img.ipynb", code)
    plain = await post(api, "notebooks", "img.ipynb", "run", all=True)
    (image,) = plain["cells"][0]["displays"]
    assert "data" not in image and image["url"].endswith("mime=image/png")
    raw = await jp_fetch(*image["url"].lstrip("/").split("?")[0].split("/"), params={"mime": "image/png"})
    assert raw.body == base64.b64decode(PNG_1PX)
    rich = await post(api, "notebooks", "img.ipynb", "run", all=True, include_images=True)
    assert rich["cells"][0]["displays"][0]["data"].strip() == PNG_1PX


async def test_eval_in_a_notebooks_kernel_shares_its_variables_and_writes_nothing(api, jp_root_dir):
    path = make(jp_root_dir, "df.ipynb", "frame = {'rows': 3}")
    await post(api, "notebooks", "df.ipynb", "run", all=True)
    before = path.read_bytes()
    answer = await post(api, "eval", cells=[{"code": "frame['rows'] * 14"}], notebook="df.ipynb")
    assert answer["output"] == "42\n" and answer["mode"] == "notebook" and answer["notebook"] == "df.ipynb"
    assert answer["session"] is None
    _, kernel = await api("GET", "notebooks", "df.ipynb", "kernel")
    assert answer["kernel_id"] == kernel["kernel_id"]
    assert path.read_bytes() == before
    # a variable set by eval is seen by the notebook's next run
    await post(api, "eval", cells=[{"code": "bonus = 1"}], notebook="df.ipynb")
    path2 = make(jp_root_dir, "df2.ipynb", "x")  # another notebook: its own kernel, no 'bonus'
    other = await post(api, "eval", cells=[{"code": "'bonus' in dir()"}], notebook="df2.ipynb")
    assert other["output"] == "False\n"
    assert path2.exists()


async def test_eval_in_a_notebook_starts_its_kernel_as_a_run_would(api, jp_fetch, jp_root_dir):
    make(jp_root_dir, "cold.ipynb", "pass")
    answer = await post(
        api, "eval", cells=[{"code": "import os; print(os.getcwd() != '')"}], notebook="cold.ipynb"
    )
    assert answer["output"] == "True\n"
    sessions = json.loads((await jp_fetch("api", "sessions")).body)
    (model,) = [s for s in sessions if s["path"] == "cold.ipynb"]
    assert model["kernel"]["id"] == answer["kernel_id"]


async def test_eval_in_a_notebook_bad_requests(api, jp_root_dir):
    make(jp_root_dir, "bad.ipynb", "pass")
    for body, status, fragment in [
        ({"notebook": "bad.ipynb", "session": "s"}, 400, "'session' does not apply with 'notebook'"),
        ({"notebook": "bad.ipynb", "mode": "per-call"}, 400, "'mode' does not apply"),
        ({"notebook": "missing.ipynb"}, 404, "missing.ipynb"),
        ({"notebook": ""}, 400, "notebook"),
    ]:
        answer = await post(api, "eval", expect=status, cells=[{"code": "1"}], **body)
        assert fragment in answer["message"], answer


async def test_notebook_kernel_describe_interrupt_restart_shutdown(api, jp_root_dir, jp_fetch):
    make(jp_root_dir, "k.ipynb", "v = 5")
    _, none = await api("GET", "notebooks", "k.ipynb", "kernel")
    assert none["state"] == "not_running" and none["kernel_id"] is None
    answer = await post(api, "notebooks", "k.ipynb", "kernel", expect=409, action="restart")
    assert "no running kernel to restart" in answer["message"]
    nothing = await post(api, "notebooks", "k.ipynb", "kernel", action="shutdown")
    assert nothing["state"] == "not_running" and "nothing to shutdown" in nothing["message"]
    await post(api, "notebooks", "k.ipynb", "run", all=True)
    _, kernel = await api("GET", "notebooks", "k.ipynb", "kernel")
    assert kernel["state"] in ("idle", "busy") and kernel["kernel_name"] == "python3"
    assert kernel["execution_count"] == 1 and kernel["person_connected"] is False
    assert kernel["started_by_run"] is True
    # the sessions listing shows the notebook's kernel with its path
    _, listing = await api("GET", "sessions")
    (mine,) = [s for s in listing["sessions"] if s["notebook"] == "k.ipynb"]
    assert mine["kernel_id"] == kernel["kernel_id"] and mine["mode"] == "notebook"
    (entry,) = [k for k in listing["notebook_kernels"] if k["path"] == "k.ipynb"]
    assert entry["kernel_id"] == kernel["kernel_id"] and entry["attached"] and entry["started_by_run"]

    # interrupt stops a running eval in the notebook's kernel: it answers cancelled
    slow = asyncio.ensure_future(
        api("POST", "eval", body={"cells": [{"code": "import time; time.sleep(30)"}], "notebook": "k.ipynb"})
    )
    for _ in range(100):
        _, state = await api("GET", "notebooks", "k.ipynb", "kernel")
        if state["busy"]:
            break
        await asyncio.sleep(0.05)
    done = await post(api, "notebooks", "k.ipynb", "kernel", action="interrupt")
    assert done["interrupted_call"] is True and done["state_lost"] is False
    status, cancelled = await slow
    assert status == 200 and cancelled["cancelled"] is True

    restarted = await post(api, "notebooks", "k.ipynb", "kernel", action="restart")
    assert restarted["state_lost"] is True and "state was lost" in restarted["message"]
    assert restarted["kernel_id"] == kernel["kernel_id"]
    gone = await post(api, "eval", cells=[{"code": "v"}], notebook="k.ipynb")
    assert "NameError" in gone["output"]

    shut = await post(api, "notebooks", "k.ipynb", "kernel", action="shutdown")
    assert shut["state"] == "not_running" and shut["state_lost"] is True
    sessions = json.loads((await jp_fetch("api", "sessions")).body)
    assert not [s for s in sessions if s["path"] == "k.ipynb"]
    for body, fragment in [({"action": "explode"}, "'action' must be one of"), ({}, "'action' is required")]:
        answer = await post(api, "notebooks", "k.ipynb", "kernel", expect=400, **body)
        assert fragment in answer["message"], answer
    status, answer = await api("GET", "notebooks", "nope.ipynb", "kernel")
    assert status == 404


async def test_a_notebook_without_a_kernel_starts_from_the_warm_pool(api, jp_root_dir, jp_serverapp):
    """The first eval fills the pool; a notebook of the pool's kernelspec then takes its warm kernel,
    which jupyter_server adopts as the notebook's session kernel, in the notebook's own directory."""
    service = jp_serverapp.web_app.settings["jupyter_agent_tools"].eval_service
    pool = service.pool
    pool.size = 1
    await post(api, "eval", cells=[{"code": "1"}], mode="per-call")  # starts filling
    for _ in range(300):
        if pool.ready_count:
            break
        await asyncio.sleep(0.05)
    (warm,) = pool.kernel_ids
    (jp_root_dir / "sub").mkdir()
    make(jp_root_dir / "sub", "w.ipynb", "import os\nprint(os.getcwd())\nprint(__session__)")
    answer = await post(api, "notebooks", "sub/w.ipynb", "run", all=True)
    assert answer["kernel_id"] == warm and pool.taken == 1
    cwd, session_name = answer["cells"][0]["output"].splitlines()
    assert cwd == str(jp_root_dir / "sub") and session_name == str(jp_root_dir / "sub" / "w.ipynb")
    km = jp_serverapp.kernel_manager
    # the server's kernel now: auto-restarted on death, as one jupyter_server started
    assert km.get_kernel(warm)._restarter._pcallback is not None
    _, kernel = await api("GET", "notebooks", "sub/w.ipynb", "kernel")
    assert kernel["kernel_id"] == warm and kernel["started_by_run"] is True


async def test_the_listing_shows_notebook_kernels_a_person_opened(api, jp_fetch, jp_root_dir):
    make(jp_root_dir, "lab.ipynb", "pass")
    body = json.dumps({"path": "lab.ipynb", "type": "notebook", "name": "l", "kernel": {"name": "python3"}})
    lab = json.loads((await jp_fetch("api", "sessions", method="POST", body=body)).body)
    _, listing = await api("GET", "sessions")
    (entry,) = listing["notebook_kernels"]
    assert entry["path"] == "lab.ipynb" and entry["kernel_id"] == lab["kernel"]["id"]
    assert (
        entry["attached"] is False and entry["started_by_run"] is False and entry["person_connected"] is False
    )
    assert listing["sessions"] == []  # no run attached to it yet


async def test_a_kernel_lost_in_eval_in_a_notebook_is_told_as_in_a_run(api, jp_root_dir):
    """Issue 36.1: eval with ``notebook`` and a notebook run follow one policy after a cell (nothing runs
    again, later cells do not run) and tell it in one text (they had two)."""
    kill = "import os, time\ntime.sleep(0.3)\nos.kill(os.getpid(), 9)"
    make(jp_root_dir, "lost.ipynb", kill, "print('after')")
    ran = await post(api, "notebooks", "lost.ipynb", "run", all=True, timeout=60)
    await asyncio.sleep(1)  # the server restarts the notebook's kernel
    evaluated = await post(
        api, "eval", cells=[{"code": kill}, {"code": "print('after')"}], notebook="lost.ipynb", timeout=60
    )
    assert ran["restarted"] is True and evaluated["restarted"] is True
    assert [c["status"] for c in evaluated["cells"]] == ["error"]
    notice = ran["output"].split("\n", 1)[0]
    assert notice.startswith("[The notebook's kernel died") and "Cells after it were not run" in notice
    assert evaluated["output"].split("\n", 1)[0] == notice

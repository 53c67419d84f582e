"""The focus store without a server: bounds, the heartbeat's lapse, the tab cap, who sees what, listeners."""

from __future__ import annotations

from typing import Any

import pytest
from traitlets import TraitError

from jupyter_agent_tools import focus as focus_module
from jupyter_agent_tools.auth.context import set_paths
from jupyter_agent_tools.auth.paths import PathScope
from jupyter_agent_tools.errors import AgentToolsError
from jupyter_agent_tools.focus import FocusStore

pytestmark = pytest.mark.quick


def body(path: str = "a.ipynb", agents: Any = "all", **extra: Any) -> dict[str, Any]:
    return {"agents": agents, "path": path, **extra}


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [1000.0]
    monkeypatch.setattr(focus_module.time, "monotonic", lambda: now[0])
    return now


def test_a_tab_lapses_after_the_ttl_unless_it_heartbeats(clock: list[float]) -> None:
    store = FocusStore(ttl=30)
    told: list[int] = []
    store.on_change(lambda: told.append(1))
    store.publish("me", "tab-00000001", body())
    assert store.read("helper")["path"] == "a.ipynb" and len(told) == 1
    clock[0] += 20
    store.publish("me", "tab-00000001", body())  # a heartbeat: kept, not a change
    assert len(told) == 1
    clock[0] += 20
    assert store.visible("helper") is not None
    clock[0] += 31
    assert store.visible("helper") is None and len(told) == 2  # lapsed, and its listeners told
    with pytest.raises(AgentToolsError) as refused:
        store.read("helper")
    assert refused.value.status == 403 and "Share my focus" in refused.value.message


def test_bounds_cut_texts_summarize_outputs_and_cap_tabs(clock: list[float]) -> None:
    store = FocusStore(max_tabs=2, max_source_chars=100, max_selection_chars=100, max_outputs=1)
    cell = {
        "index": 2,
        "source": "s" * 1000,
        "outputs": [{"output_type": "stream", "name": "stdout", "text": "x"}] * 5,
    }
    store.publish("me", "tab-00000001", body(cell=cell, selection={"text": "t" * 1000}))
    read = store.read(None)
    assert len(read["cell"]["source"]) < 200 and "truncated 900 more characters" in read["cell"]["source"]
    assert read["cell"]["outputs"] == [{"output_type": "stream", "name": "stdout", "text": "x"}]
    assert read["cell"]["outputs_omitted"] == 4 and "truncated 900" in read["selection"]["text"]
    for n in (2, 3):
        clock[0] += 1
        store.publish("me", f"tab-0000000{n}", body())
    assert [s.tab for s in store._tabs.values()] == ["tab-00000002", "tab-00000003"]  # the oldest went
    with pytest.raises(AgentToolsError):
        store.publish("me", "x", body())  # not a tab id
    with pytest.raises(AgentToolsError):
        store.publish("me", "tab-00000001", body(path="../up.ipynb"))
    with pytest.raises(TraitError):
        FocusStore(ttl=1)


def test_who_sees_what_named_agents_paths_and_the_hub_owner(clock: list[float]) -> None:
    store = FocusStore(owner="alice")
    with pytest.raises(AgentToolsError) as refused:
        store.publish("bob", "tab-00000001", body())  # a visitor of alice's server
    assert refused.value.status == 403
    store.publish("alice", "tab-00000001", body("reports/a.ipynb", agents=["named"]))
    assert store.visible("helper") is None and store.visible("named") is not None
    token = set_paths(PathScope(["other/**"]))
    try:
        assert store.visible("named") is None  # outside its paths: nothing
    finally:
        set_paths(None)
        del token
    assert store.stop("alice", "tab-00000001") and store.visible("named") is None


def test_this_cell_is_the_focused_notebook_and_cell_or_a_clear_refusal(clock: list[float]) -> None:
    store = FocusStore()
    with pytest.raises(AgentToolsError) as refused:
        store.focused_cell("helper")
    assert refused.value.status == 403 and "Share my focus" in refused.value.message
    store.publish("me", "tab-00000001", body("reports/a.ipynb", cell={"id": "c1", "index": 2}))
    cell = store.focused_cell("helper", "./reports//a.ipynb")  # the same notebook, spelled otherwise
    assert (cell.path, cell.id, cell.index, cell.ref) == ("reports/a.ipynb", "c1", 2, "c1")
    with pytest.raises(AgentToolsError) as refused:
        store.focused_cell("helper", "b.ipynb")
    assert refused.value.status == 400 and "'reports/a.ipynb'" in refused.value.message
    store.publish("me", "tab-00000001", body("reports/a.ipynb", cell={"index": 4}))  # no id: by index
    assert store.focused_cell("helper").ref == "@4"
    for shown in (body("reports/a.ipynb"), body("data.csv", cell={"id": "c1", "index": 0})):
        store.publish("me", "tab-00000001", shown)
        with pytest.raises(AgentToolsError) as refused:
            store.focused_cell("helper")
        assert refused.value.status == 409 and "no active cell" in refused.value.message

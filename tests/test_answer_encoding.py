"""Large answers are encoded off the event loop: a size estimate bounded by its limit, the stepwise encoder
equal to ``json.dumps`` (quick), and a real route's large answer encoded in the JSON thread."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import nbformat
import pytest

from jupyter_agent_tools import body
from jupyter_agent_tools.body import encode_stepwise, larger_than

VALUES: list[Any] = [
    {},
    [],
    "",
    {"a": [1, 2.5, None, True, False], "é": '日本 🎉\n\t"\\', "nested": {"x": [{"y": []}]}},
    [1e300, -0.0, 10**30, "\u2028\x00\x7f"],
    {"cells": [{"source": "x" * 1000, "outputs": [{"text": "y\n" * 100}]} for _ in range(50)]},
]


@pytest.mark.quick
@pytest.mark.parametrize("value", VALUES)
def test_stepwise_encoding_is_json_dumps(value: Any) -> None:
    assert encode_stepwise(value) == json.dumps(value, ensure_ascii=False)


@pytest.mark.quick
def test_the_size_estimate_says_which_side_of_the_limit() -> None:
    assert not larger_than({"output": "x" * 100, "n": 3}, 1000)
    assert larger_than({"output": "x" * 2000}, 1000)
    assert larger_than([{"k": "v"}] * 500, 1000)  # many small values add up
    assert not larger_than([], 2) and larger_than([], 1)  # "[]" is two characters


@pytest.mark.quick
def test_the_size_estimate_stops_once_it_knows() -> None:
    seen = 0

    class Counted(dict):  # type: ignore[type-arg]
        def values(self) -> Any:
            nonlocal seen
            seen += 1
            return super().values()

    huge = [Counted(text="x" * 100) for _ in range(100_000)]
    assert larger_than(huge, 10_000)
    assert seen < 200  # of 100,000: the walk ended at the limit


async def test_a_large_answer_is_encoded_in_the_json_thread(
    jp_root_dir: Path, api: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads: list[str] = []

    def recorded(value: Any) -> str:
        threads.append(threading.current_thread().name)
        return encode_stepwise(value)

    monkeypatch.setattr(body, "encode_stepwise", recorded)  # the real encoder, its thread noted
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1")])
    nbformat.write(nb, str(jp_root_dir / "nb.ipynb"))
    big = "x = '" + "é" * 300_000 + "'"
    status, edited = await api("POST", "notebooks", "nb.ipynb", body={"action": "insert", "content": big})
    assert status == 200, edited
    status, change = await api("GET", "notebooks", "nb.ipynb", "changes", edited["change_id"])
    assert status == 200, change
    assert big in json.dumps(change, ensure_ascii=False)  # the whole answer arrived, decoded as sent
    assert threads and all(name.startswith("agent-tools-json") for name in threads)
    encoded = len(threads)
    status, listing = await api("GET", "notebooks", "nb.ipynb", "changes", params={"limit": "1"})
    assert status == 200 and listing["changes"]
    assert len(threads) == encoded  # a small answer is encoded at once, on the event loop

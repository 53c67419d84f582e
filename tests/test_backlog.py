"""The stream backlog: a bounded FIFO of eval events between the executor and a slow client (pure)."""

from __future__ import annotations

import tracemalloc

import pytest

from jupyter_agent_tools.execution.backlog import StreamBacklog, utf8_prefix

pytestmark = pytest.mark.quick  # the fast tier: no server, no kernel


def chunk(text: str, index: int = 0, name: str = "stdout") -> dict:
    return {"type": "chunk", "index": index, "name": name, "text": text}


def test_events_keep_their_order_and_consecutive_chunks_merge() -> None:
    backlog = StreamBacklog(1024)
    backlog.put({"type": "cell_start", "index": 0, "title": None})
    for text in ("a", "b", "c"):
        backlog.put(chunk(text))
    backlog.put(chunk("E", name="stderr"))
    backlog.put(chunk("d"))
    backlog.put({"type": "cell_end", "index": 0})
    assert backlog.take() == [
        {"type": "cell_start", "index": 0, "title": None},
        chunk("abc"),
        chunk("E", name="stderr"),
        chunk("d"),
        {"type": "cell_end", "index": 0},
    ]
    assert not backlog and backlog.take() == []


def test_many_small_chunks_merge_into_one() -> None:
    backlog = StreamBacklog(10**6)
    for _ in range(100_000):
        backlog.put(chunk("xy"))
    assert backlog.take() == [chunk("xy" * 100_000)]


def test_text_past_the_bound_becomes_a_gap_with_its_size() -> None:
    backlog = StreamBacklog(10)
    backlog.put(chunk("123456"))
    backlog.put(chunk("abcdefgh"))  # 4 bytes fit
    backlog.put(chunk("more"))
    backlog.put({"type": "display", "index": 0, "display": {}})  # never dropped
    backlog.put(chunk("x", index=1))
    assert backlog.take() == [
        chunk("123456abcd"),
        {"type": "gap", "index": 0, "name": "stdout", "bytes": 8},
        {"type": "display", "index": 0, "display": {}},
        {"type": "gap", "index": 1, "name": "stdout", "bytes": 1},
    ]
    assert backlog.skipped == 9


def test_taken_text_counts_until_sent() -> None:
    backlog = StreamBacklog(8)
    backlog.put(chunk("12345678"))
    assert backlog.take() == [chunk("12345678")]
    backlog.put(chunk("9"))  # the client has not read the first batch yet
    assert backlog.take() == [{"type": "gap", "index": 0, "name": "stdout", "bytes": 1}]
    backlog.sent()
    backlog.put(chunk("resumed"))
    assert backlog.take() == [chunk("resumed")]


def test_gap_bytes_are_utf8_and_cuts_keep_whole_characters() -> None:
    backlog = StreamBacklog(5)
    backlog.put(chunk("héllo wörld"))  # h(1) é(2) l l = 5 bytes
    events = backlog.take()
    assert events == [chunk("héll"), {"type": "gap", "index": 0, "name": "stdout", "bytes": 8}]
    assert utf8_prefix("日本語", 4) == "日"
    assert utf8_prefix("abc", 2) == "ab"


def test_closed_backlog_drops_everything() -> None:
    backlog = StreamBacklog(100)
    backlog.put(chunk("queued"))
    backlog.close()
    backlog.put(chunk("later"))
    backlog.put({"type": "result", "result": {}})
    assert not backlog and backlog.take() == []


def test_bound_must_be_positive() -> None:
    with pytest.raises(ValueError):
        StreamBacklog(0)


@pytest.mark.parametrize("unit", ["x", "日"])
def test_a_huge_chunk_costs_only_what_is_queued(unit: str) -> None:
    text = unit * 20_000_000
    backlog = StreamBacklog(1024 * 1024)
    tracemalloc.start()
    try:
        backlog.put(chunk(text))
        events = backlog.take()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    queued = events[0]["text"]
    assert len(queued.encode()) <= 1024 * 1024 and text.startswith(queued)
    assert events[1] == {
        "type": "gap",
        "index": 0,
        "name": "stdout",
        "bytes": len(text.encode()) - len(queued.encode()),
    }
    assert peak < 8 * 1024 * 1024, f"peak {peak} bytes"


def test_take_with_a_limit_splits_a_long_chunk_and_keeps_the_order() -> None:
    backlog = StreamBacklog(100)
    backlog.put(chunk("a" * 25))
    backlog.put(chunk("b" * 10))
    backlog.put({"type": "cell_end", "index": 0})
    assert backlog.take(20) == [chunk("a" * 20)]
    backlog.put(chunk("late", index=1))
    assert backlog.take(20) == [chunk("a" * 5 + "b" * 10), {"type": "cell_end", "index": 0}, chunk("late", 1)]
    # all 39 bytes are in flight until sent: 61 more fit
    backlog.put(chunk("c" * 70, index=1))
    assert backlog.take() == [chunk("c" * 61, 1), {"type": "gap", "index": 1, "name": "stdout", "bytes": 9}]

"""Smoke tests of benchmarks/: every module imports and the CLI lists it. Benchmarks themselves do not run
here (they take minutes and measure time); only their pure helpers are checked."""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import __main__ as cli
from benchmarks import common

REPO = Path(__file__).resolve().parent.parent

EXPECTED = {"concurrency", "eval_overhead", "notebook_edit", "notebook_read", "per_call", "stream"}
MODULES = sorted(p.stem for p in (REPO / "benchmarks").glob("bench_*.py"))


def test_every_benchmark_is_found():
    assert set(cli.available()) == {m.removeprefix("bench_") for m in MODULES}
    assert set(cli.available()) >= EXPECTED


@pytest.mark.parametrize("module_name", MODULES)
def test_benchmark_module_imports_and_names_itself(module_name):
    module = importlib.import_module(f"benchmarks.{module_name}")
    assert module_name == f"bench_{module.NAME}"
    assert isinstance(module.TITLE, str) and module.TITLE
    assert callable(module.run)
    assert module.__doc__, "a benchmark says what it measures in its docstring"


def test_cli_list_names_every_benchmark():
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--list"], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    listed = {line.split()[0] for line in proc.stdout.splitlines() if line.strip()}
    assert listed == set(cli.available())


def test_cli_refuses_an_unknown_benchmark():
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), pytest.raises(SystemExit) as exc:
        cli.main(["no_such_benchmark", "--no-write"])
    assert exc.value.code == 2
    assert "unknown benchmark(s): no_such_benchmark" in stderr.getvalue()


def test_ratios_of_durations_and_of_throughput():
    result = common.BenchResult(
        "x",
        "X",
        [
            common.Row("c", "base", [1.0, 1.0, 1.0]),
            common.Row("c", "slow", [2.0, 2.0, 4.0], baseline="base"),
        ],
    )
    duration = result.add_ratio("c", "slow", "base", target=1.2)
    speed = result.add_ratio("c", "slow", "base", target=0.8, op=">=", throughput=True)
    assert duration["median_ratio"] == 2.0 and duration["met"] is False
    assert speed["median_ratio"] == 0.5 and speed["met"] is False
    table = result.markdown()
    assert "| c | slow / base (throughput) | 0.50 |" in table
    assert "2.00x base" in table


def test_stream_cell_prints_the_requested_size_in_lines():
    from benchmarks.bench_stream import LINE_BYTES, MB, cell_code

    for flush in (True, False):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(cell_code(1, flush), {})
        text = out.getvalue()
        assert len(text.encode()) == MB
        assert {len(line) + 1 for line in text.splitlines()} == {LINE_BYTES}


def test_notebook_read_counts_every_page_and_approximates_tokens():
    from benchmarks.bench_notebook_read import approx_tokens, read_all

    assert (approx_tokens(""), approx_tokens("abcd"), approx_tokens("abcde")) == (0, 1, 2)
    pages = {
        "u?start=0&limit=200": b'{"next_start": 200}',
        "u?start=200&limit=200": b'{"next_start": null}',
        "u?start=0&limit=200&format=text": b"# x\n# cells 0-199 of 300; next page: start=200\nA",
        "u?start=200&limit=200&format=text": b"# x\n# cells 200-299 of 300\nB",
    }
    asked: list[str] = []

    def get(url: str) -> tuple[int, bytes]:
        asked.append(url)
        return 200, pages[url]

    assert read_all(get, "u", False) == (pages["u?start=0&limit=200"] + pages["u?start=200&limit=200"], 2)
    data, requests = read_all(get, "u", True)
    assert requests == 2 and data.endswith(b"B") and len(asked) == 4
    with pytest.raises(RuntimeError, match="HTTP 500"):
        read_all(lambda url: (500, b"boom"), "u", False)


def test_targets_of_ratios_and_checks_in_one_table(tmp_path):
    result = common.BenchResult(
        "x",
        "X",
        [common.Row("c", "base", [1.0, 1.0]), common.Row("c", "fast", [0.5, 0.5], baseline="base")],
    )
    result.add_ratio("c", "fast", "base")  # no target: not listed
    result.add_ratio("c", "fast", "base", target=0.9, op=">=", throughput=True)
    bound = result.add_check("c", "peak RSS growth over the raw row", 40.0, 32.0, unit=" MB")
    assert bound["met"] is False
    assert [(t["measured"], t["met"]) for t in result.targets()] == [(2.0, True), (40.0, False)]
    assert "| c | peak RSS growth over the raw row | 40.00 MB | <= 32 MB | **no** |" in result.markdown()
    saved = json.loads(json.dumps(result.to_json()))
    table = common.targets_table(common.targets_from_json([saved]))
    assert "| x | c | fast / base (throughput) | 2.00 | >= 0.9 | yes |" in table
    assert "| x | c | peak RSS growth over the raw row | 40.00 | <= 32 MB | **no** |" in table
    with pytest.raises(ValueError):
        result.add_check("c", "bad", 1.0, 1.0, op="~")

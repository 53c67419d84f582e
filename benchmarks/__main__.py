"""``python -m benchmarks [names...] [--quick] [--no-write] [--list]``: run, print and save benchmarks."""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
import time

from . import common


def available() -> dict[str, str]:
    """Benchmark name -> module name, for every ``bench_<name>.py`` in this package."""
    import benchmarks

    return {
        info.name.removeprefix("bench_"): f"benchmarks.{info.name}"
        for info in pkgutil.iter_modules(benchmarks.__path__)
        if info.name.startswith("bench_")
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("names", nargs="*", help="benchmarks to run (default: all); see --list")
    parser.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    parser.add_argument("--quick", action="store_true", help="few repetitions, small inputs: a smoke run")
    parser.add_argument("--no-write", action="store_true", help="print the tables but do not save results")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="run the server under pyinstrument (pip install pyinstrument, or the 'bench' extra) and write "
        "its report to benchmarks/results/<name>.profile.txt; timings are then slower than normal",
    )
    options = parser.parse_args(argv)
    benches = available()
    if options.list:
        for name, module in sorted(benches.items()):
            print(f"{name:24} {importlib.import_module(module).TITLE}")
        return 0
    names = [n.removeprefix("bench_").removesuffix(".py") for n in options.names] or sorted(benches)
    unknown = [n for n in names if n not in benches]
    if unknown:
        parser.error(f"unknown benchmark(s): {', '.join(unknown)} (available: {', '.join(sorted(benches))})")
    failed = 0
    targets: list[dict[str, object]] = []
    for name in names:
        module = importlib.import_module(benches[name])
        print(f"== {name}: {module.TITLE}", flush=True)
        start = time.perf_counter()
        load_at_start = common.load_average()
        try:
            result = module.run(options)
        except Exception:
            failed += 1
            import traceback

            traceback.print_exc()
            continue
        result.meta["wall_seconds"] = round(time.perf_counter() - start, 1)
        result.meta.setdefault("machine", {})["load_average_at_start"] = load_at_start
        result.meta["load_average_at_end"] = common.load_average()
        result.meta["profiled"] = bool(options.profile)
        result.meta["quick"] = bool(options.quick)
        print(result.markdown(), flush=True)
        targets += result.targets()
        if not options.no_write and not options.quick and not options.profile:
            for path in common.write_results(result):
                print(f"wrote {path}")
    if targets:
        print("== targets of this run", flush=True)
        print(common.targets_table(targets), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

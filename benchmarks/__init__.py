"""Ratio benchmarks of jupyter-agent-tools against raw baselines measured in the same run.

Run ``python -m benchmarks [names...]`` (``python3 dev.py bench`` does exactly that). Each ``bench_<name>.py``
module defines ``NAME``, ``TITLE`` and ``run(options) -> BenchResult``; results go to
``benchmarks/results/<name>.json`` and ``<name>.md``, and ``benchmarks/results/README.md`` lists the latest
tables. Benchmarks are not part of the test suite.
"""

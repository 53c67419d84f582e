"""``jupyter agent``: the terminal command over the agent routes (a ``jupyter-agent`` entry point).

Modules, one job each: ``args`` (the command line), ``cells`` (``# %%`` splitting, cell references),
``discovery`` (which server), ``commands`` (calls and exit codes), ``exits``, and ``render`` (terminal,
plain, JSON/NDJSON). Like :mod:`jupyter_agent_tools.client`, it talks HTTP only.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    """Run ``jupyter agent`` with ``argv`` (default: the process's arguments); return the exit code."""
    # httpx imports its own command-line client (click, rich, pygments) unless that import fails, which
    # it answers with a stub: 130-150 ms of every `jupyter agent` start, which shell-driven agents pay per
    # call. None in sys.modules makes that import fail; this process never runs httpx's command line.
    if "httpx" not in sys.modules:
        sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]
    from .commands import main as run

    try:
        return run(argv)
    except KeyboardInterrupt:  # Ctrl-C outside a run (while starting, or a second one)
        return 130
    except BrokenPipeError:  # the reader went away (`| head`): no traceback
        import os

        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1

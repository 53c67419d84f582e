"""Kernelspecs whose process is a Python script of the test's (a kernel that dies, sleeps or never
answers), written into a test's private kernels directory."""

from __future__ import annotations

import json
import sys
from pathlib import Path

RUN_IPYKERNEL = "runpy.run_module('ipykernel_launcher', run_name='__main__')\n"  # (after `import runpy`)


def script_kernelspec(kernels_dir: Path, name: str, code: str, display_name: str | None = None) -> str:
    """Write kernelspec ``name`` whose process runs ``code`` with ``-f <connection file>`` as its
    arguments (ending with :data:`RUN_IPYKERNEL` makes it a real kernel); return ``name``."""
    spec_dir = Path(kernels_dir) / name
    spec_dir.mkdir(parents=True, exist_ok=True)
    script = spec_dir / "kernel_script.py"
    script.write_text(code)
    spec = {
        "argv": [sys.executable, str(script), "-f", "{connection_file}"],
        "display_name": display_name or name,
        "language": "python",
    }
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    return name

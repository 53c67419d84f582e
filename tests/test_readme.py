"""The README's examples, pasted as a new user would: `python3 dev.py serve`, its printed `export` line,
then every shell block from "Routes" to the CLI, in order, in one bash, then docs/mcp.md's Python example in
the same variables. Real server, real kernels."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from jupyter_agent_tools.testing.server import free_port

pytestmark = pytest.mark.timeout(420)

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def mcp_python_example() -> str:
    """docs/mcp.md's Python SDK example, as a user pastes it."""
    guide = (ROOT / "docs" / "mcp.md").read_text()
    found = re.search(r"\*\*Python SDK\*\*.*?```python\n(.*?)```", guide, re.S)
    assert found is not None
    return found.group(1)


def readme_blocks() -> list[str]:
    """The bash blocks a user runs against the server: from "## Routes" up to the MCP section (whose one
    block adds the server to Claude Code, which is not installed here)."""
    start, end = README.index("\n## Routes"), README.index("\n### From any MCP client")
    return re.findall(r"```bash\n(.*?)```", README[start:end], re.S)


@contextlib.contextmanager
def dev_serve_in(tmp_path: Path, *args: str) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """``python3 dev.py serve ARGS`` run from a private root directory (the same one, and the same Jupyter
    directories, each time for one ``tmp_path``); yields it and its export line."""
    root = tmp_path / "root"
    root.mkdir(exist_ok=True)
    env = {
        **os.environ,
        "AGENT_TOOLS_VENV": sys.prefix,  # the environment the tests run in, as it is: dev.py installs nothing
        "AGENT_TOOLS_INSTALLED": "1",  # however it was installed (no stamp, or an older one)
        "AGENT_TOOLS_PORT": str(free_port()),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        **{f"JUPYTER_{d.upper()}_DIR": str(tmp_path / d) for d in ("config", "data", "runtime")},
    }
    env.pop("JUPYTER_TOKEN", None)
    process = subprocess.Popen(
        [sys.executable, str(ROOT / "dev.py"), "serve", *args],
        cwd=root,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        assert process.stdout is not None
        export = ""
        for line in process.stdout:
            if line.strip().startswith("export URL="):
                export = line.strip()
                break
        assert export, "dev.py serve printed no export line"
        url = re.search(r"URL=(\S+)", export)
        token = re.search(r"TOKEN=(\S+)", export)
        assert url and token
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            probe = subprocess.run(
                [
                    "curl",
                    "-s",
                    "-o",
                    "/dev/null",
                    "-w",
                    "%{http_code}",
                    "-H",
                    f"Authorization: token {token.group(1)}",
                    f"{url.group(1)}/api/status",
                ],
                capture_output=True,
                text=True,
            )
            if probe.stdout == "200":
                break
            time.sleep(0.2)
        else:
            pytest.fail("the server dev.py started never answered /api/status")
        yield process, export
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


@pytest.fixture
def dev_serve(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], str]]:
    with dev_serve_in(tmp_path) as served:
        yield served


def exported(export: str) -> dict[str, str]:
    """The variables an export line sets."""
    return dict(re.findall(r"\b([A-Z_]+)=(\S+)", export))


def get_json(url: str, token: str) -> dict[str, Any]:
    request = urllib.request.Request(url, headers={"Authorization": f"token {token}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        answer: dict[str, Any] = json.load(response)
    return answer


def test_readme_blocks_run_as_pasted_and_sigterm_stops_everything(dev_serve) -> None:
    process, export = dev_serve
    url = re.search(r"URL=(\S+)", export)
    assert url and not url.group(1).endswith("/"), export  # "$URL/api/..." must not become "//api/..."
    blocks = readme_blocks()
    assert len(blocks) >= 6
    script = ["set -e", export]  # a command of the README that fails stops the script (and the test)
    for i, block in enumerate(blocks):
        script += [f"printf '\\n=== block {i} ===\\n'", block]
    done = subprocess.run(
        ["bash"],
        input="\n".join(script),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=psutil.Process(process.pid).cwd(),
    )
    outputs = re.split(r"^=== block \d+ ===\n", done.stdout, flags=re.M)[1:]
    assert len(outputs) == len(blocks), done.stdout + done.stderr
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    assert "command not found" not in done.stderr, done.stderr
    for block, output in zip(blocks, outputs, strict=True):
        assert "<html" not in output.lower() and "404: Not Found" not in output, (block, output)
        for expected in re.findall(r"^# -> (.+)$", block, re.M):
            assert expected.strip().strip('"') in output, (block, output)
    # the eval block's answer is JSON with both cells complete
    eval_answer = next(
        out for blk, out in zip(blocks, outputs, strict=True) if '"session": "analysis"' in blk
    )
    answer = json.loads(eval_answer)
    assert [c["status"] for c in answer["cells"]] == ["complete", "complete"], answer

    # the CLI acted as its own agent (agent:cli), the curl examples as the server's token: the ledger (and
    # the panel) tells them apart
    names = exported(export)
    assert names["JUPYTER_AGENT_TOKEN"].startswith("jat_") and names["TOKEN"] != names["JUPYTER_AGENT_TOKEN"]
    changes = get_json(f"{names['URL']}/api/agent/notebooks/analysis/report.ipynb/changes", names["TOKEN"])
    by = {(c["via"], c["user"]) for c in changes["changes"]}
    assert ("cli", "agent:cli") in by and not any(u == "agent:cli" for via, u in by if via == "http"), by

    # docs/mcp.md's Python example next, in the same shell's variables (agent:cli, whose `default`
    # session the CLI's eval made, while the curl examples' `default` is the person's): it prints 42
    env = {**os.environ, **{k: v for k, v in names.items() if k != "PATH"}}
    example = subprocess.run(
        [sys.executable, "-c", mcp_python_example()], capture_output=True, text=True, env=env, timeout=120
    )
    assert (example.returncode, example.stdout.strip()) == (0, "42"), example.stderr[-2000:]
    # a refused call is not printed as if it were the answer: the example checks is_error
    made = subprocess.run(
        [sys.executable, "-m", "jupyter_agent_tools.cli", "token", "create", "reader", "--scopes", "read"],
        capture_output=True,
        text=True,
        env={**env, "PYTHONPATH": str(ROOT), "JUPYTER_AGENT_TOKEN": names["TOKEN"]},
        timeout=60,
    )
    assert made.returncode == 0, made.stderr
    reader = {**env, "JUPYTER_AGENT_TOKEN": made.stdout.split()[0]}
    refused = subprocess.run(
        [sys.executable, "-c", mcp_python_example()], capture_output=True, text=True, env=reader, timeout=120
    )
    assert refused.returncode != 0 and refused.stdout == "", (refused.stdout, refused.stderr[-2000:])
    assert "eval failed:" in refused.stderr and "scope" in refused.stderr, refused.stderr[-2000:]

    # SIGTERM to dev.py (what a supervisor sends) stops the server and the kernels it started
    children = psutil.Process(process.pid).children(recursive=True)
    assert any("jupyter" in " ".join(c.cmdline()) for c in children)
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=120)
    _gone, alive = psutil.wait_procs(children, timeout=60)
    assert not alive, [p.cmdline() for p in alive]


def test_dev_serve_keeps_its_tokens_across_restarts_unless_asked(tmp_path: Path) -> None:
    """The server's token and the CLI's agent token (agent:cli) are the same after a restart, kept 0600;
    --new-tokens makes new ones (and the old agent token is refused from then on)."""
    with dev_serve_in(tmp_path) as (process, export):
        first = exported(export)
        me = get_json(f"{first['URL']}/api/me", first["JUPYTER_AGENT_TOKEN"])
        assert me["identity"]["username"] == "agent:cli"
        # in the export line's shell, token commands take the server's own token (as the README says)
        exports = {k: v for k, v in first.items() if k != "PATH"}  # (PATH as typed: "...:$PATH")
        env = {**os.environ, **exports, "PYTHONPATH": str(ROOT)}
        listed = subprocess.run(
            [sys.executable, "-m", "jupyter_agent_tools.cli", "token", "list", "--token", first["TOKEN"]],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        assert listed.returncode == 0 and "cli" in listed.stdout, listed.stderr
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=120)
    kept = tmp_path / "data" / "jupyter_agent_tools" / "dev_serve_tokens.json"
    assert kept.stat().st_mode & 0o777 == 0o600
    with dev_serve_in(tmp_path) as (process, export):
        again = exported(export)
        assert (again["TOKEN"], again["JUPYTER_AGENT_TOKEN"]) == (
            first["TOKEN"],
            first["JUPYTER_AGENT_TOKEN"],
        )
        me = get_json(f"{again['URL']}/api/me", again["JUPYTER_AGENT_TOKEN"])
        assert me["identity"]["username"] == "agent:cli"
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=120)
    with dev_serve_in(tmp_path, "--new-tokens") as (process, export):
        new = exported(export)
        assert new["TOKEN"] != first["TOKEN"] and new["JUPYTER_AGENT_TOKEN"] != first["JUPYTER_AGENT_TOKEN"]
        assert get_json(f"{new['URL']}/api/me", new["JUPYTER_AGENT_TOKEN"])["identity"]["username"] == (
            "agent:cli"
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            get_json(f"{new['URL']}/api/me", first["JUPYTER_AGENT_TOKEN"])
        assert refused.value.code == 403
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=120)

"""The extension is enabled on install: the wheel ships the enable file, and Jupyter reads it.

Three checks, cheapest first:

1. the built wheel carries ``jupyter_agent_tools.json`` as shared data under ``etc/jupyter`` (so pip puts it
   in ``{sys.prefix}/etc/jupyter/jupyter_server_config.d``), with the right JSON, listed in RECORD;
2. ``jupyter server extension list`` reading the repo's ``jupyter-config`` dir reports it enabled and OK;
3. the wheel installed (offline, no dependencies) into a fresh bare virtualenv whose only other packages
   come from this environment through a ``.pth`` file: ``jupyter server extension list`` of that venv
   shows it enabled and OK in the venv's own sys-prefix config dir, without the user config dir.

The wheel is built without build isolation (hatchling must be installed here: offline machines cannot fetch
it); the checks are skipped when it is not.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
ENABLE_FILE = "jupyter_server_config.d/jupyter_agent_tools.json"
EXPECTED = {"ServerApp": {"jpserver_extensions": {"jupyter_agent_tools": True}}}
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER", "PYTHON", "PIP_"))}
    env.update(extra)
    return env


def extension_list(python: str, env: dict[str, str], cwd: Path) -> dict[str, str]:
    """``jupyter server extension list`` as {config dir: its section of the output}, colors removed."""
    proc = subprocess.run(
        [python, "-m", "jupyter_server.extension.serverextension", "list"],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    output = ANSI.sub("", proc.stdout + proc.stderr)
    sections: dict[str, str] = {}
    current = None
    for line in output.splitlines():
        if line.startswith("Config dir: "):
            current = line[len("Config dir: ") :].strip()
            sections[current] = ""
        elif current is not None:
            sections[current] += line + "\n"
    return sections


def assert_enabled_ok(section: str) -> None:
    assert re.search(r"^\s*jupyter_agent_tools enabled\s*$", section, re.M), section
    assert re.search(r"^\s*jupyter_agent_tools \S+ OK\s*$", section, re.M), section


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("hatchling", reason="hatchling is needed to build the wheel offline")
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-q",
            "-w",
            str(out),
            str(REPO),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=clean_env(),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (path,) = out.glob("jupyter_agent_tools-*.whl")
    return path


def test_wheel_ships_the_audit_event_schemas(wheel: Path) -> None:
    schemas = sorted(
        p.relative_to(REPO).as_posix() for p in REPO.glob("jupyter_agent_tools/audit/event_schemas/*/*.yaml")
    )
    assert len(schemas) == 8  # approval, execution, ..., focus
    with zipfile.ZipFile(wheel) as zf:
        for name in schemas:
            assert zf.read(name) == (REPO / name).read_bytes()


def test_repo_enable_file() -> None:
    data = json.loads((REPO / "jupyter-config" / ENABLE_FILE).read_text())
    assert data == EXPECTED


def test_wheel_ships_enable_file_as_shared_data(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        (data_file,) = [n for n in names if n.endswith(f".data/data/etc/jupyter/{ENABLE_FILE}")]
        assert re.fullmatch(rf"jupyter_agent_tools-[^/]+\.data/data/etc/jupyter/{ENABLE_FILE}", data_file)
        assert json.loads(zf.read(data_file)) == EXPECTED
        (record,) = [n for n in names if n.endswith(".dist-info/RECORD")]
        rows = list(csv.reader(io.StringIO(zf.read(record).decode())))
        assert data_file in {row[0] for row in rows}
        assert "jupyter_agent_tools/__init__.py" in names
        assert "jupyter_agent_tools/notebook/operations.py" in names


def test_extension_list_reads_repo_config(tmp_path: Path) -> None:
    # `extension list` shows the user config dir (JUPYTER_CONFIG_DIR), sys-prefix and system dirs;
    # JUPYTER_CONFIG_PATH is not listed, so the repo's jupyter-config dir is passed as the user dir.
    # A copy: Jupyter apps write a "migrated" marker into their user config dir.
    config_dir = str(tmp_path / "jupyter-config")
    shutil.copytree(REPO / "jupyter-config", config_dir)
    sections = extension_list(sys.executable, clean_env(JUPYTER_CONFIG_DIR=config_dir), tmp_path)
    assert config_dir in sections, sections
    assert_enabled_ok(sections[config_dir])


@pytest.mark.timeout(180)
def test_wheel_install_enables_extension(wheel: Path, tmp_path: Path) -> None:
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False, symlinks=os.name != "nt").create(env_dir)
    python = env_dir / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    target_purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,  # not the checkout: '' on sys.path would import the repo's copy
    ).stdout.strip()
    # Dependencies (jupyter_server, ...) come from this environment, after the venv's own site-packages.
    Path(target_purelib, "_host_env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--no-deps",
            "--no-index",
            "-q",
            str(wheel),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=clean_env(),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    installed = env_dir / "etc" / "jupyter" / ENABLE_FILE
    assert json.loads(installed.read_text()) == EXPECTED
    located = subprocess.run(
        [str(python), "-c", "import jupyter_agent_tools; print(jupyter_agent_tools.__file__)"],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,  # not the checkout: '' on sys.path would import the repo's copy
    ).stdout.strip()
    assert Path(located).is_relative_to(env_dir), located  # the wheel's copy, not the checkout

    empty_user_dir = tmp_path / "user-config"
    empty_user_dir.mkdir()
    sections = extension_list(str(python), clean_env(JUPYTER_CONFIG_DIR=str(empty_user_dir)), tmp_path)
    prefix_dir = next(d for d in sections if Path(d) == env_dir / "etc" / "jupyter")
    assert_enabled_ok(sections[prefix_dir])
    assert "jupyter_agent_tools" not in sections[str(empty_user_dir)]

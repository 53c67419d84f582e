"""Audit events and Prometheus metrics, on a real server configured the way an admin would configure it.

The server is a subprocess started with a ``jupyter_server_config.py`` that sends jupyter_events to a
``logging.FileHandler`` (``c.EventLogger.handlers``), names its token user (an IdentityProvider) and
denies a permission when a test header asks it to (an Authorizer). Every event the tests read is checked
against the schema the package ships.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import nbformat
import pytest
import yaml
from jupyter_events import EventLogger
from nbformat.v4 import new_code_cell, new_notebook
from prometheus_client.parser import text_string_to_metric_families

from jupyter_agent_tools.audit import Audit, set_user
from jupyter_agent_tools.audit.events import (
    EXECUTION,
    LEDGER_CHANGE,
    NOTEBOOK_CHANGE,
    RECOVERY,
    REFUSAL,
    SCHEMA_IDS,
    SESSION,
    changed_cells,
    schema_files,
)
from jupyter_agent_tools.pytest_plugin import EventLines
from jupyter_agent_tools.testing.server import Server, jupyter_server

pytestmark = pytest.mark.timeout(240)

USER = "audit-alice"
SECRET = "print('the secret sauce')"

CONFIG = """
import logging
from jupyter_server.auth import IdentityProvider, User
from jupyter_server.auth.authorizer import Authorizer


class NamedUser(IdentityProvider):
    def generate_anonymous_user(self, handler):
        return User(username={user!r}, name="Alice")


class HeaderDenies(Authorizer):
    def is_authorized(self, handler, user, action, resource):
        return handler.request.headers.get("X-Test-Deny") != f"{{action}}:{{resource}}"


c.ServerApp.identity_provider_class = NamedUser
c.ServerApp.authorizer_class = HeaderDenies
c.EventLogger.handlers = [logging.FileHandler({events!r})]
c.EvalSessionManager.max_sessions = 1
c.EvalSessionManager.heartbeat_interval = 0
c.CellExecutor.max_output_bytes = 64
c.Audit.include_code = {include_code!r}
"""


def schemas() -> dict[str, dict[str, Any]]:
    loaded = {}
    for path in schema_files():
        schema = yaml.safe_load(path.read_text())
        loaded[schema["$id"]] = schema
    return loaded


SCHEMAS = schemas()


class Audited:
    """A server with the audit config, its events file and an HTTP client with its token."""

    def __init__(self, server: Server, events: Path):
        self.server = server
        self.events_path = events
        self.http = httpx.Client(
            base_url=server.url, headers={"Authorization": f"token {server.token}"}, timeout=120
        )

    def call(self, method: str, path: str, body: Any = None, **headers: str) -> tuple[int, Any]:
        response = self.http.request(
            method, path, content=None if body is None else json.dumps(body), headers=headers
        )
        return response.status_code, (response.json() if response.content else None)

    def events(self, schema_id: str | None = None) -> list[dict[str, Any]]:
        """Every event written so far (validated against its published schema), or those of one schema."""
        found = []
        for line in self.events_path.read_text().splitlines():
            record = json.loads(line)
            if not record["__schema__"].startswith("https://events.jupyter.org/jupyter_agent_tools/"):
                continue
            schema = SCHEMAS[record["__schema__"]]
            assert record["__schema_version__"] == schema["version"]
            data = {k: v for k, v in record.items() if not k.startswith("__")}
            jsonschema.validate(data, schema)
            if schema_id is None or record["__schema__"] == schema_id:
                found.append(data)
        return found

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        response = self.http.get("metrics")
        assert response.status_code == 200, response.text
        samples = {}
        for family in text_string_to_metric_families(response.text):
            for sample in family.samples:
                samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
        return samples


@pytest.fixture
def audited(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Audited]:
    include_code = bool(getattr(request, "param", False))
    events = tmp_path / "events.jsonl"
    config = tmp_path / "jupyter_server_config.py"
    config.write_text(CONFIG.format(user=USER, events=str(events), include_code=include_code))
    root = tmp_path / "root"
    root.mkdir()
    nbformat.write(new_notebook(cells=[new_code_cell("x = 1", id="first")]), str(root / "nb.ipynb"))
    with jupyter_server(root_dir=root, extra_args=[f"--config={config}"]) as server:
        audited = Audited(server, events)
        try:
            yield audited
        finally:
            audited.http.close()


def value(samples: dict[Any, float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_events_of_an_edit_an_eval_a_recovery_an_eviction_and_a_refusal(audited: Audited) -> None:
    before = audited.metrics()
    # an edit
    status, edit = audited.call(
        "POST",
        "api/agent/notebooks/nb.ipynb",
        {"ops": [{"action": "insert", "cell_index": 1, "content": SECRET, "cell_id": "added"}]},
    )
    assert status == 200, edit
    (change,) = audited.events(NOTEBOOK_CHANGE)
    assert change["user"] == USER
    assert change["path"] == "nb.ipynb" and change["actions"] == ["insert"]
    assert change["cell_ids"] == ["added"] and change["cells_changed"] == 1
    assert change["hash_after"] == edit["hash"] and change["hash_before"] != edit["hash"]
    assert change["target"] == "file"
    assert "sources" not in change
    # ... and the ledger's entry of it (what the Agents panel lists live), with the id the answer has
    (recorded,) = audited.events(LEDGER_CHANGE)
    assert recorded["change_id"] == edit["change_id"] and recorded["path"] == "nb.ipynb"
    assert recorded["user"] == USER and recorded["via"] == "http" and recorded["kind"] == "edit"
    assert recorded["undoable"] is True and recorded["action"] == "insert 1 cell"
    assert recorded["cells"] == [
        {"id": "added", "what": ["inserted"], "index_before": None, "index_after": 1}
    ]

    # an eval whose output is cut (an artifact), in session "a"
    status, result = audited.call(
        "POST", "api/agent/eval", {"session": "a", "cells": [{"code": "print('y' * 200)"}, {"code": SECRET}]}
    )
    assert status == 200, result
    (run,) = audited.events(EXECUTION)
    assert run["user"] == USER and run["mode"] == "session" and run["session"] == "a"
    assert run["status"] == "ok" and run["cell_count"] == 2
    assert run["kernel_id"] == result["kernel_id"]
    assert [c["status"] for c in run["cells"]] == ["complete", "complete"]
    assert run["output_bytes"] == sum(c["total_bytes"] for c in result["cells"]) > 200
    assert run["artifact_ids"] == [result["cells"][0]["artifact_id"]]
    assert run["timed_out"] is False and run["cancelled"] is False and run["restarted"] is False
    assert "code" not in run

    # a recovery: the kernel dies during the call, is replaced, and the call runs again
    die_once = (
        "import os, pathlib\n"
        "marker = pathlib.Path('died-once')\n"
        "if not marker.exists():\n"
        "    marker.touch()\n"
        "    os._exit(1)\n"
        "print('survived')"
    )
    status, result = audited.call("POST", "api/agent/eval", {"session": "a", "cells": [{"code": die_once}]})
    assert status == 200 and result["restarted"] is True, result
    (recovery,) = audited.events(RECOVERY)
    assert recovery["kind"] == "restarts" and recovery["outcome"] == "recovered"
    assert recovery["session"] == "a" and recovery["user"] == USER
    assert audited.events(EXECUTION)[-1]["restarted"] is True

    # an eviction: max_sessions=1, so session "b" evicts the idle session "a"
    status, result = audited.call("POST", "api/agent/eval", {"session": "b", "cells": [{"code": "1"}]})
    assert status == 200, result
    lifecycle = [e for e in audited.events(SESSION) if not e["action"].startswith(("call_", "cell_"))]
    steps = [(e["session"], e["action"]) for e in lifecycle]
    assert steps == [("a", "created"), ("a", "evicted"), ("b", "created")]
    # each call of a session is told as it takes its turn and as it ends (the panel's runs in progress)
    calls = [(e["session"], e["action"]) for e in audited.events(SESSION) if e["action"].startswith("call_")]
    assert calls == [("a", "call_started"), ("a", "call_ended")] * 2 + [
        ("b", "call_started"),
        ("b", "call_ended"),
    ]
    assert all(e["queue_depth"] == 0 for e in audited.events(SESSION) if e["action"].startswith("call_"))
    # ... and each cell it starts (the first call ran two cells; the second ran its one cell twice)
    cells = [(e["session"], e["cell"]) for e in audited.events(SESSION) if e["action"] == "cell_started"]
    assert cells == [("a", {"index": i, "of": n}) for i, n in ((0, 2), (1, 2), (0, 1), (0, 1))] + [
        ("b", {"index": 0, "of": 1})
    ]
    evicted = lifecycle[1]
    assert evicted["owner"] == USER and evicted["user"] == USER and evicted["idle_seconds"] >= 0

    # refusals by the authorizer: the eval route and the notebook route, nothing done
    status, answer = audited.call(
        "POST",
        "api/agent/eval",
        {"session": "b", "cells": [{"code": "1"}]},
        **{"X-Test-Deny": "execute:kernels"},
    )
    assert status == 403, answer
    status, answer = audited.call(
        "POST",
        "api/agent/notebooks/nb.ipynb",
        {"ops": [{"action": "delete", "cell_index": 0}]},
        **{"X-Test-Deny": "write:contents"},
    )
    assert status == 403, answer
    refusals = audited.events(REFUSAL)
    assert [(r["route"], r["method"], r["action"], r["resource"]) for r in refusals] == [
        ("eval", "POST", "execute", "kernels"),
        ("notebook", "POST", "write", "contents"),
    ]
    assert all(r["user"] == USER for r in refusals)
    assert len(audited.events(NOTEBOOK_CHANGE)) == 1 and len(audited.events(EXECUTION)) == 3

    # a bad request is an execution that failed, with what the caller was told
    status, answer = audited.call("POST", "api/agent/eval", {"session": "b", "cells": []})
    assert status == 400
    failed = audited.events(EXECUTION)[-1]
    assert (
        failed["status"] == "failed"
        and failed["http_status"] == 400
        and failed["message"] == answer["message"]
    )

    # the user is the identity jupyter_server resolved, never the token; no code by default
    text = audited.events_path.read_text()
    assert audited.server.token not in text
    assert "secret sauce" not in text
    assert {e["user"] for e in audited.events()} == {USER}

    # the same facts move the metrics on jupyter_server's /metrics
    after = audited.metrics()

    def moved(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert moved("jupyter_agent_notebook_edits_total", action="insert", target="file") == 1
    assert moved("jupyter_agent_evals_total", mode="session", status="ok") == 3
    assert moved("jupyter_agent_evals_total", mode="session", status="failed") == 1
    assert moved("jupyter_agent_eval_duration_seconds_count", mode="session") == 4
    assert moved("jupyter_agent_cells_total", mode="session", status="complete") == 4
    assert moved("jupyter_agent_recoveries_total", kind="restarts", outcome="recovered") == 1
    assert moved("jupyter_agent_session_events_total", action="evicted") == 1
    assert moved("jupyter_agent_session_events_total", action="created") == 2
    assert moved("jupyter_agent_authorization_refusals_total", route="eval", resource="kernels") == 1
    assert moved("jupyter_agent_request_errors_total", route="eval", status_code="403") == 1
    assert moved("jupyter_agent_request_errors_total", route="notebook", status_code="403") == 1
    assert moved("jupyter_agent_request_errors_total", route="eval", status_code="400") == 1
    assert value(after, "jupyter_agent_sessions_active", mode="session") == 1
    assert value(after, "jupyter_agent_queued_requests") == 0
    assert value(after, "jupyter_agent_artifacts_bytes") == 0  # session "a" and its artifact are gone
    allowed = {
        "mode",
        "status",
        "action",
        "target",
        "kind",
        "outcome",
        "cause",
        "route",
        "status_code",
        "resource",
        "state",
        "le",
    }
    for name, labels in after:
        if name.startswith("jupyter_agent_"):
            assert {k for k, _ in labels} <= allowed, (name, labels)
            assert all(USER not in v and "nb.ipynb" not in v for _, v in labels), (name, labels)


def test_metrics_need_the_token_as_jupyter_server_requires(audited: Audited) -> None:
    assert httpx.get(audited.server.url + "metrics", timeout=30).status_code == 403
    status, result = audited.call(
        "POST", "api/agent/eval", {"session": "s", "cells": [{"code": "print('z' * 100)"}]}
    )
    assert status == 200, result
    samples = audited.metrics()
    assert value(samples, "jupyter_agent_artifacts_bytes") >= 100  # the cut output's artifact


@pytest.mark.parametrize("audited", [True], indirect=True)
def test_include_code_adds_cell_sources(audited: Audited) -> None:
    status, edit = audited.call(
        "POST",
        "api/agent/notebooks/nb.ipynb",
        {"ops": [{"action": "edit", "cell_id": "first", "content": SECRET}]},
    )
    assert status == 200, edit
    (change,) = audited.events(NOTEBOOK_CHANGE)
    assert change["sources"] == {"first": SECRET} and change["actions"] == ["edit"]
    status, result = audited.call("POST", "api/agent/notebooks/nb.ipynb/run", {"all": True})
    assert status == 200, result
    run = audited.events(EXECUTION)[-1]
    assert run["mode"] == "notebook" and run["path"] == "nb.ipynb" and run["code"] == [SECRET]
    assert run["status"] == "ok" and run["cells"][0]["cell_id"] == "first"
    # the run's own writes: the cell's outputs cleared as it starts, then written when it ends
    writes = audited.events(NOTEBOOK_CHANGE)[1:]
    assert [w["actions"] for w in writes] == [["run_outputs"]] or [w["actions"] for w in writes] == [
        ["run_clear"],
        ["run_outputs"],
    ]
    assert writes[-1]["cell_ids"] == ["first"] and writes[-1]["hash_after"] == result["hash"]


def test_sessions_listing_shows_owner_cwd_and_last_output(audited: Audited) -> None:
    (audited.server.root_dir / "work").mkdir()
    status, result = audited.call(
        "POST", "api/agent/eval", {"session": "w", "cwd": "work", "cells": [{"code": "x = 1"}]}
    )
    assert status == 200, result
    status, listing = audited.call("GET", "api/agent/sessions")
    (entry,) = listing["sessions"]
    assert entry["owner"] == USER and entry["cwd"] == "work" and entry["last_output_at"] is None
    started = time.time()
    status, result = audited.call("POST", "api/agent/eval", {"session": "w", "cells": [{"code": "print(1)"}]})
    assert status == 200, result
    status, listing = audited.call("GET", "api/agent/sessions")
    (entry,) = listing["sessions"]
    stamp = time.mktime(time.strptime(entry["last_output_at"][:19], "%Y-%m-%dT%H:%M:%S")) - time.timezone
    assert started - 1 <= stamp <= time.time() + 1
    assert entry["cwd"] == ""  # the last call ran in the root


# -- the facade without a server ---------------------------------------------------------------------


def test_every_schema_registers_and_an_invalid_event_is_not_written_but_logged(caplog) -> None:
    logger = EventLogger()
    collect = EventLines()
    logger.register_handler(collect)
    audit = Audit(event_logger=logger)
    audit.register_schemas()
    assert set(SCHEMA_IDS) == set(SCHEMAS) == set(logger.schemas.schema_ids) & set(SCHEMA_IDS)
    audit.refused(route="eval", method="POST", action="execute", resource="kernels", user="bob")
    assert json.loads(collect.lines[0])["user"] == "bob"
    with caplog.at_level(logging.ERROR):
        audit.emit(REFUSAL, {"user": "bob", "route": "eval"})  # required fields missing
    assert len(collect.lines) == 1
    assert "was not recorded" in caplog.text


def test_the_acting_user_reaches_events_without_an_argument() -> None:
    logger = EventLogger()
    collect = EventLines()
    logger.register_handler(collect)
    audit = Audit(event_logger=logger)
    audit.register_schemas()
    token = set_user("carol")
    try:
        audit.notebook_changed(
            path="p.ipynb",
            actions=["delete"],
            before={"cells": [{"id": "a"}, {"id": "b"}]},
            after={"cells": [{"id": "a"}]},
            hash_before="h1",
            hash_after="h2",
            live=True,
        )
    finally:
        from jupyter_agent_tools.audit.context import _USER

        _USER.reset(token)
    event = json.loads(collect.lines[0])
    assert event["user"] == "carol" and event["cell_ids"] == ["b"] and event["target"] == "live"


def test_changed_cells_by_id_and_by_position() -> None:
    a, b, b2, c = {"id": "a", "s": 1}, {"id": "b", "s": 1}, {"id": "b", "s": 2}, {"id": "c"}
    assert changed_cells([a, b], [a, b2, c]) == (["b", "c"], 2)
    assert changed_cells([a, b], [b, a]) == ([], 0)  # a move changes no cell (the order is in actions)
    assert changed_cells([{"s": 1}, {"s": 2}], [{"s": 1}, {"s": 3}, {"s": 4}]) == ([], 2)


def test_metrics_are_defined_once_per_process() -> None:
    import importlib

    from prometheus_client import REGISTRY

    from jupyter_agent_tools.audit import metrics

    first = metrics.EVALS
    gauges = [c for c in REGISTRY._collector_to_names if type(c).__qualname__ == "_Gauges"]
    reloaded = importlib.reload(metrics)
    assert reloaded.EVALS is first
    again = [c for c in REGISTRY._collector_to_names if type(c).__qualname__ == "_Gauges"]
    assert len(again) == len(gauges) == 1


def test_schemas_ship_in_the_package_and_document_every_field() -> None:
    for schema_id, schema in SCHEMAS.items():
        assert schema_id.startswith("https://events.jupyter.org/jupyter_agent_tools/")
        assert schema["personal-data"] is True and "user" in schema["required"]
        assert schema["description"].strip()


# -- the warm kernel pool -----------------------------------------------------------------------------


@pytest.mark.warm_pool
async def test_listing_and_gauge_show_the_warm_pool(api, evaluate, jp_fetch) -> None:
    status, listing = await api("GET", "sessions")
    assert status == 200 and listing["pool"]["size"] == 1 and listing["pool"]["ready"] == 0
    assert 'jupyter_agent_pool_kernels{state="ready"} 0.0' in (await jp_fetch("metrics")).body.decode()
    await evaluate("1", mode="per-call")  # the first eval starts filling the pool
    for _ in range(600):
        _, listing = await api("GET", "sessions")
        if listing["pool"]["ready"] == 1:
            break
        await asyncio.sleep(0.05)
    assert listing["pool"]["ready"] == 1, listing["pool"]
    assert 'jupyter_agent_pool_kernels{state="ready"} 1.0' in (await jp_fetch("metrics")).body.decode()


class TestLifecycle:
    @pytest.fixture
    def jp_server_config(self) -> dict[str, Any]:
        return {
            "ServerApp": {"jpserver_extensions": {"jupyter_agent_tools": True}},
            "EvalSessionManager": {"idle_timeout": 0.5, "cleanup_interval": 0.2, "heartbeat_interval": 0},
        }

    async def test_idle_cull_interrupt_and_delete_are_recorded(
        self, evaluate, api, agent_audit_events
    ) -> None:
        await evaluate("1", session="idle")
        for _ in range(100):
            if any(e["action"] == "idle_culled" for e in agent_audit_events("session")):
                break
            await asyncio.sleep(0.05)
        culled = [e for e in agent_audit_events("session") if e["action"] == "idle_culled"]
        assert [(e["session"], e["user"]) for e in culled] == [("idle", None)]  # the server's own sweep
        assert culled[0]["idle_seconds"] >= 0.5 and culled[0]["owner"]
        await evaluate("1", session="kept")
        assert (await api("POST", "sessions/kept/interrupt", body={}))[0] == 200
        assert (await api("DELETE", "sessions/kept"))[0] == 204
        lifecycle = [
            e for e in agent_audit_events("session") if not e["action"].startswith(("call_", "cell_"))
        ]
        steps = [(e["session"], e["action"]) for e in lifecycle][-3:]
        assert steps == [("kept", "created"), ("kept", "interrupted"), ("kept", "deleted")]
        interrupted = lifecycle[-2]
        assert interrupted["interrupted_call"] is False and isinstance(interrupted["user"], str)

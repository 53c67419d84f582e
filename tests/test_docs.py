"""The documentation lists every configuration trait of the package, by class, with its real default."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import pytest
from traitlets import Undefined
from traitlets.config import Configurable

import jupyter_agent_tools
from jupyter_agent_tools.app import AgentToolsApp

pytestmark = pytest.mark.quick  # the fast tier: no server, no kernel

ROOT = Path(__file__).resolve().parent.parent


def configurables() -> list[type[Configurable]]:
    """Every configurable class the package defines that declares settings of its own."""
    found = []
    for module in pkgutil.walk_packages(jupyter_agent_tools.__path__, "jupyter_agent_tools."):
        if module.name.endswith("__main__"):
            continue
        for cls in vars(importlib.import_module(module.name)).values():
            if (
                inspect.isclass(cls)
                and issubclass(cls, Configurable)
                and cls.__module__ == module.name
                and cls.class_own_traits(config=True)
            ):
                found.append(cls)
    return sorted(found, key=lambda cls: cls.__name__)


CLASSES = configurables()
# The agent token mixin's settings are read as c.AgentIdentityProvider.* (the name of every provider class
# it is mixed into, the plain server's and JupyterHub's wrapped one).
SECTION = {"AgentTokens": "AgentIdentityProvider"}
TRAITS = [
    (f"{SECTION.get(cls.__name__, cls.__name__)}.{name}", trait)
    for cls in CLASSES
    for name, trait in sorted(cls.class_own_traits(config=True).items())
]


def test_traits_exist():
    assert len(TRAITS) >= 40
    names = {cls.__name__ for cls in CLASSES}
    assert {"AgentToolsApp", "EvalService", "EvalSessionManager", "KernelService", "NotebookStore"} <= names


def test_the_app_lists_every_service_class_it_builds():
    """``AgentToolsApp.classes`` (what --help-all prints) holds every configurable of the package that the
    server does not build itself (the identity provider and the authorizer are ServerApp's)."""
    built_by_server = {"AgentIdentityProvider", "AgentTokens", "AgentAuthorizer"}
    built_by_server |= {"HubOAuthApp", "HubOAuthService"}  # the hub's service, its own application
    expected = {cls for cls in CLASSES if cls is not AgentToolsApp and cls.__name__ not in built_by_server}
    assert expected <= set(AgentToolsApp.classes)


@pytest.mark.parametrize(("name", "trait"), TRAITS, ids=[name for name, _ in TRAITS])
def test_configuration_doc_lists_trait_with_default(name, trait):
    doc = (ROOT / "docs" / "configuration.md").read_text()
    row = re.search(rf"^\| `{re.escape(name)}` \|[^\n]*$", doc, re.M)
    assert row, f"docs/configuration.md has no table row for {name}"
    default = trait.default_value
    if default is Undefined:  # a container trait (List) makes its default when asked
        default = trait.default()
    if isinstance(default, type):  # a Type trait resolves its import string once an app exists
        default = f"{default.__module__}.{default.__qualname__}"
    shown = f'`"{default}"`' if isinstance(default, str) else f"`{default!r}`"
    if isinstance(default, str) and default == "":
        shown = '`""`'
    assert shown in row.group(0), f"{name}: default {shown} not in {row.group(0)!r}"


@pytest.mark.parametrize(("name", "trait"), TRAITS, ids=[name for name, _ in TRAITS])
def test_trait_has_help(name, trait):
    assert trait.help and len(trait.help) > 20


def test_every_mcp_tool_is_in_the_api_and_mcp_docs():
    """docs/api.md's MCP section and docs/mcp.md name every tool the server lists (a new tool must be
    documented in both)."""
    from jupyter_agent_tools.mcp.tools import TOOLS

    api = (ROOT / "docs" / "api.md").read_text()
    section = api[api.index("\n## MCP: `POST /api/agent/mcp`") :]
    section = section[: section.index("\n## ", 1)]
    guide = (ROOT / "docs" / "mcp.md").read_text()
    for tool in TOOLS:
        assert f"`{tool.name}`" in section, f"docs/api.md's MCP section does not name {tool.name}"
        assert f"| `{tool.name}` |" in guide, f"docs/mcp.md's tool table has no row for {tool.name}"


def test_the_event_stream_table_names_each_event_type_with_exactly_its_fields():
    """docs/api.md's table of stream events has one row per type of ``stream_events`` and, outside its
    parentheses, the fields of that type's typed dict: a field added to an event without docs fails here."""
    from typing import get_args, get_type_hints

    from jupyter_agent_tools.stream_events import RunEvent

    typed = {}
    for cls in get_args(RunEvent):
        hints = get_type_hints(cls)
        (name,) = get_args(hints.pop("type"))
        typed[name] = set(hints)
    api = (ROOT / "docs" / "api.md").read_text()
    section = api[api.index("\n### The event stream") :]
    rows = section[section.index("|---|") : section.index("\n\n", section.index("|---|"))].splitlines()[1:]
    documented = {}
    for row in rows:
        name, fields = row.split(" | ")[:2]
        documented[name.strip("| `")] = set(re.findall(r"`(\w+)`", re.sub(r"\([^)]*\)", "", fields)))
    assert documented == typed

"""The documentation lists every configuration trait with its real default."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from jupyter_agent_tools.app import AgentToolsApp

pytestmark = pytest.mark.quick  # the fast tier: no server, no kernel

ROOT = Path(__file__).resolve().parent.parent
TRAITS = sorted((name, trait) for name, trait in AgentToolsApp.class_own_traits(config=True).items())


def test_traits_exist():
    assert len(TRAITS) >= 10


@pytest.mark.parametrize(("name", "trait"), TRAITS, ids=[name for name, _ in TRAITS])
def test_configuration_doc_lists_trait_with_default(name, trait):
    doc = (ROOT / "docs" / "configuration.md").read_text()
    row = re.search(rf"^\| `{name}` \|[^\n]*$", doc, re.M)
    assert row, f"docs/configuration.md has no table row for {name}"
    default = trait.default_value
    if isinstance(default, type):  # a Type trait resolves its import string once an app exists
        default = f"{default.__module__}.{default.__qualname__}"
    shown = f'`"{default}"`' if isinstance(default, str) else f"`{default!r}`"
    if isinstance(default, str) and default == "":
        shown = '`""`'
    assert shown in row.group(0), f"{name}: default {shown} not in {row.group(0)!r}"


@pytest.mark.parametrize(("name", "trait"), TRAITS, ids=[name for name, _ in TRAITS])
def test_trait_has_help(name, trait):
    assert trait.help and len(trait.help) > 20

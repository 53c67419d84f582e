"""The typed answers (jupyter_agent_tools.answers) name exactly the fields the OpenAPI document publishes
for them: a field added to one and not the other fails here (quick)."""

from __future__ import annotations

from typing import Any

import pytest

from jupyter_agent_tools.answers import CellResult, EvalAnswer, RunAnswer
from jupyter_agent_tools.schemas import ANSWER_SCHEMAS, SCHEMAS

pytestmark = pytest.mark.quick


def fields(typed: Any) -> set[str]:
    return set(typed.__required_keys__ | typed.__optional_keys__)


def published(name: str) -> tuple[set[str], set[str]]:
    schema = {**SCHEMAS, **ANSWER_SCHEMAS}[name]
    return set(schema["properties"]), set(schema.get("required", []))


@pytest.mark.parametrize(
    ("typed", "name"),
    [(EvalAnswer, "EvalResult"), (RunAnswer, "NotebookRunResult"), (CellResult, "EvalCellResult")],
)
def test_the_typed_answer_is_the_published_one(typed: Any, name: str) -> None:
    properties, required = published(name)
    assert fields(typed) == properties
    assert set(typed.__required_keys__) >= required  # what the document requires, the type requires

"""The compiled schema checks answer as jsonschema does, on bodies made from every published schema.

:mod:`jupyter_agent_tools.schema_compile` decides the yes of every request's validation; jsonschema (as
:mod:`jupyter_agent_tools.validation` configures it) is the reference. Bodies are generated from each
schema (valid ones: required fields, optional ones at random, branches of ``oneOf``/``anyOf``), then
mutated (a field dropped, an unknown one added, a value swapped for another JSON value: ``True`` for
``1``, ``1.0`` for ``1``, a NUL in a string, NaN...), and both must give the same answer for each.
"""

from __future__ import annotations

import copy
import math
import random
from typing import Any

import pytest

from jupyter_agent_tools.schema_compile import Uncompiled, _Compiler, compiled, same
from jupyter_agent_tools.schemas import REF, SCHEMAS
from jupyter_agent_tools.validation import _validator, check

pytestmark = pytest.mark.quick

ODD_VALUES: list[Any] = [
    None, True, False, 0, 1, -1, 1.0, 1.5, 600, 601, 1e400, math.nan, "", "a", "x" * 70, "a\x00b",
    "default", "cell-1", "nb.ipynb", ".hidden", "sub/dir", "*.py", "1", [], [1], ["a"], {}, {"a": 1},
]  # fmt: skip
STRINGS = ["a", "default", "cell-1", "nb.ipynb", "sub/dir/x.py", "A_B", "x" * 64, "", "0", "*.ipynb"]


def _generate(schema: Any, rng: random.Random, depth: int = 0) -> Any:
    """A body shaped by ``schema``; valid more often than not (patterns are met by chance)."""
    if schema is True or not isinstance(schema, dict) or depth > 6:
        return rng.choice(ODD_VALUES)
    if "$ref" in schema:
        return _generate(SCHEMAS[schema["$ref"].removeprefix(REF)], rng, depth + 1)
    for key in ("oneOf", "anyOf", "allOf"):
        if key in schema:
            return _generate(rng.choice(schema[key]), rng, depth + 1)
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return rng.choice(schema["enum"])
    kind = schema.get("type", "object" if "properties" in schema else "string")
    if isinstance(kind, list):
        kind = rng.choice(kind)
    if kind == "object":
        properties = schema.get("properties", {})
        out = {}
        for key, sub in properties.items():
            if key in schema.get("required", []) or rng.random() < 0.4:
                out[key] = _generate(sub, rng, depth + 1)
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict) and rng.random() < 0.5:
            out[rng.choice(["NAME", "a_b", "1bad"])] = _generate(extra, rng, depth + 1)
        return out
    if kind == "array":
        least = schema.get("minItems", 0)
        count = rng.randint(least, max(least, min(schema.get("maxItems", 3), least + 2)))
        return [_generate(schema.get("items", True), rng, depth + 1) for _ in range(count)]
    if kind == "string":
        if "maxLength" in schema and rng.random() < 0.3:  # at the limit, or one past it
            return "x" * (schema["maxLength"] + rng.choice([0, 1]))
        return rng.choice(STRINGS)
    if kind == "integer":
        return rng.choice([0, 1, 2, 5, 30, schema.get("minimum", 0), schema.get("maximum", 7)])
    if kind == "number":
        return rng.choice([0.5, 1, 30, 600.0, schema.get("minimum", 2), schema.get("maximum", 3)])
    if kind == "boolean":
        return rng.choice([True, False])
    return None


def _mutate(value: Any, rng: random.Random) -> Any:
    """``value`` with one thing changed somewhere in it."""
    if isinstance(value, dict) and value and rng.random() < 0.7:
        key = rng.choice(list(value))
        what = rng.random()
        if what < 0.25:
            return {k: v for k, v in value.items() if k != key}
        if what < 0.4:
            return {**value, rng.choice(["colour", "extra", "$x"]): 1}
        return {**value, key: _mutate(value[key], rng)}
    if isinstance(value, list) and value and rng.random() < 0.7:
        if rng.random() < 0.2:
            return []
        position = rng.randrange(len(value))
        return [*value[:position], _mutate(value[position], rng), *value[position + 1 :]]
    if value is True and rng.random() < 0.5:
        return 1
    if isinstance(value, int) and not isinstance(value, bool) and rng.random() < 0.5:
        return rng.choice([float(value), True, -value - 1, value + 10**6])
    return rng.choice(ODD_VALUES)


def _reference(name: str, instance: Any) -> bool:
    return bool(_validator(name).is_valid(instance))


@pytest.mark.parametrize("seed", range(2))
def test_compiled_checks_answer_as_jsonschema_does(seed: int) -> None:
    rng = random.Random(seed)
    agreed = valid = 0
    for name, schema in sorted(SCHEMAS.items()):
        fast = compiled(name)
        for _ in range(30):
            body = _generate(schema, rng)
            for instance in (body, _mutate(copy.deepcopy(body), rng)):
                expected = _reference(name, instance)
                assert fast(instance) is expected, (name, instance)
                agreed += 1
                valid += expected
    # the generated bodies exercise both answers, not just one
    assert 0.2 < valid / agreed < 0.9, (valid, agreed)


def test_every_published_schema_compiles() -> None:
    """A keyword the compiler does not know would silently cost every request jsonschema's walk."""
    for name in SCHEMAS:
        compiled(name)


def test_an_unknown_keyword_is_not_compiled_and_jsonschema_decides(monkeypatch: pytest.MonkeyPatch) -> None:
    from jupyter_agent_tools import validation

    schemas = {**SCHEMAS, "Odd": {"type": "string", "contentEncoding": "base64"}}
    monkeypatch.setattr("jupyter_agent_tools.schema_compile.SCHEMAS", schemas)
    compiled.cache_clear()
    try:
        with pytest.raises(Uncompiled, match="contentEncoding"):
            compiled("Odd")
    finally:
        compiled.cache_clear()
    monkeypatch.setattr(validation, "_compiled", lambda name: None)
    check("EvalRequest", {"cells": [{"code": "1"}]})  # jsonschema alone: valid, no 400
    with pytest.raises(Exception, match="cells"):
        check("EvalRequest", {"cells": []})


def test_same_is_json_equality() -> None:
    assert same(1, 1.0) and same([1, {"a": "b"}], [1.0, {"a": "b"}])
    assert not same(True, 1) and not same(1, True) and not same([True], [1]) and not same("1", 1)
    assert not same({"a": 1}, {"a": 1, "b": 2}) and same(None, None) and not same(None, False)


def test_enum_and_const_tell_booleans_from_numbers() -> None:
    """As jsonschema: ``True`` is not ``1`` (no published enum holds a number, so generated bodies cannot
    show it)."""
    enum, const = _Compiler().schema({"enum": [1, "a"]}), _Compiler().schema({"const": 1})
    assert enum(1) and enum(1.0) and enum("a") and not enum(True) and not enum("1")
    assert const(1) and const(1.0) and not const(True)
    assert not _Compiler().schema({"enum": [True]})(1)

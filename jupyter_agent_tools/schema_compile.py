"""The published schemas compiled into plain Python checks: is a body valid, yes or no (pure: no I/O).

:mod:`.validation` validates with jsonschema, which also finds the error to report; its walk costs a
fifth of a millisecond per eval body on the server (registry lookups, an iterator per keyword), on the
path of every request. A valid body, nearly every one, needs only the yes: :func:`compiled` turns a
schema into nested closures that answer it in microseconds, with jsonschema's semantics as
:mod:`.validation` configures them (Draft 2020-12: ``$ref`` beside other keywords applies both; an
integer is an ``int`` and not a ``bool``; ``enum`` tells ``True`` from ``1``; ``format`` is an
annotation; a ``oneOf`` with a discriminator checks the branch the discriminator names). A body it
refuses goes to jsonschema for the message, so only the yes must agree, and ``tests/test_schema_compile.py``
holds both to the same answers on generated bodies. A keyword it does not know makes the schema
uncompilable (:class:`Uncompiled`): jsonschema alone decides then.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any

from .schemas import REF, SCHEMAS

Check = Callable[[Any], bool]

# Keywords that say nothing about validity (annotations, and OpenAPI's and this project's extensions).
_ANNOTATIONS = frozenset(
    {"description", "title", "default", "examples", "format", "x-errors", "discriminator", "deprecated"}
)
_TYPES: dict[str, Check] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}


class Uncompiled(Exception):
    """A schema uses a keyword (or form) this module does not compile."""


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def same(a: Any, b: Any) -> bool:
    """JSON equality as jsonschema's ``const`` and ``uniqueItems`` see it: ``True`` is not ``1``."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if _is_number(a) and _is_number(b):
        return bool(a == b)
    return type(a) is type(b) and a == b


@functools.cache
def compiled(name: str) -> Check:
    """The check of the component schema ``name``; :class:`Uncompiled` if it cannot be compiled."""
    return _Compiler().component(name)


class _Compiler:
    def __init__(self) -> None:
        self._components: dict[str, Check] = {}

    def component(self, name: str) -> Check:
        if name not in self._components:
            slot: list[Check] = []
            self._components[name] = lambda v: slot[0](v)  # a schema may refer to itself
            slot.append(self.schema(SCHEMAS[name]))
            self._components[name] = slot[0]
        return self._components[name]

    def schema(self, schema: Any) -> Check:
        if schema is True or schema == {}:
            return lambda v: True
        if schema is False:
            return lambda v: False
        if not isinstance(schema, dict):
            raise Uncompiled(f"schema {schema!r}")
        checks: list[Check] = []
        for keyword, value in schema.items():
            if keyword in _ANNOTATIONS:
                continue
            if keyword == "oneOf" and "discriminator" in schema:
                checks.append(self._discriminated(value, schema["discriminator"]))
                continue
            build = getattr(self, "_" + keyword.replace("$", "dollar_"), None)
            if build is None:
                raise Uncompiled(f"keyword {keyword!r}")
            checks.append(build(value, schema))
        if not checks:
            return lambda v: True
        if len(checks) == 1:
            return checks[0]
        return lambda v: all(check(v) for check in checks)

    # -- keywords (each: the value of the keyword, the schema it is in)

    def _dollar_ref(self, ref: str, _: dict[str, Any]) -> Check:
        if not ref.startswith(REF):
            raise Uncompiled(f"$ref {ref!r}")
        name = ref.removeprefix(REF)
        if name not in SCHEMAS:
            raise Uncompiled(f"$ref {ref!r}")
        return self.component(name)  # while ``name`` compiles: the slot that calls it once it has

    def _type(self, types: Any, _: dict[str, Any]) -> Check:
        names = [types] if isinstance(types, str) else list(types)
        if any(t not in _TYPES for t in names):
            raise Uncompiled(f"type {types!r}")
        tests = [_TYPES[t] for t in names]
        if len(tests) == 1:
            return tests[0]
        return lambda v: any(test(v) for test in tests)

    def _properties(self, properties: dict[str, Any], _: dict[str, Any]) -> Check:
        checks = {key: self.schema(sub) for key, sub in properties.items()}

        def check(v: Any) -> bool:
            if not isinstance(v, dict):
                return True
            return all(sub(v[key]) for key, sub in checks.items() if key in v)

        return check

    def _required(self, required: list[str], _: dict[str, Any]) -> Check:
        return lambda v: not isinstance(v, dict) or all(key in v for key in required)

    def _additionalProperties(self, allowed: Any, schema: dict[str, Any]) -> Check:
        known = frozenset(schema.get("properties", {}))
        patterns = [re.compile(p) for p in schema.get("patternProperties", {})]
        if allowed is True:
            return lambda v: True
        each = self.schema(allowed)

        def check(v: Any) -> bool:
            if not isinstance(v, dict):
                return True
            return all(
                each(value)
                for key, value in v.items()
                if key not in known and not any(p.search(key) for p in patterns)
            )

        return check

    def _patternProperties(self, patterns: dict[str, Any], _: dict[str, Any]) -> Check:
        checks = [(re.compile(p), self.schema(sub)) for p, sub in patterns.items()]

        def check(v: Any) -> bool:
            if not isinstance(v, dict):
                return True
            return all(c(value) for key, value in v.items() for p, c in checks if p.search(key))

        return check

    def _propertyNames(self, names: Any, _: dict[str, Any]) -> Check:
        each = self.schema(names)
        return lambda v: not isinstance(v, dict) or all(each(key) for key in v)

    def _maxProperties(self, most: int, _: dict[str, Any]) -> Check:
        return lambda v: not isinstance(v, dict) or len(v) <= most

    def _items(self, items: Any, _: dict[str, Any]) -> Check:
        if isinstance(items, list):
            raise Uncompiled("items as an array")
        each = self.schema(items)
        return lambda v: not isinstance(v, list) or all(each(item) for item in v)

    def _minItems(self, least: int, _: dict[str, Any]) -> Check:
        return lambda v: not isinstance(v, list) or len(v) >= least

    def _maxItems(self, most: int, _: dict[str, Any]) -> Check:
        return lambda v: not isinstance(v, list) or len(v) <= most

    def _uniqueItems(self, unique: bool, _: dict[str, Any]) -> Check:
        if not unique:
            return lambda v: True

        def check(v: Any) -> bool:
            if not isinstance(v, list):
                return True
            if all(isinstance(item, str) for item in v):
                return len(set(v)) == len(v)
            return not any(same(a, b) for i, a in enumerate(v) for b in v[i + 1 :])

        return check

    def _minLength(self, least: int, _: dict[str, Any]) -> Check:
        return lambda v: not isinstance(v, str) or len(v) >= least

    def _maxLength(self, most: int, _: dict[str, Any]) -> Check:
        return lambda v: not isinstance(v, str) or len(v) <= most

    def _pattern(self, pattern: str, _: dict[str, Any]) -> Check:
        compiled_pattern = re.compile(pattern)
        return lambda v: not isinstance(v, str) or compiled_pattern.search(v) is not None

    def _enum(self, values: list[Any], _: dict[str, Any]) -> Check:
        return lambda v: any(e == v and isinstance(e, bool) == isinstance(v, bool) for e in values)

    def _const(self, value: Any, _: dict[str, Any]) -> Check:
        return lambda v: same(v, value)

    # As jsonschema compares (a NaN passes each: no comparison with it is true).
    def _minimum(self, least: float, _: dict[str, Any]) -> Check:
        return lambda v: not _is_number(v) or not v < least

    def _maximum(self, most: float, _: dict[str, Any]) -> Check:
        return lambda v: not _is_number(v) or not v > most

    def _exclusiveMinimum(self, least: float, _: dict[str, Any]) -> Check:
        return lambda v: not _is_number(v) or not v <= least

    def _anyOf(self, subschemas: list[Any], _: dict[str, Any]) -> Check:
        checks = [self.schema(sub) for sub in subschemas]
        return lambda v: any(check(v) for check in checks)

    def _allOf(self, subschemas: list[Any], _: dict[str, Any]) -> Check:
        checks = [self.schema(sub) for sub in subschemas]
        return lambda v: all(check(v) for check in checks)

    def _oneOf(self, subschemas: list[Any], _: dict[str, Any]) -> Check:
        checks = [self.schema(sub) for sub in subschemas]

        return lambda v: sum(1 for check in checks if check(v)) == 1

    def _discriminated(self, subschemas: list[Any], discriminator: dict[str, Any]) -> Check:
        """:func:`.validation._one_of` with a discriminator: the branch its value names, else invalid."""
        prop, mapping = discriminator["propertyName"], discriminator["mapping"]
        branches: dict[str, Check] = {}
        for value, target in mapping.items():
            if {"$ref": target} in subschemas:
                branches[value] = self.schema({"$ref": target})

        def check(v: Any) -> bool:
            value = v.get(prop) if isinstance(v, dict) else None
            branch = branches.get(value) if isinstance(value, str) else None
            return branch is not None and branch(v)

        return check

    def _not(self, sub: Any, _: dict[str, Any]) -> Check:
        check = self.schema(sub)
        return lambda v: not check(v)

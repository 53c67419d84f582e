"""Validate request bodies against the published schemas, with a 400 message that names the field.

The schemas are those of :mod:`jupyter_agent_tools.schemas`, exactly as the OpenAPI document publishes
them; :mod:`jsonschema` (Draft 2020-12) does the checking. What this module adds is the message: of all
the errors a body has, the one closest to the top of the body is reported, in words that say what to fix
(``ops[1]: Content is required for edit action``, ``'cells[0]' ...``, ``unknown field 'colour' ...``).

A ``oneOf`` with an OpenAPI ``discriminator`` is followed by the discriminator's value, so the message is
about the branch the caller meant (the ``edit`` operation) rather than about all of them. Pure: no I/O.
"""

from __future__ import annotations

import functools
import itertools
import re
import reprlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import ValidationError
from referencing import Registry
from referencing.jsonschema import DRAFT202012

from .errors import BadRequest
from .schema_compile import Check, Uncompiled, compiled
from .schemas import REF, SCHEMAS

BASE_URI = "urn:jupyter-agent-tools:openapi"
_Errors = Iterator[ValidationError]


# The keywords below replace jsonschema's own, whose messages hold the repr() of the whole failing value
# (a 10 MB body made seconds of repr on the event loop). Only the message text differs, and this module
# builds its own messages; oneOf also follows an OpenAPI discriminator (see _one_of).


def _type(validator: Any, types: Any, instance: Any, schema: dict[str, Any]) -> _Errors:
    types = [types] if isinstance(types, str) else types
    if not any(validator.is_type(instance, kind) for kind in types):
        yield ValidationError(f"{short_repr(instance)} is not of type {', '.join(map(repr, types))}")


def _enum(validator: Any, enums: Any, instance: Any, schema: dict[str, Any]) -> _Errors:
    if not any(each == instance and isinstance(each, bool) == isinstance(instance, bool) for each in enums):
        yield ValidationError(f"{short_repr(instance)} is not one of {enums!r}")


def _pattern(validator: Any, pattern: str, instance: Any, schema: dict[str, Any]) -> _Errors:
    if validator.is_type(instance, "string") and not re.search(pattern, instance):
        yield ValidationError(f"{short_repr(instance)} does not match {pattern!r}")


def _max_properties(validator: Any, most: int, instance: Any, schema: dict[str, Any]) -> _Errors:
    if validator.is_type(instance, "object") and len(instance) > most:
        yield ValidationError(f"has {len(instance)} properties (at most {most})")


def _additional_properties(validator: Any, allowed: Any, instance: Any, schema: dict[str, Any]) -> _Errors:
    if not validator.is_type(instance, "object") or allowed is True:
        return
    known = schema.get("properties", {})
    patterns = schema.get("patternProperties", {})
    extras = (k for k in instance if k not in known and not any(re.search(p, k) for p in patterns))
    if validator.is_type(allowed, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], allowed, path=extra)
    else:
        extra = next(extras, None)
        if extra is not None:
            yield ValidationError(
                f"Additional properties are not allowed ({short_repr(extra)} was unexpected)"
            )


def _any_of(validator: Any, subschemas: Any, instance: Any, schema: dict[str, Any]) -> _Errors:
    errors: list[ValidationError] = []
    for index, subschema in enumerate(subschemas):
        found = list(validator.descend(instance, subschema, schema_path=index))
        if not found:
            return
        errors.extend(found)
    yield ValidationError(
        f"{short_repr(instance)} is not valid under any of the given schemas", context=errors
    )


def _one_of(validator: Any, subschemas: Any, instance: Any, schema: dict[str, Any]) -> _Errors:
    """``oneOf``; with an OpenAPI discriminator, only the branch its value names is checked.

    The same answer as checking them all, because every discriminated branch here is an object that
    requires the discriminator property with its own ``const`` (tests/test_contract.py checks it). For
    a batch that is one branch per operation instead of four, and nothing for an operation whose
    ``action`` names no branch.
    """
    discriminator = schema.get("discriminator")
    if discriminator is not None:
        value = instance.get(discriminator["propertyName"]) if isinstance(instance, dict) else None
        target = discriminator["mapping"].get(value) if isinstance(value, str) else None
        index = next((i for i, sub in enumerate(subschemas) if sub == {"$ref": target}), None)
        errors = (
            [] if index is None else list(validator.descend(instance, subschemas[index], schema_path=index))
        )
        if index is None or errors:
            yield ValidationError(
                f"{short_repr(instance)} is not valid under any of the given schemas", context=errors
            )
        return
    valid = []
    errors = []
    for index, subschema in enumerate(subschemas):
        found = list(validator.descend(instance, subschema, schema_path=index))
        if found:
            errors.extend(found)
        else:
            valid.append(index)
    if not valid:
        yield ValidationError(
            f"{short_repr(instance)} is not valid under any of the given schemas", context=errors
        )
    elif len(valid) > 1:
        yield ValidationError(f"{short_repr(instance)} is valid under more than one of the given schemas")


# An integer is a JSON number written as one: 1, not 1.0 (JSON Schema would accept 1.0; the API does not,
# as the document's description says).
_Validator = validators.extend(
    Draft202012Validator,
    validators={
        "type": _type,
        "enum": _enum,
        "pattern": _pattern,
        "maxProperties": _max_properties,
        "additionalProperties": _additional_properties,
        "anyOf": _any_of,
        "oneOf": _one_of,
    },
    type_checker=Draft202012Validator.TYPE_CHECKER.redefine(
        "integer", lambda _checker, value: isinstance(value, int) and not isinstance(value, bool)
    ),
)
_REGISTRY: Registry[Any] = Registry().with_resource(
    BASE_URI, DRAFT202012.create_resource({"components": {"schemas": SCHEMAS}})
)
_TYPE_WORDS = {
    "integer": "an integer",
    "number": "a number",
    "string": "a string",
    "boolean": "a boolean",
    "object": "an object",
    "array": "an array",
    "null": "null",
}
# Errors nearer the top of the body win; at one depth, this order (then the schema's own order).
_RANK = {
    "type": 0,
    "oneOf": 1,
    "additionalProperties": 2,
    "required": 3,
    "anyOf": 4,
    "const": 5,
    "enum": 6,
    "minItems": 7,
    "pattern": 8,
}


@functools.cache
def _validator(name: str) -> Any:
    return _Validator({"$ref": f"{BASE_URI}{REF}{name}"}, registry=_REGISTRY)


def _resolve(schema: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        schema = SCHEMAS[schema["$ref"].removeprefix(REF)]
    return schema


class _ShortRepr(reprlib.Repr):
    def repr_dict(self, x: dict[Any, Any], level: int) -> str:
        # reprlib sorts all the keys first: seconds for an object of a million keys.
        if not x or level <= 0:
            return "{...}" if x else "{}"
        items = itertools.islice(x.items(), self.maxdict)
        pieces = [f"{self.repr1(k, level - 1)}: {self.repr1(v, level - 1)}" for k, v in items]
        if len(x) > self.maxdict:
            pieces.append("...")  # reprlib.Repr.fillvalue only exists from Python 3.12
        return "{" + ", ".join(pieces) + "}"


_SHORT = _ShortRepr()
_SHORT.maxlevel, _SHORT.maxstring, _SHORT.maxother, _SHORT.maxlist, _SHORT.maxdict = 2, 80, 80, 4, 4


def short_repr(value: Any) -> str:
    """``repr`` of a caller's value, kept short (a message must not echo a megabyte back)."""
    return _SHORT.repr(value)


def json_type(value: Any) -> str:
    """The type of a JSON value as a Python programmer names it (``int``, ``str``, ``list``...)."""
    return "null" if value is None else type(value).__name__


@functools.cache
def _compiled(name: str) -> Check | None:
    try:
        return compiled(name)
    except Uncompiled:
        return None


def _passes(name: str, instance: Any) -> bool:
    """The compiled check's yes (:mod:`.schema_compile`): microseconds, for nearly every body."""
    quick = _compiled(name)
    return quick is not None and quick(instance)


def check(name: str, instance: Any) -> None:
    """Raise :class:`BadRequest` naming the first problem unless ``instance`` is valid against ``name``."""
    if _passes(name, instance):
        return
    message = first_error(name, instance)
    if message is not None:
        raise BadRequest(message)


def first_error(name: str, instance: Any) -> str | None:
    """The message for the most relevant error of ``instance`` against component ``name`` (None: valid)."""
    return _first_error(ref_schema(name), instance, (), None)


def ref_schema(name: str) -> dict[str, Any]:
    return {"$ref": REF + name}


@dataclass(frozen=True)
class _Branch:
    """Where a discriminator led: its property, the value, and the properties of every branch."""

    prop: str
    value: str
    branches: dict[str, frozenset[str]]


def _first_error(
    schema: dict[str, Any], instance: Any, path: tuple[str | int, ...], branch: _Branch | None
) -> str | None:
    if "$ref" in schema and len(schema) == 1:
        name = schema["$ref"].removeprefix(REF)
        target = SCHEMAS[name]
        if "discriminator" in target:
            return _dispatch(target, instance, path)
        errors = list(_validator(name).iter_errors(instance))
    else:
        target = _resolve(schema)
        if "discriminator" in target:
            return _dispatch(target, instance, path)
        errors = list(_Validator(schema, registry=_REGISTRY).iter_errors(instance))
    if not errors:
        return None
    error = min(
        enumerate(errors),
        key=lambda item: (len(item[1].absolute_path), _RANK.get(str(item[1].validator), 9), item[0]),
    )[1]
    where = path + tuple(error.absolute_path)
    if error.validator in ("oneOf", "anyOf") and "discriminator" in error.schema:
        return _dispatch(error.schema, error.instance, where)
    return _message(error, where, branch)


def _dispatch(schema: dict[str, Any], instance: Any, path: tuple[str | int, ...]) -> str | None:
    """Follow an OpenAPI discriminator to the branch the caller meant and validate against it."""
    discriminator = schema["discriminator"]
    prop: str = discriminator["propertyName"]
    mapping: dict[str, str] = discriminator["mapping"]
    loc, _ = _split(path)
    if not isinstance(instance, dict):
        template = schema.get("x-errors", {}).get("type")
        text = _fill(template, value=instance) if template else _type_message("", loc, "object", instance)
        return _located(loc, text)
    choices = ", ".join(mapping)
    if prop not in instance:
        return _located(loc, f"'{prop}' is required (one of: {choices})")
    value = instance[prop]
    if not isinstance(value, str) or value not in mapping:
        return _located(loc, f"unknown {prop} {short_repr(value)} (expected one of: {choices})")
    branches = {
        key: frozenset(SCHEMAS[target.removeprefix(REF)].get("properties", {}))
        for key, target in mapping.items()
    }
    return _first_error({"$ref": mapping[value]}, instance, path, _Branch(prop, value, branches))


def _split(path: Sequence[str | int]) -> tuple[str, tuple[str, ...]]:
    """``("ops", 1, "cell_index")`` -> (``"ops[1]"``, ``("cell_index",)``): the array element, the rest."""
    last = max((i for i, part in enumerate(path) if isinstance(part, int)), default=-1)
    loc = ""
    for part in path[: last + 1]:
        loc += f"[{part}]" if isinstance(part, int) else (f".{part}" if loc else str(part))
    return loc, tuple(_short_name(str(part)) for part in path[last + 1 :])


def _short_name(name: str) -> str:
    return name if len(name) <= 80 else name[:77] + "..."


def _located(loc: str, text: str) -> str:
    return f"{loc}: {text}" if loc else text


def _fill(template: str, **values: Any) -> str:
    """Fill ``{name}``, ``{name!r}``, ``{value!r}``, ``{got}``, ``{action}``; other braces stay."""
    out = template
    for key, value in values.items():
        # Only the placeholders present: str() of a megabyte value costs as much as it sounds.
        if f"{{{key}!r}}" in out:
            out = out.replace(f"{{{key}!r}}", short_repr(value))
        if f"{{{key}}}" in out:
            out = out.replace(f"{{{key}}}", str(value))
    if "value" in values:
        out = out.replace("{got}", json_type(values["value"]))
    return out


def _type_message(name: str, loc: str, expected: Any, value: Any) -> str:
    types = [expected] if isinstance(expected, str) else [t for t in expected if t != "null"] or ["null"]
    words = " or ".join(_TYPE_WORDS.get(t, t) for t in types)
    subject = f"'{name}'" if name else ("" if loc else "Request body")
    return f"{subject} must be {words}, got {json_type(value)}".strip()


def _message(error: ValidationError, path: tuple[str | int, ...], branch: _Branch | None) -> str:
    keyword = str(error.validator)
    schema: dict[str, Any] = error.schema if isinstance(error.schema, dict) else {}
    custom: dict[str, str] = schema.get("x-errors", {})
    action = branch.value if branch else ""
    loc, rel = _split(path)
    value = error.instance
    name = ".".join(rel)

    def field_name(field: str) -> str:
        return ".".join((*rel, field))

    if keyword == "required":
        missing = [f for f in error.validator_value if not (isinstance(value, dict) and f in value)]
        field = missing[0] if missing else ""
        prop_errors = schema.get("properties", {}).get(field, {}).get("x-errors", {})
        template = prop_errors.get("required") or custom.get("required")
        if template:
            return _located(loc, _fill(template, name=field_name(field), action=action))
        suffix = f" for {action} action" if action else ""
        return _located(loc, f"'{field_name(field)}' is required{suffix}")
    if keyword == "additionalProperties":
        allowed = list(schema.get("properties", {}))
        field = min((k for k in value if k not in allowed), default="?") if isinstance(value, dict) else "?"
        if "additionalProperties" in custom:
            return _located(loc, _fill(custom["additionalProperties"], name=field_name(field)))
        if branch is not None:
            users = [key for key, props in branch.branches.items() if field in props]
            if len(users) == 1:
                return _located(loc, f"'{field}' is only used by the {users[0]} action")
            if users:
                return _located(loc, f"'{field}' is not used by the {action} action")
        return _located(loc, f"unknown field {short_repr(field_name(field))} (allowed: {', '.join(allowed)})")
    if keyword == "anyOf" and all(set(sub) == {"required"} for sub in error.validator_value):
        fields = " or ".join(f"'{field_name(sub['required'][0])}'" for sub in error.validator_value)
        suffix = f" for {action} action" if action else ""
        return _located(loc, f"{fields} is required{suffix}")
    if keyword in custom:
        return _located(loc, _fill(custom[keyword], name=name, value=value, action=action))
    if keyword == "type":
        return _located(loc, _type_message(name, loc, error.validator_value, value))
    if keyword == "enum":
        choices = ", ".join(str(c) for c in error.validator_value)
        return _located(loc, f"unknown {name or 'value'} {short_repr(value)} (expected one of: {choices})")
    if keyword == "const":
        return _located(loc, f"'{name}' must be {error.validator_value!r}, got {short_repr(value)}")
    if keyword == "minItems":
        return _located(loc, f"'{name}' must have at least {error.validator_value} item(s)")
    subject = f"'{name}'" if name else "Request body"
    return _located(loc, f"{subject}: {error.message}")

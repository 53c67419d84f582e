"""Tool input and output schemas derived from the routes' JSON Schemas (:mod:`jupyter_agent_tools.schemas`).

MCP clients want self-contained schemas: every ``$ref`` is replaced by the schema it names, and the
OpenAPI-only keywords (``discriminator``, ``x-*``) are dropped, since validators ignore them and some model
APIs refuse unknown keywords. Pure: no I/O.
"""

from __future__ import annotations

import copy
from typing import Any

from ..schemas import REF, SCHEMAS


def inline(schema: Any) -> Any:
    """``schema`` with every ``$ref`` to a component replaced by (a copy of) that component."""
    return _inline(schema, ())


def _inline(schema: Any, seen: tuple[str, ...]) -> Any:
    if isinstance(schema, list):
        return [_inline(item, seen) for item in schema]
    if not isinstance(schema, dict):
        return copy.deepcopy(schema)
    out: dict[str, Any] = {}
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith(REF):
        name = ref.removeprefix(REF)
        if name in seen:
            raise ValueError(f"recursive schema {name!r} cannot be inlined")
        out.update(_inline(SCHEMAS[name], (*seen, name)))
    for key, value in schema.items():
        if key == "$ref" or key == "discriminator" or key.startswith("x-"):
            continue
        out[key] = _inline(value, seen)
    return out


def component(name: str) -> dict[str, Any]:
    """The route schema ``name`` (a key of ``SCHEMAS``), self-contained."""
    result: dict[str, Any] = inline({"$ref": REF + name})
    return result


def field(schema_name: str, prop: str) -> dict[str, Any]:
    """One property of a route schema, self-contained (e.g. ``field("EvalRequest", "session")``)."""
    result: dict[str, Any] = inline(SCHEMAS[schema_name]["properties"][prop])
    return result


def without_image_data(schema: Any) -> Any:
    """An answer schema in which image displays carry ``bytes`` instead of their base64 ``data``.

    Tool results send images as MCP image content (when asked), never as base64 inside the structured
    answer a client may put in a model's context.
    """
    if isinstance(schema, list):
        return [without_image_data(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: without_image_data(value) for key, value in schema.items()}
    props = out.get("properties")
    if isinstance(props, dict) and props.get("type", {}).get("const") == "image" and "data" in props:
        props = dict(props)
        props.pop("data")
        props["bytes"] = {"type": "integer", "description": "size of the image (decoded)"}
        out["properties"] = props
        out["required"] = [name for name in out.get("required", []) if name != "data"]
        out.pop("oneOf", None)  # "data or a placeholder": here it is bytes, or a placeholder as it was
    return out


def without_null(schema: Any) -> Any:
    """An input schema in which ``"type": [T, "null"]`` is ``"type": T``.

    The routes take ``null`` for "not given", so leaving a field out means the same; a single type is
    what the model APIs that map tool schemas onto one-type dialects (Gemini's) can express.
    """
    if isinstance(schema, list):
        return [without_null(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: without_null(value) for key, value in schema.items()}
    kind = out.get("type")
    if isinstance(kind, list) and "null" in kind and len(kind) == 2:
        out["type"] = next(t for t in kind if t != "null")
    return out


def portable(schema: Any) -> Any:
    """``schema`` with every ``"type": [T1, T2]`` spelled as ``"anyOf": [{"type": T1}, {"type": T2}]``.

    The same values pass, but a client that maps tool schemas onto a one-type dialect (the OpenAPI subset
    of Gemini's function declarations) keeps the constraint; the MCP Inspector warns about type arrays.
    """
    if isinstance(schema, list):
        return [portable(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: portable(value) for key, value in schema.items()}
    kinds = out.get("type")
    if isinstance(kinds, list) and all(isinstance(kind, str) for kind in kinds):
        branches = [{"type": kind} for kind in out.pop("type")]
        if "anyOf" in out:
            out["allOf"] = [*out.get("allOf", []), {"anyOf": branches}]
        else:
            out["anyOf"] = branches
    return out

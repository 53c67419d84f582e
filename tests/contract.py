"""Check answers against the OpenAPI document, with a plain JSON Schema 2020-12 validator.

Independent of the package's own validation code: the document is read as any client would read it.
"""

from __future__ import annotations

from typing import Any

from jsonschema import Draft202012Validator
from referencing import Registry
from referencing.jsonschema import DRAFT202012

URI = "urn:test:openapi"
JSON = "application/json"
NDJSON = "application/x-ndjson"


def _pointer(*parts: str) -> str:
    return "".join("/" + p.replace("~", "~0").replace("/", "~1") for p in parts)


class Contract:
    """An OpenAPI document and validators for its request and answer schemas."""

    def __init__(self, doc: dict[str, Any]):
        self.doc = doc
        self.registry: Registry[Any] = Registry().with_resource(URI, DRAFT202012.create_resource(doc))

    def validator(self, pointer: str) -> Draft202012Validator:
        return Draft202012Validator({"$ref": f"{URI}#{pointer}"}, registry=self.registry)

    def component(self, name: str) -> Draft202012Validator:
        return self.validator(_pointer("components", "schemas", name))

    def response_errors(
        self, method: str, path: str, status: int, body: Any, content_type: str = JSON
    ) -> list[str]:
        """Why ``body`` is not a documented answer of ``method path`` with ``status`` ([] if it is)."""
        operation = self.doc["paths"][path][method.lower()]
        response = operation["responses"].get(str(status))
        if response is None:
            return [f"{method} {path}: status {status} is not documented"]
        content = response.get("content")
        if content is None:
            return [] if body in (None, b"", "") else [f"{method} {path} {status}: documented without body"]
        if content_type not in content:
            return [f"{method} {path} {status}: content type {content_type} is not documented"]
        pointer = _pointer("paths", path, method.lower(), "responses", str(status), "content", content_type)
        validator = self.validator(pointer + "/schema")
        return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(body)]

    def assert_response(
        self, method: str, path: str, status: int, body: Any, content_type: str = JSON
    ) -> None:
        errors = self.response_errors(method, path, status, body, content_type)
        assert not errors, f"{method} {path} -> {status} does not conform: {errors[:5]}\nbody: {body!r:.2000}"

    def request_valid(self, method: str, path: str, body: Any) -> bool:
        pointer = _pointer("paths", path, method.lower(), "requestBody", "content", JSON, "schema")
        return bool(self.validator(pointer).is_valid(body))

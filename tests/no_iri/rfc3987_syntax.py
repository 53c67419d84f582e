"""Stands in for the optional package ``rfc3987_syntax`` in the tests' processes (see tests/conftest.py):
jsonschema then runs as it does without it, its "iri" formats unchecked."""

raise ImportError("rfc3987_syntax is off in the tests (tests/conftest.py)")

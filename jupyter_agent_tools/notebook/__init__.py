"""Notebook editing: pure cell operations, serialization, read summaries and the store."""

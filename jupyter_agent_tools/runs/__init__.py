"""Detached runs: evals and notebook runs that outlive their connection (issue 30)."""

from .registry import Run, RunRegistry, Viewer

__all__ = ["Run", "RunRegistry", "Viewer"]

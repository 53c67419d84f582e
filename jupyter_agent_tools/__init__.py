"""jupyter-agent-tools: a Jupyter Server extension where AI coding agents edit notebooks and run code."""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"


def _jupyter_server_extension_points() -> list[dict[str, Any]]:
    from .app import AgentToolsApp

    return [{"module": "jupyter_agent_tools", "app": AgentToolsApp}]

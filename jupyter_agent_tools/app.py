"""The Jupyter Server extension application: configuration traits, service wiring, shutdown."""

from __future__ import annotations

from jupyter_server.base.handlers import path_regex
from jupyter_server.extension.application import ExtensionApp
from traitlets import Int

from . import __version__
from .handlers.notebooks import NotebookHandler
from .notebook.store import NotebookStore


class AgentToolsApp(ExtensionApp):
    """Routes where AI coding agents edit notebooks and run code.

    Configure with ``c.AgentToolsApp.<trait> = value`` in ``jupyter_server_config.py``
    or ``--AgentToolsApp.<trait>=value`` on the command line.
    """

    name = "jupyter_agent_tools"
    version = __version__
    description = __doc__
    load_other_extensions = True

    summary_max_chars = Int(
        2000,
        help="Characters of each text output (stream, result, traceback) shown when an agent reads a "
        "notebook; longer text is cut with a note. 0 means no limit.",
    ).tag(config=True)

    max_ops_per_request = Int(1000, help="Most cell operations accepted in one batch edit request.").tag(
        config=True
    )

    notebook_store: NotebookStore

    def initialize_settings(self) -> None:
        assert self.serverapp is not None
        self.notebook_store = NotebookStore(
            self.serverapp.contents_manager,
            log=self.log,
            summary_max_chars=self.summary_max_chars,
            max_ops=self.max_ops_per_request,
        )

    def initialize_handlers(self) -> None:
        self.handlers.extend(
            [
                (rf"/api/agent/notebooks{path_regex}", NotebookHandler),
            ]
        )

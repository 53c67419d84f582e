"""A small typed HTTP client for the agent routes: ``AgentClient`` (blocking) and ``AsyncAgentClient``.

HTTP only: it talks to a running server through its routes and never imports the server-side code. Every
failure raises :class:`AgentAPIError` with the HTTP status (``None`` when no answer came) and the route's
message::

    with AgentClient("http://127.0.0.1:8888/", token) as client:
        result = client.eval(["x = 20", "x * 2"], session="demo")
        print(result["output"])          # "[1/2]\\n(no output)\\n\\n[2/2]\\n40"

Without ``url`` the client finds the server as ``jupyter agent`` does (``JUPYTER_AGENT_URL`` /
``JUPYTER_AGENT_TOKEN``, then the running servers jupyter_server records in its runtime directory).

One implementation: :mod:`.calls` builds each route's request from a method's arguments, :mod:`.aio`
sends it (``AsyncAgentClient``), and :mod:`.blocking` runs that same client on a loop of its own.
"""

from .aio import AsyncAgentClient
from .blocking import AgentClient
from .models import (
    AgentAPIError,
    ApprovalDenied,
    Cell,
    CellResult,
    EditAnswer,
    EvalEvent,
    EvalResult,
    NotebookAnswer,
)

__all__ = [
    "AgentAPIError",
    "AgentClient",
    "ApprovalDenied",
    "AsyncAgentClient",
    "Cell",
    "CellResult",
    "EditAnswer",
    "EvalEvent",
    "EvalResult",
    "NotebookAnswer",
]

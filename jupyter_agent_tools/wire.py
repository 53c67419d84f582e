"""Values the server and its clients (the CLI, the Python client) must agree on, in a module that imports
nothing: the CLI reads them without loading the route schemas (:mod:`jupyter_agent_tools.schemas`)."""

TOKEN_MIN_EXPIRES_IN = 60  # seconds: the shortest lifetime a token may be given
TOKEN_MAX_EXPIRES_IN = 366 * 86400
# The "reason" of a 403 that refuses an agent token's request although the token is valid: a scope it
# lacks, or something no agent token may do (a client tells these from a bad token by it).
REFUSED_MISSING_SCOPE = "Missing scope"
REFUSED_NOT_FOR_AGENTS = "Not for agent tokens"

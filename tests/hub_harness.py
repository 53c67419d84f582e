"""Test infrastructure: a real JupyterHub on 127.0.0.1 whose users' servers run this extension.

Nothing here is product code. ``running_hub()`` starts ``python -m jupyterhub`` (its proxy is the npm
package ``configurable-http-proxy``, started by the hub) with ``SimpleLocalProcessSpawner``: every
single-user server is ``python -m jupyterhub.singleuser`` with this checkout first on ``PYTHONPATH``,
the extension enabled, and its audit events written to ``events/<user>.jsonl``. A service token with
admin scopes creates users, starts their servers and makes their API tokens. On exit the users' servers
are stopped through the hub, the hub is terminated, and any process it started that is still alive
(the proxy, a server, a kernel) is killed by its pid.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import requests
import yaml
from browser import this_frontend

from jupyter_agent_tools.testing.server import PACKAGE_PARENT, free_port, on_a_free_port, wait_serving

PROXY = "configurable-http-proxy"
NO_PROXY_REASON = (
    "JupyterHub's proxy is not installed: `npm install -g configurable-http-proxy` (python3 dev.py test "
    "installs it when npm is present)"
)

HUB_CONFIG = """
c.JupyterHub.ip = "127.0.0.1"
c.JupyterHub.port = {port}
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = {hub_port}
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{proxy_api_port}"
c.JupyterHub.db_url = "sqlite:///{tmp}/jupyterhub.sqlite"
c.JupyterHub.cookie_secret_file = "{tmp}/jupyterhub_cookie_secret"
c.JupyterHub.authenticator_class = "dummy"
c.JupyterHub.allow_named_servers = True
c.JupyterHub.authenticate_prometheus = False  # the tests count the hub's API requests in its metrics
c.Authenticator.allow_all = True
c.JupyterHub.spawner_class = "simple"
c.SimpleLocalProcessSpawner.home_dir_template = "{tmp}/home/{{username}}"
c.Spawner.cmd = [{python!r}, "-m", "jupyterhub.singleuser"]
c.Spawner.args = ["--allow-root"] if {root} else []
c.Spawner.environment = {{
    "PYTHONPATH": {pythonpath!r},
    "JUPYTER_CONFIG_DIR": "{tmp}/singleuser-config",
    "AGENT_EVENTS_DIR": "{tmp}/events",
    "TMPDIR": "{tmp}/tmp",
    "JUPYTERLAB_SETTINGS_DIR": "{tmp}/lab-settings",
    **{frontend!r},
}}
# Single-user servers on ports below the range their kernels' ports come from (see free_port).
from jupyter_agent_tools.testing.server import free_port
c.Spawner.pre_spawn_hook = lambda spawner: setattr(spawner, "port", free_port())
c.Spawner.start_timeout = 120
c.Spawner.http_timeout = 120
# A single-user server with a collaborative room does not exit on the spawner's SIGINT: sqlite_anyio's (the
# Y store's) AnyIO worker thread is not a daemon and nothing stops it, so the interpreter waits for it at exit
# until the SIGTERM that follows interrupt_timeout (10 s by default; seen as "server is slow to stop"), and
# it does not end on that SIGTERM either (the server's handler only stops a loop that has stopped already):
# the SIGKILL after term_timeout (5 s) does. The server's own cleanup has run by then.
c.Spawner.interrupt_timeout = 2
c.Spawner.term_timeout = 1
c.JupyterHub.services = [
    {{"name": "tester", "api_token": "{admin_token}"}},
    # docs/admin.md's agent OAuth service: MCP clients sign in here for one user's server
    {{
        "name": "agent-oauth",
        "url": "http://127.0.0.1:{oauth_port}",
        "command": [{python!r}, "-m", "jupyter_agent_tools.hub_oauth"],
        "cwd": "{tmp}",
        "oauth_no_confirm": True,
    }},
]
c.Proxy.extra_routes = {{
    "/.well-known/oauth-authorization-server": "http://127.0.0.1:{oauth_port}",
    "/.well-known/openid-configuration": "http://127.0.0.1:{oauth_port}",
}}
c.JupyterHub.load_roles = [
    # every user may sign in at the agent OAuth service (docs/admin.md)
    {{"name": "user", "scopes": ["self", "access:services!service=agent-oauth"]}},
    {{
        "name": "tester",
        "scopes": ["admin:users", "admin:servers", "tokens", "read:users"],
        "services": ["tester"],
    }}
]
"""

# The single-user servers' own configuration: what an image for the hub would ship.
SINGLEUSER_CONFIG = """
import logging
import os

# The extension, agents as agents, the admin's defaults: docs/admin.md's z2jh values (z2jh_settings)
c.KernelPool.size = 0
named = os.environ.get("JUPYTERHUB_SERVER_NAME")
server = os.environ["JUPYTERHUB_USER"] + (f".{named}" if named else "")
events = os.path.join(os.environ["AGENT_EVENTS_DIR"], server + ".jsonl")
c.EventLogger.handlers = [logging.FileHandler(events)]
"""


def z2jh_settings() -> dict[str, Any]:
    """The single-user servers' settings of docs/admin.md's Zero to JupyterHub values (``extraFiles``), as
    the chart would mount them: the tests run the documented configuration."""
    text = (PACKAGE_PARENT / "docs" / "admin.md").read_text()
    blocks = [
        b
        for b in re.findall(r"```yaml\n(.*?)```", text, re.S)
        if "  extraFiles:\n    jupyter-agent-tools:" in b
    ]
    assert len(blocks) == 1, "docs/admin.md has one z2jh values.yaml"
    files = yaml.safe_load(blocks[0])["singleuser"]["extraFiles"]
    return dict(files["jupyter-agent-tools"]["data"])


@dataclass
class Hub:
    """A running hub: its public URL (the proxy), the admin service token, its temporary directory."""

    url: str
    admin_token: str
    tmp: Path
    process: subprocess.Popen[bytes]
    log_path: Path
    users: list[str] = field(default_factory=list)

    def api(self, method: str, path: str, body: Any = None, token: str | None = None) -> tuple[int, Any]:
        """A hub API call (``path`` under /hub/api/) with the admin token: (status, JSON or None)."""
        return request(method, f"{self.url}hub/api/{path}", body, token or self.admin_token)

    def add_user(self, name: str) -> None:
        status, answer = self.api("POST", f"users/{name}")
        assert status in (201, 409), (status, answer)
        self.users.append(name)
        (self.tmp / "home" / name).mkdir(parents=True, exist_ok=True)

    def start_servers(self, servers: list[tuple[str, str]], timeout: float = 120) -> None:
        """Start each (user, server name; '' the default) at once; return once all are ready."""
        for name, server_name in servers:
            route = f"users/{name}/servers/{server_name}" if server_name else f"users/{name}/server"
            status, answer = self.api("POST", route)
            assert status in (201, 202, 400), (status, answer)  # 400: already running
        waiting = list(servers)
        deadline = time.monotonic() + timeout
        while waiting and time.monotonic() < deadline:
            name, server_name = waiting[0]
            _, model = self.api("GET", f"users/{name}")
            if (model or {}).get("servers", {}).get(server_name, {}).get("ready"):
                waiting.pop(0)
                continue
            time.sleep(0.25)
        if waiting:
            raise AssertionError(f"servers {waiting} did not start in {timeout} s:\n{self.log()}")

    def token(self, name: str, scopes: list[str]) -> str:
        """A new API token owned by ``name`` with exactly ``scopes``."""
        status, answer = self.api("POST", f"users/{name}/tokens", {"scopes": scopes, "note": "agent test"})
        assert status == 201, (status, answer)
        return str(answer["token"])

    def server_url(self, name: str, server_name: str = "") -> str:
        return f"{self.url}user/{name}/{server_name + '/' if server_name else ''}"

    def login(self, name: str) -> tuple[requests.Session, str]:
        """``name`` logged in as a person is, through the hub's login form and its OAuth to their server:
        the browser's cookies, and the token JupyterLab's page hands its frontend (what the panel sends)."""
        browser = requests.Session()
        form = browser.get(f"{self.url}hub/login", timeout=60)
        xsrf = re.search(r'name="_xsrf" value="([^"]+)"', form.text)
        assert form.status_code == 200 and xsrf, form.text[:2000]
        answer = browser.post(
            f"{self.url}hub/login?next=",
            data={"username": name, "password": "x", "_xsrf": xsrf[1]},
            timeout=60,
        )
        assert answer.status_code == 200, answer.text[:2000]
        page = browser.get(self.server_url(name) + "lab", timeout=60)  # the OAuth redirects, followed
        config = re.search(
            r'<script id="jupyter-config-data" type="application/json">(.*?)</script>', page.text, re.S
        )
        assert page.status_code == 200 and config, (page.status_code, page.url, page.text[:2000])
        return browser, str(json.loads(config[1])["token"])

    def api_requests(self) -> int:
        """How many requests the hub's API has answered about a token's user (``GET /hub/api/user``, what
        a server asks for every token it does not know), from the hub's metrics."""
        text = requests.get(f"{self.url}hub/metrics", timeout=60).text
        counted = re.findall(
            r'^jupyterhub_request_duration_seconds_count\{[^}]*handler="jupyterhub\.apihandlers\.users\.'
            r'SelfAPIHandler"[^}]*\} ([0-9.e+]+)$',
            text,
            re.M,
        )
        assert "jupyterhub_request_duration_seconds_count" in text, text[:2000]
        return int(sum(float(n) for n in counted))

    def home(self, name: str) -> Path:
        return self.tmp / "home" / name

    def events(self, name: str) -> list[dict[str, Any]]:
        path = self.tmp / "events" / f"{name}.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-6000:]


def request(method: str, url: str, body: Any = None, token: str | None = None) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else (b"" if method in ("POST", "PUT") else None)
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"token {token}"
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=120) as response:
            status, text = response.status, response.read().decode()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read().decode(errors="replace")
    try:
        return status, json.loads(text) if text else None
    except ValueError:
        return status, text


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


@contextlib.contextmanager
def running_hub(tmp: Path, startup_timeout: float = 90) -> Iterator[Hub]:
    """Start the hub in ``tmp``; yield it once its API answers; stop it and everything it started."""
    for sub in ("home", "events", "singleuser-config", "tmp"):
        (tmp / sub).mkdir(parents=True, exist_ok=True)
    (tmp / "singleuser-config" / "jupyter_server_config.py").write_text(SINGLEUSER_CONFIG)
    notification = tmp / "lab-settings" / "@jupyterlab" / "apputils-extension"  # no news toast (no network)
    notification.mkdir(parents=True, exist_ok=True)
    (notification / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False})
    )
    admin_token = secrets.token_hex(16)
    pythonpath = os.pathsep.join(filter(None, [str(PACKAGE_PARENT), os.environ.get("PYTHONPATH")]))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTERHUB_", "JUPYTER_AGENT_"))}
    env.update(PYTHONPATH=pythonpath, CONFIGPROXY_AUTH_TOKEN=secrets.token_hex(16))
    proxy = shutil.which(PROXY)
    assert proxy is not None, NO_PROXY_REASON
    env["PATH"] = os.pathsep.join([os.path.dirname(proxy), os.path.dirname(sys.executable), env["PATH"]])
    log_path = tmp / "hub.log"
    frontend = this_frontend(tmp)  # the users' JupyterLab loads the frontend under test

    def start(port: int) -> Hub:
        """The hub on ``port`` once its API answers; PortTaken if it or its proxy lost a port."""
        settings = z2jh_settings()  # the documented values, with this hub's URL as the OAuth issuer
        settings["HubAgentTokens"].update(  # (and the revocation list read every second, for the tests)
            issuer=f"http://127.0.0.1:{port}",
            service_url=f"http://127.0.0.1:{port}/services/agent-oauth/",
            revocation_check_interval=1.0,
        )
        (tmp / "singleuser-config" / "jupyter_server_config.json").write_text(json.dumps(settings))
        config = HUB_CONFIG.format(
            port=port,
            oauth_port=free_port(),
            hub_port=free_port(),
            proxy_api_port=free_port(),
            tmp=tmp,
            python=sys.executable,
            root=hasattr(os, "geteuid") and os.geteuid() == 0,
            pythonpath=pythonpath,
            admin_token=admin_token,
            frontend=frontend,
        )
        (tmp / "jupyterhub_config.py").write_text(config)
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "jupyterhub", "-f", str(tmp / "jupyterhub_config.py")],
                cwd=tmp,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        hub = Hub(f"http://127.0.0.1:{port}/", admin_token, tmp, process, log_path)
        wait_serving(  # PortTaken also when the proxy the hub started could not listen
            "the hub",
            process,
            lambda: hub.api("GET", "")[0],
            200,
            startup_timeout,
            lambda: _stop_hub(hub),
            hub.log,
            0.25,
        )
        return hub

    hub = on_a_free_port(start)
    try:
        yield hub
    finally:
        _stop_hub(hub)


def _stop_hub(hub: Hub) -> None:
    """Stop the users' servers, the hub, and anything it started and left behind."""
    process = hub.process
    # psutil.Process objects, not pids: kill() checks that the pid was not reused meanwhile
    started = {p.pid: p for p in _descendants(process.pid)}
    if process.poll() is None:

        def stop(name: str) -> None:
            with contextlib.suppress(OSError):
                hub.api("DELETE", f"users/{name}/server")

        with concurrent.futures.ThreadPoolExecutor(max(1, len(hub.users))) as pool:  # each waits for its stop
            list(pool.map(stop, hub.users))
    started.update({p.pid: p for p in _descendants(process.pid)})
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
    for child in started.values():  # anything the hub started and left behind
        with contextlib.suppress(psutil.Error):
            child.kill()

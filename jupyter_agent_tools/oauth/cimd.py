"""Fetching a client ID metadata document safely: https only, public addresses only (the address checked is
the one connected to), no redirects, a size and a time cap."""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any
from urllib.parse import urlsplit

from tornado.httpclient import HTTPClientError, HTTPRequest
from tornado.netutil import DefaultLoopResolver, OverrideResolver
from tornado.simple_httpclient import SimpleAsyncHTTPClient

from .core import MAX_DOCUMENT_BYTES, OAuthError, is_private_address


def _refused(url: str, why: str) -> OAuthError:
    return OAuthError("invalid_client", f"the client metadata document at {url} cannot be read: {why}", 401)


async def fetch_document(url: str, timeout: float) -> Any:
    """The JSON document at ``url`` (an https URL :func:`~.core.is_metadata_url` accepted)."""
    parts = urlsplit(url)
    host, port = parts.hostname or "", parts.port or 443
    loop = asyncio.get_running_loop()
    try:
        infos = await asyncio.wait_for(loop.getaddrinfo(host, port, type=socket.SOCK_STREAM), timeout)
    except (OSError, asyncio.TimeoutError) as e:
        raise _refused(url, f"its host does not resolve ({e})") from None
    addresses = [str(info[4][0]) for info in infos]
    if not addresses or any(is_private_address(a) for a in addresses):
        raise _refused(url, "its host is a private, loopback or link-local address")
    # connect to the address just checked (a second lookup could answer another one: DNS rebinding)
    resolver = OverrideResolver(DefaultLoopResolver(), {(host, port): (addresses[0], port)})
    client = SimpleAsyncHTTPClient(force_instance=True, resolver=resolver, max_body_size=MAX_DOCUMENT_BYTES)
    request = HTTPRequest(
        url,
        headers={"Accept": "application/json"},
        follow_redirects=False,
        connect_timeout=timeout,
        request_timeout=timeout,
        validate_cert=True,
    )
    try:
        response = await client.fetch(request)
    except HTTPClientError as e:
        raise _refused(url, f"HTTP {e.code} (redirects are not followed)") from None
    except Exception as e:
        # broad: TLS, size cap, timeout, connection: any failure to fetch is a refused client
        raise _refused(url, f"{type(e).__name__}: {e}") from None
    finally:
        client.close()
    try:
        return json.loads(response.body)
    except ValueError:
        raise _refused(url, "it is not JSON") from None

"""The request guard of slick's HTTP servers (``slick serve`` and ``slick inspect``): no web page can drive them.

Every request passes, in this order, before any handler runs or any body byte is read:

1. **Host** (DNS rebinding): the ``Host`` header names this server: ``localhost``, a loopback address
   (``127.0.0.1``, ``[::1]``), the bound ``--host``, any IP address when bound to a wildcard address (``0.0.0.0``,
   ``::``: an address cannot be re-pointed by DNS), or a name given with ``--allowed-hosts`` (``*``: any).
   Otherwise 403. A request without ``Host`` (HTTP/1.0) passes.
2. **Origin** (cross-site requests): a request that carries ``Origin`` passes only when that origin is this
   server itself (same host and port as ``Host``) or its host is one of ``--allowed-hosts``; ``Origin: null``
   never passes. A request without ``Origin`` that a browser marks ``Sec-Fetch-Site: cross-site`` or
   ``same-site`` is refused too, unless it is a plain navigation (a link the user follows). Otherwise 403.
3. **API key**: with ``api_key`` set, every route but ``open_paths`` needs ``Authorization: Bearer KEY`` (401).
4. **Content-Type**: a POST to one of ``control_paths`` must say ``Content-Type: application/json`` (415), so
   that no "simple" cross-site request (text/plain, form posts) can reach it even without ``Origin``.
5. **Size**: a ``Content-Length`` over ``max_body_bytes`` is refused with 413 without reading the body (a chunked
   body is cut off at the same size by aiohttp's ``client_max_size``, which the app must set to it too).

Refusals are JSON: ``{"error": message}``, or OpenAI's ``{"error": {"message", "type", "param", "code"}}`` on
``/v1/`` routes.
"""
from __future__ import annotations

import hmac
import ipaddress
from typing import Callable, Iterable, Optional
from urllib.parse import urlsplit

from aiohttp import web

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
WILDCARD_BINDS = ("", "0.0.0.0", "::")


def parse_allowed_hosts(value: Optional[str], flag: str = "--allowed-hosts") -> list[str]:
    """``"a.example, 10.0.0.5"`` -> ``["a.example", "10.0.0.5"]`` (lower case; ``[::1]`` -> ``::1``).

    Raises ValueError naming ``flag`` for an entry that is not a host name, an IP address or ``*``."""
    out = []
    for part in (value or "").split(","):
        name = part.strip().lower()
        if not name:
            continue
        if name.startswith("[") and name.endswith("]"):
            name = name[1:-1]
        if name != "*" and not _is_ip(name) and not all(c.isalnum() or c in "-._" for c in name):
            raise ValueError(f"{flag}: {part.strip()!r} is not a host name or an IP address (ports are not "
                             f"part of it; separate hosts with commas)")
        out.append(name)
    return out


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        return False


def split_host(value: str) -> tuple[str, Optional[str]]:
    """``"[::1]:30000"`` -> ``("::1", "30000")``; ``"Localhost"`` -> ``("localhost", None)``."""
    v = value.strip().lower()
    if v.startswith("["):
        end = v.find("]")
        if end < 0:
            return v, None
        host, rest = v[1:end], v[end + 1:]
        return host, rest[1:] if rest.startswith(":") else None
    if v.count(":") == 1:
        host, port = v.split(":")
        return host, port
    return v, None      # a bare name, or an unbracketed IPv6 address


class HostPolicy:
    """Which names this server answers to (module doc, step 1)."""

    def __init__(self, bound_host: str = "127.0.0.1", allowed_hosts: Iterable[str] = ()):
        bound = split_host(bound_host or "")[0]
        self.wildcard = bound in WILDCARD_BINDS
        self.extra = [h.lower() for h in allowed_hosts]
        self.any = "*" in self.extra
        self.names = set(LOOPBACK_NAMES) | set(self.extra) | ({bound} if bound and not self.wildcard else set())

    def allows(self, host: str) -> bool:
        if self.any or host in self.names:
            return True
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            return False
        return ip.is_loopback or self.wildcard

    def describe(self) -> str:
        names = sorted(self.names) + (["any IP address (bound to a wildcard address)"] if self.wildcard else [])
        return ", ".join(names)


def _error(path: str, message: str, status: int) -> web.Response:
    if "/v1/" in path:      # OpenAI-compatible routes answer in OpenAI's error shape
        body = {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": None}}
    else:
        body = {"error": message}
    return web.json_response(body, status=status)


def refusal(request: web.Request, policy: HostPolicy) -> Optional[tuple[str, int]]:
    """Why ``request`` fails the Host or Origin check (module doc, steps 1-2), or None when it passes."""
    raw_host = request.headers.get("Host")
    host = port = None
    if raw_host is not None:
        host, port = split_host(raw_host)
        if not policy.allows(host):
            return (f"Host {raw_host!r} is not a name this server answers to ({policy.describe()}); start it with "
                    f"--allowed-hosts {host} to allow it", 403)
    origin = request.headers.get("Origin")
    if origin is not None:
        o = urlsplit(origin.strip().lower()) if origin.strip().lower() != "null" else None
        o_host = o.hostname if o is not None else None
        o_port = None
        if o is not None:
            try:
                o_port = o.port
            except ValueError:
                o_host = None
        same = (o_host is not None and raw_host is not None and o_host == host
                and str(o_port or (443 if o.scheme == "https" else 80)) == (port or "80"))
        if not same and not (o_host is not None and (policy.any or o_host in policy.extra)):
            return (f"cross-origin request from Origin {origin!r} refused: only this server's own pages, or hosts "
                    f"given with --allowed-hosts, may call it", 403)
        return None
    site = request.headers.get("Sec-Fetch-Site", "").lower()
    if site in ("cross-site", "same-site"):
        navigation = request.method == "GET" and request.headers.get("Sec-Fetch-Mode", "").lower() == "navigate"
        if not navigation:
            return f"{site} browser request refused (Sec-Fetch-Site: {site})", 403
    return None


def guard_middleware(policy: HostPolicy, *, api_key: Optional[str] = None, open_paths: Iterable[str] = (),
                     control_paths: Iterable[str] = (), max_body_bytes: Optional[int] = None,
                     on_refuse: Optional[Callable[[], None]] = None):
    """The aiohttp middleware doing the module doc's five checks; ``on_refuse()`` is called on each refusal."""
    open_paths, control_paths = frozenset(open_paths), frozenset(control_paths)
    expected = f"Bearer {api_key}".encode() if api_key else None

    def refuse(request: web.Request, message: str, status: int) -> web.Response:
        if on_refuse is not None:
            on_refuse()
        return _error(request.path, message, status)

    @web.middleware
    async def guard(request: web.Request, handler):
        why = refusal(request, policy)
        if why is not None:
            return refuse(request, *why)
        if expected is not None and request.path not in open_paths:
            got = request.headers.get("Authorization", "").encode()
            if not hmac.compare_digest(got, expected):
                return refuse(request, "missing or wrong API key (send 'Authorization: Bearer KEY')", 401)
        if request.method not in ("GET", "HEAD") and request.path in control_paths \
                and request.content_type != "application/json":
            return refuse(request, f"{request.path} needs 'Content-Type: application/json' (got "
                                   f"{request.headers.get('Content-Type', 'none')!r})", 415)
        size = request.content_length
        if max_body_bytes is not None and size is not None and size > max_body_bytes:
            return refuse(request, f"request body of {size} bytes is over the limit of {max_body_bytes} bytes "
                                   f"(--max-request-bytes)", 413)
        return await handler(request)

    return guard


__all__ = ["HostPolicy", "guard_middleware", "parse_allowed_hosts", "refusal", "split_host"]

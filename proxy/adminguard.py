"""Who may call the admin API (and read /metrics): the rules a request passes first.

The admin API changes routing (a mirror copies every client request out), so a request a
web page made the operator's browser send must never reach it:

- **Host** must name this listener: `localhost`, an IP literal, the configured host, or one
  of `admin_hosts`. A DNS-rebinding page (`evil.example` resolving to 127.0.0.1) sends its
  own name, and is refused (403).
- **Origin**, when sent (browsers send it with every POST and every cross-site request),
  must be this listener's own `http(s)://Host` (403 otherwise).
- **POSTs need `Content-Type: application/json`** (415 otherwise): the only content types
  a page may send cross-site without a CORS preflight (which this API never grants) are
  `text/plain`, form encodings and none at all.
- With `admin_token` set, `Authorization: Bearer <token>` (401 otherwise).

Starting a tokenless admin API on an address other than loopback is refused
(`ProxySettings.validate`) unless `insecure_admin` says it is meant.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Iterable
from typing import Any

from aiohttp import web

JSON = "application/json"


def is_loopback(host: str) -> bool:
    """Whether a listen address is reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def admin_names(settings: Any) -> list[str]:
    """The Host names the admin listener answers to besides `localhost` and IP literals:
    the configured listen hosts and `admin_hosts` (a `ProxySettings`)."""
    return [settings.host, settings.admin_host or "", *settings.admin_hosts]


def exposure_error(settings: Any) -> str | None:
    """Why these settings must not start (a tokenless admin API off loopback), or None."""
    where = settings.admin_host or settings.host
    if settings.admin_token is None and not settings.insecure_admin and not is_loopback(where):
        return (
            f"the admin API would listen on {where} without a token: anyone who reaches "
            "that address could reroute or mirror every request. Set admin_token "
            "(--admin-token), listen on loopback, or pass --insecure-admin "
            "(insecure_admin = true) if the network is yours alone"
        )
    return None


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name.strip("[]"))
    except ValueError:
        return False
    return True


def _host_name(host: str) -> str:
    """`name:port` → `name` (`[::1]:8663` → `[::1]`), lowercased."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[: host.find("]") + 1] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


class AdminGuard:
    """The checks of every admin request (and /metrics), in order: Host, Origin, content
    type, token. `refusal(request)` is None when the request may go on."""

    def __init__(self, token: str | None, hosts: Iterable[str]) -> None:
        self.token = token
        # Names a Host header may give besides `localhost` and IP literals.
        self.names = {h.lower() for h in hosts if h and not _is_ip(h)} | {"localhost"}

    def refusal(self, request: web.Request) -> web.Response | None:
        host = request.headers.get("Host", "")
        name = _host_name(host)
        if not (_is_ip(name) or name in self.names):
            return _refuse(
                403,
                f"Host {host[:80]!r} is not this admin listener (DNS rebinding?); "
                "add the name to admin_hosts if it is yours",
            )
        origin = request.headers.get("Origin")
        if origin is not None and origin.lower() not in (f"http://{host}", f"https://{host}"):
            return _refuse(403, f"cross-site admin request refused (Origin {origin[:80]!r})")
        if request.method == "POST" and request.content_type != JSON:
            return _refuse(
                415, "admin POSTs need 'Content-Type: application/json' (even with no body)"
            )
        if self.token is not None and not self._authorized(request):
            return _refuse(401, "admin token required: Authorization: Bearer <token>")
        return None

    def _authorized(self, request: web.Request) -> bool:
        header = request.headers.get("Authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not given:
            return False
        return hmac.compare_digest(given.strip().encode(), (self.token or "").encode())


def _refuse(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)

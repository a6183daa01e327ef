"""Who sent a request: its bearer value or path key, its JWT's claims, its client address.

JWTs are verified with PyJWT (the most used Python JWT library, maintained, with `cryptography`
for ES256): the signature with the configured HS256 secret or ES256 public key (the token's
`alg` must be one of those configured, never `none`), `exp` required, `nbf`/`iat` when
present, `aud` when `jwt_audience` is set, and the project claim.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import jwt

from proxy.tenancy.settings import TenancySettings

IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


class AuthError(Exception):
    """A credential that cannot be used (HTTP 401); the message says why, never the secret."""


@dataclass(frozen=True, slots=True)
class Claims:
    project: str
    subject: str
    expires: float


class JwtVerifier:
    def __init__(self, settings: TenancySettings) -> None:
        self.keys: dict[str, Any] = {}
        if settings.jwt_secret:
            self.keys["HS256"] = settings.jwt_secret
        if settings.jwt_public_key:
            with open(settings.jwt_public_key, "rb") as fh:
                self.keys["ES256"] = fh.read()
        self.audience = settings.jwt_audience
        self.claim = settings.jwt_project_claim
        self.leeway = settings.jwt_leeway

    @property
    def enabled(self) -> bool:
        return bool(self.keys)

    def verify(self, token: str) -> Claims:
        if not self.keys:
            raise AuthError("JWTs are not accepted here (no jwt_secret or jwt_public_key)")
        try:
            alg = jwt.get_unverified_header(token).get("alg")
        except jwt.PyJWTError:
            raise AuthError("malformed JWT") from None
        key = self.keys.get(alg) if isinstance(alg, str) else None
        if key is None:
            raise AuthError(f"JWT algorithm must be one of {sorted(self.keys)}")
        options: dict[str, Any] = {"require": ["exp"], "verify_aud": self.audience is not None}
        try:
            claims = jwt.decode(
                token,
                key,
                algorithms=[alg],
                audience=self.audience,
                options=options,
                leeway=self.leeway,
            )
        except jwt.ExpiredSignatureError:
            raise AuthError("JWT expired") from None
        except jwt.InvalidAudienceError:
            raise AuthError("JWT audience (aud) is not this service's") from None
        except jwt.PyJWTError as exc:
            raise AuthError(f"JWT rejected: {exc}") from None
        project = claims.get(self.claim)
        if not isinstance(project, str) or not project:
            raise AuthError(f"JWT has no {self.claim!r} claim")
        subject = claims.get("sub")
        return Claims(project, subject if isinstance(subject, str) else "", float(claims["exp"]))


def looks_like_jwt(token: str) -> bool:
    return token.count(".") == 2 and token.startswith("eyJ")


def bearer(value: bytes | None) -> str | None:
    """The credential of an `Authorization: Bearer <credential>` header value."""
    if value is None:
        return None
    scheme, _, rest = value.partition(b" ")
    if scheme.lower() != b"bearer":
        return None
    token = rest.strip()
    return token.decode("latin-1") if token else None


class ClientAddress:
    """The client's address: the peer's, or, when the peer is a trusted reverse proxy, the
    right-most X-Forwarded-For hop that is not one (hops a client wrote itself are left of
    the ones trusted proxies appended, so they are never believed)."""

    def __init__(self, trusted: Iterable[str]) -> None:
        self.trusted: tuple[IpNetwork, ...] = tuple(
            ipaddress.ip_network(n, strict=False) for n in trusted
        )

    def _trusted(self, address: str) -> bool:
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        return any(ip in net for net in self.trusted)

    def of(self, peer: str, forwarded: bytes | None) -> str:
        if not self.trusted or forwarded is None or not self._trusted(peer):
            return peer
        hops = [h.strip() for h in forwarded.decode("latin-1").split(",") if h.strip()]
        for hop in reversed(hops):
            if not self._trusted(hop):
                return hop
        return hops[0] if hops else peer

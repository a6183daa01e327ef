"""Checker settings: every limit named, with its default."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from chainstate.config import ConfigError


@dataclass(slots=True)
class CheckerSettings:
    replicas: list[str] = field(default_factory=list)  # state node URLs (http:// or inproc://)
    quorum: int = 0  # replicas that must agree; 0 = majority (len // 2 + 1)
    chain_id: int | None = None
    host: str = ""  # "" = all interfaces, as the spec's default listen ":8663"
    port: int = 8663
    poll_interval: float = 0.5  # seconds between polling rounds
    batch: int = 200  # heights fetched per replica per round (blockx_getValidation count)
    request_timeout: float = 5.0  # seconds per replica call
    start_height: int | None = None  # first height to confirm; default: lowest held by a quorum

    @property
    def effective_quorum(self) -> int:
        return self.quorum or len(self.replicas) // 2 + 1

    @classmethod
    def from_section(cls, section: dict[str, Any]) -> CheckerSettings:
        known = set(cls.__dataclass_fields__)
        unknown = set(section) - known - {"key", "listen"}
        if unknown:
            raise ConfigError(f"[checker]: unknown settings {sorted(unknown)}")
        values = {k: v for k, v in section.items() if k in known}
        if "listen" in section:
            host, _, port = str(section["listen"]).rpartition(":")
            values["host"], values["port"] = host, int(port)
        settings = cls(**values)
        settings.validate()
        return settings

    def validate(self) -> None:
        if not self.replicas:
            raise ConfigError("checker: at least one replica URL is required")
        if not 0 <= self.quorum <= len(self.replicas):
            raise ConfigError(f"checker: quorum must be 0..{len(self.replicas)}")
        if self.batch < 1 or self.batch > 1000:
            raise ConfigError("checker: batch must be 1..1000")
        if self.poll_interval <= 0:
            raise ConfigError("checker: poll_interval must be positive")

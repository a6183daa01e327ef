"""TOML configuration loading. Each component parses its own section into its own settings."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

REPO_CONFIGS = Path(__file__).resolve().parent.parent / "configs"
DEVNET_CONFIG = REPO_CONFIGS / "devnet.toml"


class ConfigError(ValueError):
    """A configuration file or value that cannot be used; the message says which and why."""


def load_config(path: str | Path | None) -> dict[str, Any]:
    """Load a TOML file; None means no file (empty config). Relative paths inside the file
    are resolved by the components against `__dir__`, the file's folder."""
    if path is None:
        return {}
    p = Path(path)
    try:
        with p.open("rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {p}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {p} is not valid TOML: {exc}") from None
    data["__dir__"] = str(p.resolve().parent)
    return data


def section(config: dict[str, Any], name: str) -> dict[str, Any]:
    value = config.get(name, {})
    if not isinstance(value, dict):
        raise ConfigError(f"[{name}] must be a table")
    return value


def resolve_path(config: dict[str, Any], value: str | Path) -> Path:
    """Resolve a path from the config relative to the config file's folder."""
    p = Path(value)
    if p.is_absolute():
        return p
    return (Path(config.get("__dir__", ".")) / p).resolve()

"""Structured, quiet-by-default logging with secret redaction."""

from __future__ import annotations

import logging
import re
import sys
import time

import orjson

_SECRET = re.compile(
    r"(?i)(bearer\s+|accesskey[\"':=\s]+|token[\"':=\s]+|password[\"':=\s]+)([^\s\"',&@]+)"
)
# The password of a URL's userinfo (`scheme://user:password@host`); `host:port` is left alone.
_URL_PASSWORD = re.compile(r"(://[^:/@\s]+:)[^\s\"'/@]+(?=@)")


def redact(text: str) -> str:
    """Mask credentials that may appear in a log message (tokens, keys, URL passwords)."""
    text = _SECRET.sub(lambda m: m.group(1) + "***", text)
    return _URL_PASSWORD.sub(lambda m: m.group(1) + "***", text)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, plus any `extra` fields."""

    _STD = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}

    def format(self, record: logging.LogRecord) -> str:
        doc = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": redact(record.getMessage()),
        }
        for key, value in record.__dict__.items():
            if key not in self._STD and not key.startswith("_"):
                doc[key] = redact(value) if isinstance(value, str) else value
        if record.exc_info:
            doc["exc"] = redact(self.formatException(record.exc_info))
        return orjson.dumps(doc, default=str).decode()


def setup_logging(level: str = "warning", json: bool = True) -> None:
    """Configure the root logger once per process. Default: warnings and errors only."""
    handler = logging.StreamHandler(sys.stderr)
    if json:
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.Formatter.converter = time.gmtime

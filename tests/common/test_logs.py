"""Secrets never reach the logs; addresses that only look like credentials stay readable."""

from __future__ import annotations

import logging

import orjson
import pytest

from chainstate.logs import JsonFormatter, redact


@pytest.mark.parametrize(
    ("text", "shown", "hidden"),
    [
        ("postgresql://chain:s3cret@db:5432/x", "postgresql://chain:***@db:5432/x", "s3cret"),
        ("Authorization: Bearer cspat_abc123", "Bearer ***", "cspat_abc123"),
        ("AccessKey: csak_zz9", "AccessKey: ***", "csak_zz9"),
        ("etcd://h:2379/p?token=t0p&x=1", "token=***&x=1", "t0p"),
        ('{"password": "hunter2"}', '"password": "***', "hunter2"),
    ],
)
def test_secrets_are_masked(text: str, shown: str, hidden: str) -> None:
    out = redact(text)
    assert shown in out and hidden not in out


@pytest.mark.parametrize(
    "text", ["connect: http://127.0.0.1:8545/ refused", "node https://rpc.example:443/v1 down"]
)
def test_host_and_port_are_kept(text: str) -> None:
    assert redact(text) == text


def test_json_formatter_redacts_message_and_extras() -> None:
    record = logging.LogRecord("x", logging.WARNING, "", 0, "to %s", ("pg://u:pw@h/db",), None)
    record.url = "http://u:pw2@h:1/"
    doc = orjson.loads(JsonFormatter().format(record))
    assert doc["msg"] == "to pg://u:***@h/db" and doc["url"] == "http://u:***@h:1/"

"""The error envelope: one exception type, one table of codes and HTTP statuses.

Every failure answers `{"code": <non-zero>, "message": <what went wrong>, "data": null}` with
the HTTP status of its class. The code is the HTTP status times 100 plus a detail number, so a
client can branch on the class (`code // 100`) or on the exact cause.
"""

from __future__ import annotations

from typing import Any

OK = 0

# code -> (HTTP status, meaning); documented in docs/workspace.md "Errors".
INVALID_PARAMS = 40000  # a parameter is missing, mistyped or out of range
INVALID_JSON = 40001  # the body is not a JSON object
INVALID_FILTER = 40002  # row/list `filter` cannot be used
INVALID_SQL = 40003  # row/query statement is not an allowed single-table SELECT
INVALID_VALUE = 40004  # a row value does not match its column's type
INVALID_DEFINITION = 40005  # a table definition breaks a rule (columns, indexes, view)
QUERY_TIMEOUT = 40006  # row/query ran past the time limit
UNAUTHENTICATED = 40100  # no credential, or an unknown/revoked one
FORBIDDEN = 40300  # the credential may not do this (account, visibility, access key reach)
NOT_FOUND = 40400  # the resource or path does not exist
METHOD_NOT_ALLOWED = 40500
CONFLICT = 40900  # already exists, or the resource is in the wrong state for the operation
TOO_LARGE = 41300  # request body over the configured limit
UNSUPPORTED_MEDIA = 41500  # POST without Content-Type: application/json
INTERNAL = 50000
UPSTREAM = 50200  # the chain-state proxy could not be reached or failed
UPSTREAM_TIMEOUT = 50400


def http_status(code: int) -> int:
    """The HTTP status of an error code (its first three digits)."""
    return code // 100


class ApiError(Exception):
    """A failure answered with the error envelope."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    @property
    def status(self) -> int:
        return http_status(self.code)

    def envelope(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "data": None}


def invalid(message: str, code: int = INVALID_PARAMS) -> ApiError:
    return ApiError(code, message)


def not_found(what: str) -> ApiError:
    return ApiError(NOT_FOUND, f"{what} not found")


def forbidden(message: str) -> ApiError:
    return ApiError(FORBIDDEN, message)


def conflict(message: str) -> ApiError:
    return ApiError(CONFLICT, message)


def ok(data: Any) -> dict[str, Any]:
    return {"code": OK, "message": "ok", "data": data}

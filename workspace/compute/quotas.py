"""Per-account quotas: what one account may hold at once on a server, so one account cannot
take the capacity every account shares (instance slots, the Function worker queue, log
space). Each is a named setting (`[compute] account_<field>`, docs/compute.md); going past
one is an HTTP 429 whose message names the setting.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

from workspace.compute.sandbox import MiB
from workspace.errors import ApiError

QUOTA_INSTANCES = 42901  # account_max_running_instances reached
QUOTA_FUNCTION_RUNS = 42902  # account_max_function_runs reached


@dataclass(frozen=True)
class AccountQuotas:
    """Per-account limits; defaults documented in docs/compute.md."""

    max_running_instances: int = 4  # Notebook instances running at once, per account
    max_function_runs: int = 8  # Function runs queued or running at once (every language)
    max_log_bytes: int = 256 * MiB  # instance log bytes kept; the oldest ended logs go first


class QuotaExceeded(ApiError):
    """A request that would take an account past one of its quotas (HTTP 429)."""

    def __init__(self, code: int, setting: str, limit: int, what: str) -> None:
        super().__init__(code, f"quota account_{setting} ({limit}) reached: {what}")
        self.setting = setting


class InFlight:
    """Counts what each account has in flight against one quota."""

    def __init__(self, code: int, setting: str, limit: int, noun: str) -> None:
        self.code = code
        self.setting = setting
        self.limit = limit
        self.noun = noun
        self._held: Counter[str] = Counter()

    def count(self, account_id: str) -> int:
        return self._held[account_id]

    def check(self, account_id: str, current: int | None = None) -> None:
        """Raise QuotaExceeded when the account already holds `limit` (or `current`)."""
        held = self._held[account_id] if current is None else current
        if held >= self.limit:
            what = f"this account already has {held} {self.noun}"
            raise QuotaExceeded(self.code, self.setting, self.limit, what)

    @contextlib.contextmanager
    def hold(self, account_id: str) -> Iterator[None]:
        """One unit for the account while the block runs (QuotaExceeded when none is left)."""
        self.check(account_id)
        self._held[account_id] += 1
        try:
            yield
        finally:
            self._held[account_id] -= 1
            if not self._held[account_id]:
                del self._held[account_id]

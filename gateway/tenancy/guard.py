"""The admin key's guard: ``Authorization: Bearer <key>`` only, compared in constant time, and a lockout
per client address after repeated failures (so 300 guesses in a row get 300 refusals, not a chance).
"""

from __future__ import annotations

import hmac
import time
from collections import OrderedDict

from gateway.http.errors import ApiError

MAX_LOCKOUT_S = 3600.0
_TRACKED = 10_000
"""Addresses remembered at most (the oldest are forgotten first)."""


class _Failures:
    __slots__ = ("count", "lockout_s", "until")

    def __init__(self, lockout_s: float) -> None:
        self.count = 0
        self.until = 0.0
        self.lockout_s = lockout_s


class AdminGuard:
    def __init__(self, max_failures: int, lockout_s: float) -> None:
        self.max_failures = max_failures
        self.lockout_s = lockout_s
        self._by_address: OrderedDict[str, _Failures] = OrderedDict()

    def check(self, key: str | None, authorization: str | None, address: str, now: float | None = None) -> None:
        """Raise the refusal, or return when the request carries the admin key."""
        if not key:
            raise ApiError(403, "Admin endpoints are off: set admin.api_key_env.", type="permission_error")
        now = time.monotonic() if now is None else now
        failures = self._by_address.get(address)
        if failures is not None and failures.until > now:
            # Locked out: not even the right key is looked at, and trying again makes it longer.
            failures.lockout_s = min(failures.lockout_s * 2, MAX_LOCKOUT_S)
            failures.until = now + failures.lockout_s
            raise _locked(failures.until - now)
        given = ""
        if authorization is not None and authorization[:7].lower() == "bearer ":
            given = authorization[7:].strip()
        # compare_digest on bytes of any length: constant time in the secret's content.
        if given and hmac.compare_digest(given.encode(), key.encode()):
            self._by_address.pop(address, None)
            return
        if failures is None:
            failures = self._by_address[address] = _Failures(self.lockout_s)
            if len(self._by_address) > _TRACKED:
                self._by_address.popitem(last=False)
        failures.count += 1
        if failures.count >= self.max_failures:
            failures.until = now + failures.lockout_s
            raise _locked(failures.lockout_s)
        raise ApiError(401, "A valid admin key is required as `Authorization: Bearer <key>`.",
                       type="authentication_error", code="invalid_api_key")  # fmt: skip


def _locked(retry_s: float) -> ApiError:
    return ApiError(
        429, "Too many failed admin authentications from this address; retry later.", type="rate_limit_error",
        code="admin_locked_out", retry_after=retry_s,
    )  # fmt: skip

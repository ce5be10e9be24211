"""HTTP basic auth against bcrypt hashes, as Prometheus' exporter-toolkit does it, bounded.

- **Constant time in the user name**: an unknown user is checked against a dummy hash of the same
  bcrypt cost as the configured ones, so a wrong password costs the same whether the user exists or not
  (no user-name oracle).
- **A cache of outcomes**: a (user, password) pair that was checked is remembered, success or failure
  (keyed by an HMAC with a per-process key, so no password is kept), up to `cache_size` pairs, least
  recently used first out. A scraper's repeated credentials cost one bcrypt run, not one per scrape.
- **A bound on bcrypt work**: checks that miss the cache run one at a time on their own thread, at most
  `max_pending` running or waiting; beyond that the request is refused at once (`Verdict.BUSY`, answered
  503) without running bcrypt. Clients guessing passwords cannot occupy the threads that serve scrapes.
"""

from __future__ import annotations

import base64
import binascii
import enum
import hashlib
import hmac
import secrets
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

BCRYPT_MAX_PASSWORD = 72  # bytes; bcrypt 5 refuses longer passwords rather than truncating them


class Verdict(enum.Enum):
    ALLOW = "allow"
    DENY = "deny"
    BUSY = "busy"  # too many uncached checks in flight: refused without running bcrypt


@dataclass(frozen=True, slots=True)
class Credentials:
    user: str
    password: bytes
    key: bytes  # the cache key


def cost_of(hashed: bytes) -> int:
    """The cost factor of a modular-crypt bcrypt hash ($2y$10$...)."""
    return int(hashed.split(b"$")[2])


class BasicAuth:
    def __init__(self, users: dict[str, bytes], cache_size: int = 1024, max_pending: int = 8) -> None:
        import bcrypt  # the `web` extra: only a web config with users needs it

        if not users:
            raise ValueError("basic auth needs at least one user")
        self._bcrypt = bcrypt
        self._users = dict(users)
        # The most common cost among the users: an unknown user then costs what a typical known one does.
        costs = [cost_of(h) for h in users.values()]
        cost = max(set(costs), key=costs.count)
        self._dummy = bcrypt.hashpw(secrets.token_urlsafe(16).encode(), bcrypt.gensalt(rounds=cost))
        self._key = secrets.token_bytes(32)
        self._cache: OrderedDict[bytes, bool] = OrderedDict()
        self._cache_size = cache_size
        self._max_pending = max_pending
        self._pending = 0
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bcrypt")

    @property
    def users(self) -> frozenset[str]:
        return frozenset(self._users)

    def credentials(self, header: str | None) -> Credentials | None:
        """The user and password of a `Basic` Authorization header; None when there is none or it is malformed."""
        if not header or header[:6].lower() != "basic ":
            return None
        try:
            raw = base64.b64decode(header[6:].strip(), validate=True)
            user, sep, password = raw.decode("utf-8").partition(":")
        except (binascii.Error, ValueError):
            return None
        if not sep:
            return None
        key = hmac.new(self._key, user.encode() + b"\0" + password.encode(), hashlib.sha256).digest()
        return Credentials(user, password.encode(), key)

    def cached(self, credentials: Credentials) -> Verdict | None:
        """The remembered outcome for these credentials, or None when bcrypt has to run."""
        with self._lock:
            ok = self._cache.get(credentials.key)
            if ok is None:
                return None
            self._cache.move_to_end(credentials.key)
        return Verdict.ALLOW if ok else Verdict.DENY

    def verify(self, credentials: Credentials) -> Future[Verdict]:
        """Runs bcrypt on the auth thread; an already-resolved BUSY when `max_pending` checks are in flight."""
        with self._lock:
            if self._pending >= self._max_pending:
                done: Future[Verdict] = Future()
                done.set_result(Verdict.BUSY)
                return done
            self._pending += 1
        return self._pool.submit(self._verify, credentials)

    def check(self, header: str | None) -> Verdict:
        """The whole check, blocking (for callers on a thread of their own)."""
        credentials = self.credentials(header)
        if credentials is None:
            return Verdict.DENY
        return self.cached(credentials) or self.verify(credentials).result()

    def _verify(self, credentials: Credentials) -> Verdict:
        try:
            known = credentials.user in self._users
            hashed = self._users.get(credentials.user, self._dummy)
            # bcrypt reads at most 72 bytes; a longer password is compared on a copy that cannot match
            password = credentials.password
            if len(password) > BCRYPT_MAX_PASSWORD:
                password, known = password[:BCRYPT_MAX_PASSWORD], False
            ok = self._bcrypt.checkpw(password, hashed) and known
            with self._lock:
                self._cache[credentials.key] = ok
                self._cache.move_to_end(credentials.key)
                while len(self._cache) > self._cache_size:
                    self._cache.popitem(last=False)
            return Verdict.ALLOW if ok else Verdict.DENY
        finally:
            with self._lock:
                self._pending -= 1

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

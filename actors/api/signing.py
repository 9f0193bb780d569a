"""Request signatures for the API: what a client signs and how a server checks it.

The scheme (the seed's anti-replay design): a request carries four headers —

- ``X-Metronome-Key``: the key id;
- ``X-Metronome-Timestamp``: Unix time in milliseconds when it was signed;
- ``X-Metronome-Nonce``: 16-64 characters of ``[A-Za-z0-9_-]``, never reused;
- ``X-Metronome-Signature``: hex HMAC-SHA256, under the key's secret, of the canonical
  string ``METHOD \\n path-with-query \\n timestamp \\n nonce \\n hex SHA-256 of the body``.

The server (``verify``) checks, in this order, so that nothing unauthenticated is ever
written: the headers are present and well-formed; the timestamp is within the allowed skew
of Redis's clock; the key exists and the signature matches (constant-time); and only then
the nonce, with ``SET NX`` and an expiry longer than the skew window, so a replay is
refused even inside the window. A read-only key may only ``GET``/``HEAD``. Errors say what
was wrong (missing header, skew, replay) and never which part of a secret matched.

An unknown key id and a wrong signature are one answer to the client (``AuthError.answer``:
``bad_signature``, "signature or key not accepted"), reached through the same steps (an
unknown id is checked against a decoy secret): a caller cannot learn which key ids exist.
The error itself keeps the difference for the server's log. Secrets never appear in an
error or a log line.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from typing import TYPE_CHECKING

import attrs

from actors.domain.api_keys import KEY_ID_PATTERN

# Re-exported: docs/API.md shows scripts signing with ``actors.api.signing``'s names.
from actors.domain.api_keys import ApiKey as ApiKey

if TYPE_CHECKING:  # the client side (sign) must not pay for importing redis and trio
    from runtime.redis_io import RedisClient

KEY_HEADER = "X-Metronome-Key"
TIMESTAMP_HEADER = "X-Metronome-Timestamp"
NONCE_HEADER = "X-Metronome-Nonce"
SIGNATURE_HEADER = "X-Metronome-Signature"
HEADERS = (KEY_HEADER, TIMESTAMP_HEADER, NONCE_HEADER, SIGNATURE_HEADER)

NONCE_PATTERN = re.compile(r"[A-Za-z0-9_-]{16,64}")
SIGNATURE_PATTERN = re.compile(r"[0-9a-f]{64}")
READ_METHODS = frozenset({"GET", "HEAD"})
#: What a client is told for an unknown key id and for a wrong signature alike.
NOT_ACCEPTED = ("bad_signature", "signature or key not accepted")


@attrs.frozen
class AuthError(Exception):
    """A refused request: ``status`` 401 (not authenticated) or 403 (not allowed)."""

    status: int
    code: str
    """missing_header | malformed | unknown_key | skew | bad_signature | replay | read_only"""
    detail: str

    def __str__(self) -> str:
        return f"{self.status} {self.code}: {self.detail}"

    @property
    def answer(self) -> tuple[str, str]:
        """The code and detail the client is told: ``code`` and ``detail`` themselves,
        except that an unknown key reads as a bad signature (``NOT_ACCEPTED``)."""
        if self.code in ("unknown_key", "bad_signature"):
            return NOT_ACCEPTED
        return self.code, self.detail


def canonical(
    method: str, path_with_query: str, timestamp_ms: str, nonce: str, body: bytes
) -> bytes:
    """The exact bytes both sides sign."""
    digest = hashlib.sha256(body).hexdigest()
    return "\n".join([method.upper(), path_with_query, timestamp_ms, nonce, digest]).encode()


def sign(
    key: ApiKey,
    method: str,
    path_with_query: str,
    body: bytes,
    now_ms: int,
    nonce: str | None = None,
) -> dict[str, str]:
    """The headers that authenticate one request (a fresh random nonce unless given)."""
    nonce = nonce or secrets.token_urlsafe(24)
    timestamp = str(now_ms)
    mac = hmac.new(key.secret, canonical(method, path_with_query, timestamp, nonce, body), "sha256")
    return {
        KEY_HEADER: key.key_id,
        TIMESTAMP_HEADER: timestamp,
        NONCE_HEADER: nonce,
        SIGNATURE_HEADER: mac.hexdigest(),
    }


#: How long a nonce is kept beyond the window its timestamp is acceptable in.
NONCE_MARGIN_MS = 10_000


@attrs.frozen
class Verifier:
    """Checks signed requests against a key ring, Redis's clock and the nonce store."""

    client: RedisClient
    nonce_prefix: str
    """Key prefix of the nonce store (``actors.store.keys.Keys.nonce_prefix``)."""
    keys: dict[str, ApiKey]
    skew_ms: int = 300_000
    _decoy: bytes = attrs.field(init=False, repr=False, factory=lambda: secrets.token_bytes(32))
    """What an unknown key id's signature is checked against: no client knows it."""

    async def precheck(self, headers: dict[str, str]) -> None:
        """AuthError for headers no body could make pass (one missing or malformed, a
        timestamp outside the skew window), before the body is read: a client without a
        well-formed, current request does not get the server to buffer a body. Whether
        the key exists is not told here (``verify`` answers alike for an unknown one)."""
        _, timestamp, _, _ = self._parse(headers)
        self._check_time(int(timestamp), await self.client.clock_ms())

    async def verify(
        self, method: str, path_with_query: str, headers: dict[str, str], body: bytes
    ) -> ApiKey:
        """The request's key, or AuthError saying what was wrong (nothing written then)."""
        key_id, timestamp, nonce, signature = self._parse(headers)
        key = self.keys.get(key_id)
        # An unknown key id takes the same steps as a known one (clock, skew, HMAC): no
        # answer, and no difference in time, tells a caller which ids exist.
        now_ms = await self.client.clock_ms()
        self._check_time(int(timestamp), now_ms)
        expected = hmac.new(
            key.secret if key is not None else self._decoy,
            canonical(method, path_with_query, timestamp, nonce, body), "sha256",
        ).hexdigest()  # fmt: skip
        matches = hmac.compare_digest(expected, signature)
        if key is None:
            raise AuthError(401, "unknown_key", f"no key {key_id!r}")
        if not matches:
            raise AuthError(401, "bad_signature", "the signature does not match the request")
        # Only an authentic request may write a nonce. Its timestamp is acceptable for at
        # most two skews from now (one in the future, one past); the nonce outlives that
        # by NONCE_MARGIN_MS, which covers the clock read and this write being apart.
        fresh = await self.client.execute(
            "SET", f"{self.nonce_prefix}{key.key_id}:{nonce}", "1", "NX",
            "PX", 2 * self.skew_ms + NONCE_MARGIN_MS,
        )  # fmt: skip
        if not fresh:
            raise AuthError(401, "replay", "this nonce was already used: the request is a replay")
        if key.read_only and method.upper() not in READ_METHODS:
            raise AuthError(403, "read_only", f"key {key.key_id!r} is read-only")
        return key

    def _parse(self, headers: dict[str, str]) -> tuple[str, str, str, str]:
        lowered = {name.lower(): value for name, value in headers.items()}
        values = []
        for name in HEADERS:
            value = lowered.get(name.lower())
            if value is None:
                raise AuthError(401, "missing_header", f"header {name} is missing")
            values.append(value)
        key_id, timestamp, nonce, signature = values
        if not KEY_ID_PATTERN.fullmatch(key_id):
            raise AuthError(401, "malformed", f"header {KEY_HEADER} is not a key id")
        if not (timestamp.isascii() and timestamp.isdecimal()) or len(timestamp) > 16:
            raise AuthError(401, "malformed", f"header {TIMESTAMP_HEADER} is not Unix milliseconds")
        if not NONCE_PATTERN.fullmatch(nonce):
            raise AuthError(
                401, "malformed", f"header {NONCE_HEADER} must be 16-64 of [A-Za-z0-9_-]"
            )
        if not SIGNATURE_PATTERN.fullmatch(signature):
            raise AuthError(401, "malformed", f"header {SIGNATURE_HEADER} must be 64 hex digits")
        return key_id, timestamp, nonce, signature

    def _check_time(self, timestamp_ms: int, now_ms: int) -> None:
        if timestamp_ms < now_ms - self.skew_ms:
            raise AuthError(
                401, "skew", f"the request expired: signed more than {self.skew_ms // 1000}s ago"
            )
        if timestamp_ms > now_ms + self.skew_ms:
            raise AuthError(
                401, "skew",
                f"the request is from the future: more than {self.skew_ms // 1000}s ahead",
            )  # fmt: skip

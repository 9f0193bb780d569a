"""Request signatures and the anti-replay nonce store, against a real Redis.

Each refusal says what was wrong, and nothing is written in Redis for a request that is
not authentic (only an authentic request's nonce is stored)."""

from __future__ import annotations

from typing import Any

import pytest

from actors.api.signing import (
    KEY_HEADER,
    NONCE_HEADER,
    NOT_ACCEPTED,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    AuthError,
    Verifier,
    sign,
)
from actors.domain.api_keys import ApiKey
from actors.store.keys import Keys
from runtime.redis_io import RedisClient

WRITER = ApiKey("ops", b"s3cret-writer")
READER = ApiKey("dash", b"s3cret-reader", read_only=True)
BODY = b'{"type":"email","schedule":{"kind":"interval","every_s":60}}'


@pytest.fixture
def verifier(redis_client: RedisClient, namespace: str) -> Verifier:
    keys = Keys(namespace, 16)
    return Verifier(redis_client, keys.nonce_prefix, {"ops": WRITER, "dash": READER}, 60_000)


async def nonces(client: RedisClient, namespace: str) -> list[bytes]:
    """Every nonce key of the namespace (the whole SCAN: the server is shared by the suite)."""
    cursor, found = 0, []
    while True:
        cursor, batch = await client.execute(
            "SCAN", cursor, "MATCH", f"{namespace}:nonce:*", "COUNT", 1000
        )
        found += batch
        if int(cursor) == 0:
            return found


async def signed(client: RedisClient, key: ApiKey = WRITER, **overrides: Any) -> dict[str, str]:
    now = await client.time_ms()
    return sign(key, "POST", "/v1/tasks?dry=1", BODY, overrides.pop("now_ms", now), **overrides)


async def test_a_signed_request_passes_once(
    verifier: Verifier, redis_client: RedisClient, namespace: str
) -> None:
    headers = await signed(redis_client)
    key = await verifier.verify("POST", "/v1/tasks?dry=1", headers, BODY)
    assert key.key_id == "ops"
    assert len(await nonces(redis_client, namespace)) == 1
    with pytest.raises(AuthError) as info:
        await verifier.verify("POST", "/v1/tasks?dry=1", headers, BODY)
    assert (info.value.status, info.value.code) == (401, "replay")


@pytest.mark.parametrize(
    ("mutate", "code", "message"),
    [
        (lambda h: h.pop(SIGNATURE_HEADER), "missing_header", "X-Metronome-Signature is missing"),
        (lambda h: h.pop(KEY_HEADER), "missing_header", "X-Metronome-Key is missing"),
        (lambda h: h.update({TIMESTAMP_HEADER: "soon"}), "malformed", "not Unix milliseconds"),
        (lambda h: h.update({NONCE_HEADER: "short"}), "malformed", "16-64"),
        (lambda h: h.update({SIGNATURE_HEADER: "zz"}), "malformed", "64 hex digits"),
        (lambda h: h.update({KEY_HEADER: "nobody"}), "unknown_key", "no key 'nobody'"),
        (lambda h: h.update({SIGNATURE_HEADER: "0" * 64}), "bad_signature", "does not match"),
    ],
)
async def test_bad_headers_are_refused_and_nothing_is_written(
    verifier: Verifier, redis_client: RedisClient, namespace: str,
    mutate: Any, code: str, message: str,
) -> None:  # fmt: skip
    headers = await signed(redis_client)
    mutate(headers)
    with pytest.raises(AuthError) as info:
        await verifier.verify("POST", "/v1/tasks?dry=1", headers, BODY)
    assert (info.value.status, info.value.code) == (401, code)
    assert message in info.value.detail
    assert "s3cret" not in str(info.value)
    assert await nonces(redis_client, namespace) == []


@pytest.mark.parametrize(
    ("offset_ms", "message"),
    [(-61_000, "the request expired"), (61_000, "the request is from the future")],
)
async def test_timestamps_outside_the_skew_are_refused(
    verifier: Verifier, redis_client: RedisClient, namespace: str, offset_ms: int, message: str
) -> None:
    headers = await signed(redis_client, now_ms=await redis_client.time_ms() + offset_ms)
    with pytest.raises(AuthError) as info:
        await verifier.verify("POST", "/v1/tasks?dry=1", headers, BODY)
    assert (info.value.code, message in info.value.detail) == ("skew", True)
    assert await nonces(redis_client, namespace) == []


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("PUT", "/v1/tasks?dry=1", BODY),  # another method
        ("POST", "/v1/tasks?dry=0", BODY),  # another query
        ("POST", "/v1/tasks?dry=1", BODY + b" "),  # another body
    ],
)
async def test_any_change_to_the_request_breaks_the_signature(
    verifier: Verifier, redis_client: RedisClient, method: str, path: str, body: bytes
) -> None:
    headers = await signed(redis_client)
    with pytest.raises(AuthError, match="bad_signature"):
        await verifier.verify(method, path, headers, body)


async def test_a_wrong_secret_is_refused_like_any_bad_signature(
    verifier: Verifier, redis_client: RedisClient
) -> None:
    headers = await signed(redis_client, key=ApiKey("ops", b"s3cret-writeR"))
    with pytest.raises(AuthError) as info:
        await verifier.verify("POST", "/v1/tasks?dry=1", headers, BODY)
    assert info.value.detail == "the signature does not match the request"


async def test_read_only_keys_may_only_read(verifier: Verifier, redis_client: RedisClient) -> None:
    now = await redis_client.time_ms()
    get = sign(READER, "GET", "/v1/tasks", b"", now)
    assert (await verifier.verify("GET", "/v1/tasks", get, b"")).read_only
    post = sign(READER, "POST", "/v1/tasks", BODY, now)
    with pytest.raises(AuthError) as info:
        await verifier.verify("POST", "/v1/tasks", post, BODY)
    assert (info.value.status, info.value.code) == (403, "read_only")


def test_secrets_stay_out_of_reprs() -> None:
    assert "s3cret" not in repr(WRITER)


async def test_an_unknown_key_and_a_wrong_signature_give_the_client_one_answer(
    verifier: Verifier, redis_client: RedisClient
) -> None:
    """The server still knows which it was (``code``, for its log line); the client is
    told the same either way (``answer``), so it cannot probe for key ids."""
    errors = []
    for key in (ApiKey("nobody", b"s3cret-writer"), ApiKey("ops", b"s3cret-writeR")):
        with pytest.raises(AuthError) as info:
            await verifier.verify("POST", "/v1/tasks?dry=1", await signed(redis_client, key), BODY)
        errors.append(info.value)
    assert [e.code for e in errors] == ["unknown_key", "bad_signature"]
    assert errors[0].answer == errors[1].answer == NOT_ACCEPTED
    assert errors[0].status == errors[1].status == 401


async def test_an_unknown_key_is_checked_for_skew_like_a_known_one(
    verifier: Verifier, redis_client: RedisClient
) -> None:
    """Were the key looked up first, an expired request would say ``skew`` for a known id
    and something else for an unknown one."""
    old = await redis_client.time_ms() - 61_000
    answers = []
    for key in (ApiKey("nobody", b"s3cret-writer"), WRITER):
        headers = await signed(redis_client, key, now_ms=old)
        with pytest.raises(AuthError) as info:
            await verifier.verify("POST", "/v1/tasks?dry=1", headers, BODY)
        answers.append((info.value.status, info.value.answer))
    assert answers[0] == answers[1] and answers[0][1][0] == "skew"


def test_other_refusals_are_told_as_they_are() -> None:
    error = AuthError(401, "replay", "this nonce was already used: the request is a replay")
    assert error.answer == (error.code, error.detail)

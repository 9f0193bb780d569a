"""Shared fixtures: a Redis the suite started itself, and a fresh namespace per test."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator

import pytest

from runtime.config import RedisSection
from runtime.redis_io import RedisClient
from tests.redis_server import redis_url_for_tests


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    with redis_url_for_tests() as url:
        yield url


@pytest.fixture
def namespace() -> str:
    """A namespace no other test uses: tests share one server but never each other's keys."""
    return f"t{uuid.uuid4().hex[:10]}"


@pytest.fixture
async def redis_client(redis_url: str) -> AsyncIterator[RedisClient]:
    client = RedisClient.from_settings(redis_url, RedisSection(url=redis_url))
    try:
        yield client
    finally:
        await client.aclose()

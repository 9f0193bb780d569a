"""A namespace's meta key (``ns:meta``): its layout version, partition and bucket counts
and message form, fixed when the namespace is first used. Every node reads them from there
(``read_keys``), and each process lays the key down again if Redis lost it
(``TaskStore.keep_meta`` with ``meta_fields``), so a node started then reads the namespace
as the running ones do instead of laying another layout over its tasks."""

from __future__ import annotations

from typing import Any

from actors.domain.errors import LayoutMismatch
from actors.store.keys import COMPACT_MESSAGES, LAYOUT_VERSION, MAX_BUCKETS, MIGRATES_FROM, Keys
from actors.store.queue_rows import as_text, stored_number
from runtime.redis_io import RedisClient


def meta_key(namespace: str) -> str:
    return f"{namespace}:meta"


def meta_fields(keys: Keys) -> list[Any]:
    """The meta key's fields as ``read_keys`` read them: what ``keep_meta.lua`` writes."""
    fields: list[Any] = [
        "layout", LAYOUT_VERSION, "partitions", keys.partitions, "buckets", keys.buckets
    ]  # fmt: skip
    if keys.compact_messages:
        fields += ["messages", COMPACT_MESSAGES]
    return fields


async def read_keys(
    client: RedisClient, namespace: str, default_partitions: int, default_buckets: int
) -> Keys:
    """The namespace's keys from its meta key, which is created with the defaults on first
    use; a namespace of another layout, or a meta key mended wrong by hand, is refused
    (``LayoutMismatch``) naming what to do."""
    meta = meta_key(namespace)
    await _refuse_data_without_meta(client, namespace, meta)
    # The layout first: a namespace written by an older version keeps its number
    # (it has no buckets field until ``metronome migrate`` gives it one).
    created = await client.execute("HSETNX", meta, "layout", LAYOUT_VERSION)
    layout = await client.execute("HGET", meta, "layout")
    _meta_number(namespace, meta, "layout", layout)
    if layout is None or int(layout) != LAYOUT_VERSION:
        hint = (
            "run `metronome migrate` (with every node stopped) to convert it"
            if layout is not None and int(layout) in MIGRATES_FROM
            else "use a Metronome that reads it, or another namespace"
        )
        found = "no layout version" if layout is None else f"layout {layout.decode()}"
        raise LayoutMismatch(
            f"namespace {namespace!r} has {found}; this Metronome reads layout "
            f"{LAYOUT_VERSION}: {hint}"
        )
    await client.pipeline(
        [
            ("HSETNX", meta, "partitions", default_partitions),
            ("HSETNX", meta, "buckets", default_buckets),
            # A new namespace has no node of an older version reading it: compact
            # messages from the start (an older one: ``metronome migrate``).
            *([("HSETNX", meta, "messages", COMPACT_MESSAGES)] if created else []),
        ]
    )
    partitions, buckets, messages = await client.execute(
        "HMGET", meta, "partitions", "buckets", "messages"
    )
    if messages is not None and not messages.isdigit():
        found = messages.decode(errors="replace")
        raise LayoutMismatch(
            f"namespace {namespace!r}: {meta} has messages = {found!r}, not a "
            f"message form number (this Metronome writes form {COMPACT_MESSAGES}; "
            "`metronome migrate` sets it)"
        )
    _meta_number(namespace, meta, "partitions", partitions, 1, 1024)
    _meta_number(namespace, meta, "buckets", buckets, 1, MAX_BUCKETS)
    return Keys(
        namespace, int(partitions), int(buckets),
        compact_messages=messages is not None and int(messages) >= COMPACT_MESSAGES,
    )  # fmt: skip


async def _refuse_data_without_meta(client: RedisClient, namespace: str, meta: str) -> None:
    """A namespace whose meta key is gone (deleted by hand, evicted, a partial restore)
    but whose tasks or pollers are still there is refused: a new meta key laid over
    it would give it this node's partition and bucket counts (and this layout), and
    every task whose place they move would stop firing, without a word. The marks:
    ``ns:types`` (written by every create, in every layout) and ``ns:pollers`` (by
    every poller while it runs)."""
    if await client.execute("EXISTS", meta):
        return
    marks = [f"{namespace}:types", f"{namespace}:pollers"]
    found = [mark for mark in marks if await client.execute("EXISTS", mark)]
    # a node that made the namespace between the two reads, or a live node that laid
    # the key down again (keep_meta), leaves it to be read as it is
    if found and not await client.execute("EXISTS", meta):
        raise LayoutMismatch(
            f"namespace {namespace!r} holds data ({', '.join(found)}) but has no "
            f"{meta} key, so its layout, partitions and buckets are unknown; restore "
            f"it (HSET {meta} layout {LAYOUT_VERSION} partitions <P> buckets <B> "
            f"messages {COMPACT_MESSAGES}, with the counts the namespace was made "
            "with) or use another namespace"
        )


def _meta_number(
    namespace: str, meta: str, field: str, raw: bytes | None, least: int = 0,
    most: int = 2**31,
) -> None:  # fmt: skip
    """LayoutMismatch naming the meta field when it holds no whole number in
    ``least..most`` (a hand edit gone wrong): every node and API call would fail on it."""
    if raw is None:
        return
    number = stored_number(raw)
    if number is None or not least <= number <= most:
        raise LayoutMismatch(
            f"namespace {namespace!r}: {meta} has {field} = {as_text(raw)!r}, not a whole number "
            f"within {least}..{most}: mend it (`HSET {meta} {field} <n>`) or restore it"
        )

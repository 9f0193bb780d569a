"""The plain stream commands (no script): creating a type's group, reading it as a
consumer, and the bounded reads and deletes operators need (ranges, group and consumer
info, pending entries, DLQ purge). Like ``scripts``, the only code that builds these
commands or parses their replies."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from actors.store.keys import GROUP, Keys
from actors.store.messages import MalformedMessage, Message, flat_fields
from runtime.redis_io import RedisClient, ResponseError

Entry = tuple[bytes, dict[bytes, bytes]]


class Streams:
    def __init__(self, client: RedisClient, keys: Keys) -> None:
        self.client = client
        self.keys = keys

    # -- consumers --------------------------------------------------------------------------

    async def ensure_group(self, task_type: str) -> None:
        """The type's stream and its consumer group, created if missing."""
        try:
            await self.client.execute(
                "XGROUP", "CREATE", self.keys.queue(task_type), GROUP, "0", "MKSTREAM"
            )
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    async def read_group(
        self, task_type: str, consumer: str, count: int, block_ms: int
    ) -> tuple[list[Message], list[tuple[str, dict[bytes, bytes], str]]]:
        """XREADGROUP of new messages for ``consumer``: (messages, malformed entries as
        (id, fields, error)). Entries deleted while pending are left out. ``count`` must be
        at least 1: Redis reads ``COUNT 0`` (and below) as no limit at all."""
        if count < 1:
            raise ValueError(f"read_group: count must be at least 1, got {count}")
        stream = self.keys.queue(task_type)
        reply = await self.client.execute_unparsed(
            "XREADGROUP", "GROUP", GROUP, consumer, "COUNT", count,
            "BLOCK", block_ms, "STREAMS", stream, ">", slot_key=stream,
        )  # fmt: skip
        if not reply:
            return [], []
        # As sent: {stream: entries} (RESP3, redis-py's default) or [[stream, entries]]
        # (RESP2); a parsed RESP3 reply (``reads_parsed``) nests them once more.
        if isinstance(reply, dict):
            entries = reply[stream.encode()]
            if self.client.reads_parsed:
                entries = entries[0]
        else:
            entries = reply[0][1]
        messages: list[Message] = []
        malformed: list[tuple[str, dict[bytes, bytes], str]] = []
        for msg_id, raw in entries:
            if raw is None:
                continue  # deleted while pending: nothing to run
            try:
                messages.append(Message.read(msg_id, raw, task_type))
            except MalformedMessage as exc:
                malformed.append((msg_id.decode(), flat_fields(raw), str(exc)))
        return messages, malformed

    # -- operators --------------------------------------------------------------------------

    async def read_range(
        self, key: str, start: str, end: str, count: int, *, newest_first: bool = False
    ) -> list[Entry]:
        """One page of a stream: XRANGE start..end, or XREVRANGE from ``start`` to ``end``."""
        client = self.client

        def read() -> list[Entry]:
            raw = client.raw  # inside the I/O thread: a cluster client may connect here
            if newest_first:
                return list(raw.xrevrange(key, start, end, count=count))
            return list(raw.xrange(key, start, end, count=count))

        return await self.client.run_sync(read)

    async def queue_infos(self, types: Sequence[str]) -> list[list[Any]]:
        """Per type: [XLEN queue, XLEN dlq, XINFO GROUPS, XINFO CONSUMERS, XPENDING summary];
        a missing stream gives an error object in place."""
        if not types:
            return []
        client, keys = self.client, self.keys

        def read() -> list[list[Any]]:
            pipe = client.raw.pipeline(transaction=False)
            for t in types:
                pipe.xlen(keys.queue(t))
                pipe.xlen(keys.dlq(t))
                pipe.xinfo_groups(keys.queue(t))
                pipe.xinfo_consumers(keys.queue(t), GROUP)
                pipe.xpending(keys.queue(t), GROUP)
            replies = list(pipe.execute(raise_on_error=False))
            return [replies[i : i + 5] for i in range(0, len(replies), 5)]

        return await self.client.run_sync(read)

    async def pending_of(
        self, task_type: str, entry_ids: Sequence[str]
    ) -> list[dict[str, Any] | None]:
        """Per entry id: its pending entry (consumer, time_since_delivered, times_delivered)
        or None when it is not delivered."""
        if not entry_ids:
            return []
        client, queue = self.client, self.keys.queue(task_type)

        def read() -> list[Any]:
            pipe = client.raw.pipeline(transaction=False)
            for entry_id in entry_ids:
                pipe.xpending_range(queue, GROUP, entry_id, entry_id, 1)
            return list(pipe.execute(raise_on_error=False))

        replies = await self.client.run_sync(read)
        return [r[0] if isinstance(r, list) and r else None for r in replies]

    async def purge_dead(self, task_type: str, entry_ids: Sequence[str] | None) -> int:
        """Delete these dead letters, or (None) the type's whole DLQ; how many there were."""
        dlq = self.keys.dlq(task_type)
        if entry_ids is None:
            count = int(await self.client.execute("XLEN", dlq))
            await self.client.execute("UNLINK", dlq)
            return count
        return int(await self.client.execute("XDEL", dlq, *entry_ids))

"""Stream messages: one fire of one task, as the poller or retry dispatcher wrote it.

Fields (all strings in Redis): ``task_id``, ``payload`` (JSON), ``attempt`` (0 = first
run), ``due_ms``. That is the compact form, written where the namespace's meta key says
``messages`` = 2 (every namespace this version creates; an older one once ``metronome
migrate`` has run). The full form, which versions before it read and still write, adds
``schedule_id`` (always ``task_id:due_ms``), ``type`` (the stream's) and ``enq_ms`` (when
it was appended: the entry id's milliseconds). Either form has ``o``, the task's policy
code, when its task has an overlap policy, a catch-up window or a failure limit
(``actors.store.flights``). Readers derive what a compact message leaves
out, so both forms read alike; the compact one is 3 of 7 fields fewer for Redis to append,
store and return (~0.7 µs of Redis CPU a fire at 10,000 fires/s, and a stream entry of 41
bytes against 89: ``bench fire``, docs/PERFORMANCE.md). A message carries everything
its handler needs: consumers never read the task's records back. Dead letters and
replays keep the full form.
"""

from __future__ import annotations

import json
from typing import Any

import attrs

from actors.store.keys import schedule_id


class MalformedMessage(ValueError):
    """A stream entry that is not a Metronome message (written by hand, or by an older
    version): it cannot run, so it goes to the DLQ with this error."""

    @classmethod
    def of(cls, msg_id: str, exc: Exception) -> MalformedMessage:
        return cls(f"stream entry {msg_id} is not a Metronome message: {exc!r}")


#: What decoding an entry that is not a Metronome message raises: a field missing, not a
#: number, not UTF-8 or not bytes, or a payload nested deeper than the JSON decoder reads.
_NOT_A_MESSAGE = (KeyError, ValueError, UnicodeDecodeError, AttributeError, RecursionError)

#: Bounds of a message's numbers: what its completion packs and Lua reads exactly (a fire
#: of another producer beyond them would fail every write of its batch, not itself).
_MAX_MS = 2**53 - 1
_MAX_ATTEMPT = 2**31 - 1


def _out_of_range(due_ms: int, attempt: int, enq_ms: int) -> ValueError:
    """The error for a message's numbers past their bounds (the caller found some)."""
    return ValueError(
        f"due_ms {due_ms}, attempt {attempt} or enq_ms {enq_ms} out of range "
        f"(0..{_MAX_MS}, 0..{_MAX_ATTEMPT})"
    )


@attrs.define  # not frozen: built per fire, and a frozen class costs ~4x to build
class Message:
    msg_id: str
    task_id: str
    schedule_id: str
    type: str
    payload_json: str
    attempt: int
    due_ms: int
    enq_ms: int
    payload: Any = attrs.field(eq=False, repr=False)
    """``payload_json`` parsed (once, when the message is decoded)."""
    policy: str = ""
    """Its task's policy code (field ``o``: ``actors.store.flights``), '' for none."""

    @property
    def fire_key(self) -> str:
        """Identifies this attempt of this fire: duplicates share it, retries do not."""
        return f"{self.schedule_id}:{self.attempt}"

    @classmethod
    def decode(cls, msg_id: bytes | str, fields: dict[bytes, bytes], task_type: str) -> Message:
        """A stream entry of ``task_type``'s stream, in either form (see the module)."""
        mid = msg_id.decode() if isinstance(msg_id, bytes) else msg_id
        try:
            # Read by bytes key: decoding every key and value first cost ~3 % of a consumer.
            payload = fields[b"payload"].decode()
            task_id = fields[b"task_id"].decode()
            due_ms = int(fields[b"due_ms"])
            get = fields.get  # the full form's fields (see the module)
            sid, of_type, enq = get(b"schedule_id"), get(b"type"), get(b"enq_ms")
            policy = get(b"o")
            attempt = int(fields[b"attempt"])
            enq_ms = entry_ms(mid) if enq is None else int(enq)
            if not (
                0 <= due_ms <= _MAX_MS and 0 <= attempt <= _MAX_ATTEMPT and 0 <= enq_ms <= _MAX_MS
            ):
                raise _out_of_range(due_ms, attempt, enq_ms)
            return cls(
                msg_id=mid,
                task_id=task_id,
                schedule_id=schedule_id(task_id, due_ms) if sid is None else sid.decode(),
                type=task_type if of_type is None else of_type.decode(),
                payload_json=payload,
                attempt=attempt,
                due_ms=due_ms,
                enq_ms=enq_ms,
                payload=parse_payload(payload),
                policy="" if policy is None else policy.decode(),
            )
        except _NOT_A_MESSAGE as exc:
            raise MalformedMessage.of(mid, exc) from exc

    @classmethod
    def read(cls, msg_id: bytes, raw: Any, task_type: str) -> Message:
        """A stream entry as a read returns it (a flat field list, or a dict redis-py
        parsed). A compact message without a policy, its fields in the order the poller
        writes them, is read by position: ~1 µs a message less than building the dict
        (``fields`` is then never built); anything else goes through ``decode``."""
        if (
            type(raw) is list
            and len(raw) == 8
            and raw[0] == b"task_id"
            and raw[2] == b"payload"
            and raw[4] == b"attempt"
            and raw[6] == b"due_ms"
        ):
            mid = msg_id.decode()
            try:
                task_id, payload = raw[1].decode(), raw[3].decode()
                due_ms, attempt = int(raw[7]), int(raw[5])
                if not (0 <= due_ms <= _MAX_MS and 0 <= attempt <= _MAX_ATTEMPT):
                    raise _out_of_range(due_ms, attempt, 0)
                return cls(
                    mid, task_id, schedule_id(task_id, due_ms), task_type, payload, attempt,
                    due_ms, entry_ms(mid), parse_payload(payload),
                )  # fmt: skip
            except _NOT_A_MESSAGE as exc:
                raise MalformedMessage.of(mid, exc) from exc
        return cls.decode(msg_id, flat_fields(raw), task_type)

    def fields(self) -> dict[str, str]:
        fields = {
            "task_id": self.task_id,
            "schedule_id": self.schedule_id,
            "type": self.type,
            "payload": self.payload_json,
            "attempt": str(self.attempt),
            "due_ms": str(self.due_ms),
            "enq_ms": str(self.enq_ms),
        }
        if self.policy:
            fields["o"] = self.policy
        return fields


def entry_ms(msg_id: str) -> int:
    """When a stream entry was appended: its id's milliseconds (a compact message's
    ``enq_ms``)."""
    return int(msg_id.partition("-")[0])


def parse_payload(text: str) -> Any:
    """A message's payload JSON, parsed. ``null`` (a task created without a payload, the
    common case) is answered without the JSON decoder, which costs ~0.6 µs a call even
    for four characters."""
    return None if text == "null" else json.loads(text)


def flat_fields(raw: Any) -> dict[bytes, bytes]:
    """A stream entry's fields as a dict, whether redis-py parsed them or a script returned
    them as a flat list."""
    if isinstance(raw, dict):
        return raw
    pairs = iter(raw)  # no slices: ~half the time of zip(raw[::2], raw[1::2]), per message
    return dict(zip(pairs, pairs, strict=True))

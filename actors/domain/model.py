"""Tasks as clients define them (``TaskSpec``) and as Redis stores them (``Task``).

Stored form: two compact records in bucket hashes (``actors.store.records``). Validation happens
here, before anything is written, and names the field at fault.
"""

from __future__ import annotations

import base64
import json
import re
import secrets
import string
import typing
from typing import Any, Literal

import attrs
import cattrs

from actors.domain.errors import InvalidTask
from actors.domain.labels import check_labels, encode_labels
from actors.domain.schedules import Schedule
from runtime.config import check_name, describe, make_converter

Status = Literal["active", "paused", "stopped", "finished"]
#: A status is stored as its index here (``actors/store/records.py``, ``records.lua``): append only.
STATUSES: tuple[str, ...] = typing.get_args(Status)

#: Largest payload, as compact JSON, a task may carry (the handler gets it in every message).
MAX_PAYLOAD_BYTES = 64 * 1024
#: Deepest nesting of arrays and objects a payload may have: every reader (the API's
#: answers, the handlers, the dashboard) decodes it recursively, and one nested past the
#: interpreter's stack would break them all, the type's listing with them.
MAX_PAYLOAD_DEPTH = 100
#: Longest client-given task id.
MAX_TASK_ID = 128
#: Ids a task cannot take: the API's paths ``/v1/tasks/bulk`` and ``/v1/tasks/actions``
#: would answer for it.
RESERVED_TASK_IDS = frozenset({"bulk", "actions"})

converter = make_converter()


_ID_FIRST = string.ascii_letters + string.digits


def new_task_id() -> str:
    """A server-generated id: 12 characters, 72 random bits. Short because a task's id is
    stored three times (two records and the schedule), and 12 characters is the longest
    that Redis keeps in its smallest string allocation (16 bytes with the header): 16
    bytes a task less than 20 hex characters. Two ids collide among a million with a
    chance of 1e-10, and a collision is a visible conflict, not a loss. The first
    character is a letter or digit (a name must start with one), the rest base64url."""
    raw = secrets.token_bytes(10)
    return _ID_FIRST[raw[0] % len(_ID_FIRST)] + base64.urlsafe_b64encode(raw[1:]).decode()[:11]


def _depth(value: Any) -> int:
    """How deep arrays and objects nest in ``value`` (0: none), walked without recursion;
    it stops counting once past ``MAX_PAYLOAD_DEPTH``."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict | list | tuple):
            deepest = max(deepest, level)
            if level > MAX_PAYLOAD_DEPTH:
                return level
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, level + 1) for child in children)
    return deepest


def encode_json(value: Any) -> str:
    # allow_nan=False: NaN and Infinity are not JSON; stored, they would break every reader.
    return json.dumps(
        value, separators=(",", ":"), sort_keys=True, ensure_ascii=False, allow_nan=False
    )


class RepeatedKey(ValueError):
    """A JSON object that gives one key twice: JSON parsers keep the last, silently, so
    ``{"labels": {"tenant": "acme"}, "labels": {}}`` would select every task."""


def _no_repeated_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):  # rare: found again, to name it
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise RepeatedKey(f"key {key!r} is given twice in one object")
            seen.add(key)
    return out


def decode_json(text: str | bytes, **options: Any) -> Any:
    """``json.loads`` that refuses an object giving a key twice (``RepeatedKey``)."""
    return json.loads(text, object_pairs_hook=_no_repeated_keys, **options)


def check_payload_depth(payload: Any) -> None:
    """InvalidTask for a payload a client sends nested deeper than ``MAX_PAYLOAD_DEPTH``
    (checked where payloads arrive, not where stored ones are sent: one an earlier version
    stored still fires)."""
    if _depth(payload) > MAX_PAYLOAD_DEPTH:
        raise InvalidTask(f"payload: nested deeper than {MAX_PAYLOAD_DEPTH} arrays or objects")


def encode_payload(payload: Any) -> str:
    """The payload as stored and sent to handlers, or InvalidTask if too big or not JSON
    (a lone surrogate, from a ``\\ud800`` escape, is text UTF-8 cannot carry)."""
    try:
        text = encode_json(payload)
        size = len(text.encode())
    except UnicodeEncodeError as exc:
        raise InvalidTask(f"payload: holds text UTF-8 cannot carry ({exc.reason})") from exc
    except (TypeError, ValueError) as exc:
        raise InvalidTask(f"payload: not JSON-serialisable: {exc}") from exc
    if size > MAX_PAYLOAD_BYTES:
        raise InvalidTask(
            f"payload: {size} bytes as JSON, more than the {MAX_PAYLOAD_BYTES} allowed"
        )
    return text


@attrs.frozen
class TaskSpec:
    """A task definition as a client sends it."""

    type: str
    schedule: Schedule
    payload: Any = None
    task_id: str | None = None
    labels: dict[str, str] = attrs.field(factory=dict)
    """Key/value pairs to find the task by (``actors.domain.labels``)."""
    _payload_json: str = attrs.field(init=False, eq=False, repr=False, default="")
    """The payload as stored, encoded once when the spec is built (it is validated then)."""

    def __attrs_post_init__(self) -> None:
        for field, value, max_len in (
            ("type", self.type, 64),
            ("task_id", self.task_id, MAX_TASK_ID),
        ):
            if value is not None:
                try:
                    check_name(field, value, max_len)
                except ValueError as exc:
                    raise InvalidTask(f"{field}: {exc}") from exc
        if self.task_id in RESERVED_TASK_IDS:
            raise InvalidTask(
                f"task_id: {self.task_id!r} is reserved (the API's /v1/tasks/{self.task_id})"
            )
        if self.labels:
            object.__setattr__(self, "labels", check_labels(self.labels))
        check_payload_depth(self.payload)
        object.__setattr__(self, "_payload_json", encode_payload(self.payload))

    def payload_json(self) -> str:
        return self._payload_json

    def labels_json(self) -> str:
        """The labels as stored, '' for none."""
        return encode_labels(self.labels)


def parse_spec(data: Any) -> TaskSpec:
    """A TaskSpec from plain data (an API body), or InvalidTask naming every bad field."""
    if not isinstance(data, dict):
        raise InvalidTask(f"a task must be a JSON object, got {type(data).__name__}")
    if "labels" in data:  # checked first, so its errors name each label
        check_labels(data["labels"])
    if isinstance(data.get("schedule"), dict):
        _check_cron_length(data["schedule"])
    try:
        return converter.structure(data, TaskSpec)
    except InvalidTask:
        raise
    except (cattrs.BaseValidationError, ValueError, TypeError) as exc:
        raise InvalidTask(describe(exc)) from exc


_SPEC_KEYS = frozenset({"type", "schedule", "payload", "task_id", "labels"})
_FIELD = re.compile(r"[A-Za-z_][\w.\[\]]*: ")


def parse_specs(items: list[Any]) -> tuple[list[TaskSpec], list[str]]:
    """Many specs (a bulk create): (specs, problems naming ``[index].field``).

    The same as ``parse_spec`` item by item, but each distinct schedule is structured once:
    a bulk of thousands usually shares a few schedules, and building one is most of the
    cost. Anything unusual takes the general path, so the errors are the same.
    """
    specs: list[TaskSpec] = []
    problems: list[str] = []
    schedules: dict[tuple[Any, ...], Schedule] = {}
    for i, item in enumerate(items):
        try:
            specs.append(_fast_spec(item, schedules) or parse_spec(item))
        except InvalidTask as exc:
            problems += [f"[{i}].{p}" if _FIELD.match(p) else f"[{i}]: {p}"
                         for p in str(exc).split("; ")]  # fmt: skip
    return specs, problems


def _fast_spec(item: Any, schedules: dict[tuple[Any, ...], Schedule]) -> TaskSpec | None:
    if not isinstance(item, dict) or not item.keys() <= _SPEC_KEYS:
        return None
    task_type, schedule, task_id = item.get("type"), item.get("schedule"), item.get("task_id")
    if not isinstance(task_type, str) or not isinstance(schedule, dict):
        return None
    if task_id is not None and not isinstance(task_id, str):
        return None
    labels = item.get("labels", {})
    if not isinstance(labels, dict):
        return None
    # The value's type is part of the key (1 == 1.0 == True, but only some are valid). Key
    # order is not normalised: a client sends its schedules alike, and a different order
    # only costs a cache entry. A nested value is unhashable: the general path takes it.
    try:
        key = tuple((k, type(v), v) for k, v in schedule.items())
        built = schedules.get(key)
    except TypeError:
        return None
    if built is None:
        built = parse_schedule(schedule)
        schedules[key] = built
    return TaskSpec(task_type, built, item.get("payload"), task_id, labels)


#: Longest cron expression a client may submit: a list of every minute of an hour fits
#: three times over; a longer one (a list of a million items) would cost seconds of CPU
#: at every parse, and a cron is parsed at every fire.
MAX_CRON_CHARS = 512


def _check_cron_length(schedule: dict[str, Any]) -> None:
    """A submitted cron's length (``MAX_CRON_CHARS``), checked before it is parsed."""
    cron = schedule.get("cron")
    if isinstance(cron, str) and len(cron) > MAX_CRON_CHARS:
        raise InvalidTask(f"schedule.cron: at most {MAX_CRON_CHARS} characters, got {len(cron)}")


def parse_schedule(data: Any) -> Schedule:
    """A schedule a client submits (JSON), checked before anything parses it."""
    if not isinstance(data, dict):
        raise InvalidTask(f"schedule: must be a JSON object, got {type(data).__name__}")
    _check_cron_length(data)
    try:
        return converter.structure(data, Schedule)
    except (cattrs.BaseValidationError, ValueError, TypeError) as exc:
        raise InvalidTask(describe(exc, "schedule")) from exc


@attrs.frozen
class Task:
    """A task as stored, decoded from its hash."""

    task_id: str
    type: str
    payload: Any
    schedule: Schedule
    status: Status
    created_ms: int
    updated_ms: int
    next_run_ms: int | None
    fires: int
    runs: int
    retries: int
    last_run_ms: int | None
    last_status: str | None
    last_error: str | None
    labels: dict[str, str] = attrs.field(factory=dict)
    last_fate: str | None = None
    """The fate of its latest occurrence (``GET /v1/tasks/{id}/history``): ``ok``,
    ``failed``, ``dead``, ``cancelled``, ``skipped`` or ``coalesced``; None before any."""

    def to_dict(self) -> dict[str, Any]:
        out = attrs.asdict(self, recurse=False)
        out["schedule"] = self.schedule.to_dict()
        return out

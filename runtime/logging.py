"""Structured logs: one JSON object per line on stdout, or console lines for humans.

Every line carries ``time`` (UTC ISO-8601), ``ts_ms`` (epoch milliseconds), ``level``,
``event`` and ``node``; actors bind ``actor`` (their path in the tree). Lifecycle events of
actors and tasks are the audit trail, so they are written synchronously and never buffered
in memory where a crash would lose them.

Two paths to the same stream:

- ``get_logger()``: structlog, for everything (~50 us a line here);
- ``emit_events()``: for the per-fire lifecycle events that come by the thousand per second
  (scheduled, queued, running, finished...). It writes the same fields in one ``write``
  per batch at a few microseconds a line, so an audit trail of every fire stays affordable;
  ``emit_encoded()`` writes a batch of lines whose fields are already text (a finished
  fire's, shared with its results line).

Event observers (``observe_events``) see every event of both paths, whatever the level
filters out, batch by batch: metrics are counted from the same events the log records
(``actors/observability/metrics.py``), so the two agree (the counts written within about
0.25 s where a node gathers them). Where a batch's per-fire lines are built only as text
(``finished``) or not at all (debug lines at ``info``), they get one summary event for the
batch instead (``runs_finished``, ``fires_queued``, ``runs_started``).
"""

from __future__ import annotations

import datetime
import fcntl
import functools
import json
import logging
import os
import re
import stat
import sys
import time
from collections.abc import Callable, Iterable, MutableMapping, Sequence
from typing import Any, TextIO, cast

import attrs
import structlog


def _epoch_ms(
    _logger: Any, _name: str, event: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    event["ts_ms"] = int(time.time() * 1000)
    return event


def _dumps(obj: Any, **_kw: Any) -> str:
    return json.dumps(obj, default=str, separators=(",", ":"))


@attrs.define
class _Output:
    """Where ``emit_events`` writes; set by ``configure``. Owned by this module."""

    stream: TextIO | None = None
    node: str = "?"
    info_enabled: bool = True
    debug_enabled: bool = False
    console: bool = False


_output = _Output()

Events = Sequence[tuple[str, dict[str, Any]]]
EventObserver = Callable[[str, Events], None]
"""Called with (actor path, [(event, fields), ...]) for every batch of events."""
_observers: list[EventObserver] = []


def observe_events(observer: EventObserver) -> None:
    """Call ``observer`` for every event this process logs from now on (both paths)."""
    if observer not in _observers:
        _observers.append(observer)


def stop_observing(observer: EventObserver) -> None:
    if observer in _observers:
        _observers.remove(observer)


def _notify(actor: str, events: Events) -> None:
    for observer in _observers:
        observer(actor, events)


def notify_observers(actor: str, events: Events) -> None:
    """Hand events to the observers only: no line is written. For a batch's summary
    where its per-fire debug lines are not written (``fires_queued``, ``runs_started``):
    building a line's fields for every fire only to count it cost ~1 µs a fire a role."""
    if _observers:
        _notify(actor, events)


def _observe_structlog(
    _logger: Any, _name: str, event: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """structlog processor: hand each line to the observers (lines ``emit_events`` wrote
    through structlog in console mode were handed over already)."""
    if event.pop("_observed", False) or not _observers:
        return event
    _notify(str(event.get("actor", "")), [(str(event.get("event")), dict(event))])
    return event


def _below(threshold: int, _logger: Any, name: str, event: MutableMapping[str, Any]) -> Any:
    """structlog processor: drop a line below the configured level, once observed."""
    if _LEVEL_NUMBERS.get(name, logging.INFO) < threshold:
        raise structlog.DropEvent
    return event


#: structlog's method names as levels (``exception`` is ``error``).
_LEVEL_NUMBERS = {
    "debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
    "warn": logging.WARNING, "error": logging.ERROR, "exception": logging.ERROR,
    "critical": logging.CRITICAL, "fatal": logging.CRITICAL, "msg": logging.INFO,
}  # fmt: skip


def configure(
    *, node: str, format: str = "json", level: str = "info", stream: TextIO | None = None
) -> None:
    """Set up logging for this process. Call once, before the first actor starts."""
    _output.stream = stream
    _output.node = node
    _output.info_enabled = level in ("debug", "info")
    _output.debug_enabled = level == "debug"
    _output.console = format == "console"
    renderer: Any
    if format == "console":
        renderer = structlog.dev.ConsoleRenderer(colors=False)
    else:
        renderer = structlog.processors.JSONRenderer(serializer=_dumps)
    exc_processors: list[Any] = (
        [] if format == "console" else [structlog.processors.format_exc_info]
    )
    threshold = logging.getLevelName(level.upper())
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            _observe_structlog,  # every line counts, whatever is written (below)
            functools.partial(_below, threshold),
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True, key="time"),
            _epoch_ms,
            *exc_processors,
            renderer,
        ],
        # Lines below info are dropped before any processor (debug calls cost nothing);
        # those of info and up reach the observers (metrics count restarts, refusals,
        # held-back steps: warnings) and are written from the configured level.
        wrapper_class=structlog.make_filtering_bound_logger(min(threshold, logging.INFO)),
        logger_factory=structlog.WriteLoggerFactory(file=stream or _STDOUT),
        cache_logger_on_first_use=False,
    )
    structlog.contextvars.clear_contextvars()
    structlog.contextvars.bind_contextvars(node=node)


def output_is_a_file() -> bool:
    """Whether this process writes its lines to a regular file opened for appending (its
    stdout redirected with ``>>``, systemd's ``append:``): children it starts may then
    write there themselves. Each batch of lines is one ``write``, which a local
    filesystem appends whole, so lines of different processes never interleave, also
    those of a killed node's children still stopping beside its successor's. A file
    opened without ``O_APPEND`` (each process at its own offset once another opens it),
    a pipe, a socket or a terminal (whole only up to 4 KiB) has its lines relayed
    (``runtime.process``)."""
    if _output.stream is not None:
        return False
    try:
        fd = sys.stdout.fileno()
        regular = stat.S_ISREG(os.fstat(fd).st_mode)
        return regular and bool(fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_APPEND)
    except (AttributeError, OSError, ValueError):  # replaced, closed or without a descriptor
        return False


def write_lines(text: str) -> None:
    """Write complete lines that are already formatted (a child process's, relayed by its
    node: one writer per stream, so lines of different processes never interleave)."""
    stream = _output.stream or _STDOUT
    stream.write(text)
    stream.flush()


class Lenient:
    """Where a process's lines go (its stdout, or ``stream``): a write that fails is
    dropped instead of raised into the actor that logged it. A raise crashed that actor,
    whose supervisor's own line failed too, up to the root: the node stopped (exit 1) and
    crash-looped while, say, its log file's disk was full (ENOSPC), or stopped at once
    when a pipe's reader went away (EPIPE): a child process whose node is gone, a log
    shipper that died. A broken pipe is given up on; any other error is tried again at
    the next write. Only writes and flushes (``to_parent`` and ``_STDOUT`` give it the
    ``TextIO`` type ``configure`` takes)."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self._stream = stream
        """None: ``sys.stdout`` as it is at each write (tests replace it)."""
        self._broken = False

    def write(self, text: str) -> int:
        if not self._broken:
            try:
                return (self._stream or sys.stdout).write(text)
            except BrokenPipeError:
                self._broken = True
            except OSError:
                pass
        return len(text)

    def flush(self) -> None:
        if not self._broken:
            try:
                (self._stream or sys.stdout).flush()
            except BrokenPipeError:
                self._broken = True
            except OSError:
                pass


#: The process's stdout, written leniently.
_STDOUT = cast(TextIO, Lenient())


def to_parent(stream: TextIO) -> TextIO:
    """A child process's stdout (the node's log file, or a pipe to its node) as it writes
    its lines: ``Lenient`` (once its node is gone, lines have nowhere to go)."""
    return cast(TextIO, Lenient(stream))


# One C-accelerated encoder for every fast-path line: a dict per line is encoded in C,
# several times faster than assembling the line field by field in Python.
_encode_line = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, default=str).encode


#: Strings that need no escaping in JSON: ids, types, names (the ones most fields hold).
_PLAIN = re.compile(r"[A-Za-z0-9_.:/ -]*").fullmatch
_KEYS: dict[str, str] = {}


def _value(value: Any) -> str:
    kind = type(value)
    if kind is int:
        return str(value)
    if value is None:  # what most handlers return: 0.6 µs a fire through the encoder
        return "null"
    if kind is str and _PLAIN(value):
        return f'"{value}"'
    return _encode_line(value)


def _encode_fields(fields: dict[str, Any]) -> str:
    """``,"key":value`` for each field: ints and plain strings (nearly every value of a
    lifecycle line) formatted directly, anything else by the C encoder. ~2.5x faster per
    line than encoding a merged dict, and at several lines per fire that matters."""
    out = []
    for key, value in fields.items():
        prefix = _KEYS.get(key)
        if prefix is None:
            prefix = _KEYS[key] = f",{_encode_line(key)}:"
        out.append(prefix + _value(value))
    return "".join(out)


class FixedFields:
    """Lines whose fields are always ``keys``, in that order: ints, and the ``text`` ones
    names and ids (a finished fire's line, one a fire). Encoded with one ``%`` format
    when those names need no escaping (the check is one regex match for them all), else as
    ``encode_fields`` does: the same text either way, ~2x faster than ``encode_fields``.
    Values at the other keys must be ints (the callers' types say so)."""

    def __init__(self, keys: Sequence[str], text: Sequence[str]) -> None:
        self.keys = tuple(keys)
        self._text = [self.keys.index(key) for key in text]
        self._template = "".join(
            f',{_encode_line(key)}:"%s"' if key in text else f",{_encode_line(key)}:%s"
            for key in (key.replace("%", "%%") for key in self.keys)
        )

    def fields(self, values: Sequence[Any]) -> dict[str, Any]:
        """The line's fields as a dict (what observers get)."""
        return dict(zip(self.keys, values, strict=True))

    def encode(self, values: tuple[Any, ...]) -> str:
        """``encode_fields(self.fields(values))``, the fast way when it can."""
        if _PLAIN(" ".join([values[i] for i in self._text])):
            return self._template % values
        return _encode_fields(self.fields(values))

    def encode_many(self, rows: Sequence[tuple[Any, ...]]) -> list[str]:
        """``encode`` of each row, with one check for the names of them all (a batch of a
        type's fires): ~40 % less per line than ``encode`` one by one."""
        text = self._text
        if _PLAIN(" ".join([row[i] for row in rows for i in text])):
            template = self._template
            return [template % row for row in rows]
        return [self.encode(row) for row in rows]


#: ``,"key":value`` for each field, as a lifecycle line has them (what ``emit_encoded`` takes).
encode_fields = _encode_fields
#: One value as a lifecycle line encodes it.
encode_value = _value


def encode_object(fields: dict[str, Any]) -> str:
    """One JSON object, encoded the fast way lifecycle lines are (see ``_encode_fields``)."""
    return "{" + _encode_fields(fields)[1:] + "}" if fields else "{}"


def debug_enabled() -> bool:
    """Whether debug lines are written: callers skip building lines nobody reads."""
    return _output.debug_enabled


def emit_events(
    actor: str,
    events: Iterable[tuple[str, dict[str, Any]]],
    level: str = "info",
) -> None:
    """Write lifecycle lines at ``level`` ("info" or "debug"), one per ``(event, fields)``,
    in one write. Observers (metrics) get every event whatever the level.

    The lines carry the same keys as structlog's (``event``, fields, ``node``, ``actor``,
    ``level``, ``time``, ``ts_ms``); the time is taken once for the batch.
    """
    events = events if isinstance(events, list) else list(events)
    if _observers:
        _notify(actor, events)
    if not (_output.debug_enabled if level == "debug" else _output.info_enabled):
        return
    if _output.console:
        _to_structlog(actor, level, events)
        return
    _write(actor, level, [event for event, _ in events], [_encode_fields(f) for _, f in events])


def emit_encoded(
    actor: str,
    event: str,
    bodies: Sequence[str],
    summary: tuple[str, dict[str, Any]],
    fields: Callable[[], Iterable[dict[str, Any]]],
) -> None:
    """Write one info line ``event`` per body, each the line's fields already encoded
    (``FixedFields.encode_many``), in one write: a batch of finished fires. Observers get
    ``summary``, one event for the batch (``runs_finished``: the type and every run's
    duration), instead of each line's fields as a dict: building a dict a fire only to
    count it cost ~1.5 µs a fire. ``fields`` gives those dicts where lines are rendered
    by structlog (console format)."""
    if not bodies:
        return
    notify_observers(actor, [summary])
    if not _output.info_enabled:
        return
    if _output.console:
        _to_structlog(actor, "info", [(event, f) for f in fields()])
        return
    _write(actor, "info", [event] * len(bodies), bodies)


def _to_structlog(actor: str, level: str, events: Iterable[tuple[str, dict[str, Any]]]) -> None:
    logger = get_logger(actor=actor)
    log = logger.debug if level == "debug" else logger.info
    for event, fields in events:
        log(event, _observed=True, **fields)


def _write(actor: str, level: str, events: Sequence[str], bodies: Sequence[str]) -> None:
    """One JSON line per event name and its encoded fields, all in one write."""
    if not events:
        return
    now = time.time()
    tail = {
        "node": _output.node,
        "actor": actor,
        "level": level,
        "time": datetime.datetime.fromtimestamp(now, datetime.UTC).strftime(
            "%Y-%m-%dT%H:%M:%S.%fZ"
        ),
        "ts_ms": int(now * 1000),
    }
    tail_json = _encode_line(tail)[1:]  # '"node":…}': the same for every line of the batch
    lines = [
        f'{{"event":{_value(event)}{body},{tail_json}'
        for event, body in zip(events, bodies, strict=True)
    ]
    stream = _output.stream or _STDOUT
    stream.write("\n".join(lines) + "\n")
    stream.flush()


def get_logger(**bound: Any) -> structlog.typing.FilteringBoundLogger:
    logger: structlog.typing.FilteringBoundLogger = structlog.get_logger().bind(**bound)
    return logger

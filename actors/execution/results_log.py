"""The results log (the seed's "business log"): one JSON line per finished fire, on disk.

Lines carry ``task_id``, ``schedule_id``, ``type``, ``attempt``, ``msg_id``, ``due_ms``,
``queued_ms``, ``started_ms``, ``finished_ms``, ``start_lag_ms``, ``duration_ms`` (the fire's
``finished`` log line, encoded once for both) and the handler's ``result``. A line is
written and flushed to the OS before its message is acknowledged, so a fire whose line
is missing after its process died was not acknowledged and will run again (a host that
loses power may lose the last lines the OS had not yet put on disk: they are not synced
to disk per batch, which would cost a disk flush each); downstream de-duplicates on
``schedule_id`` (task id + due time), since at-least-once can write a line twice. A write
that fails (the disk full, a permission taken away) is tried again until it goes through
(``append_waiting``): the batch waits, acknowledged after its lines, never run again for
want of them.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from pathlib import Path
from typing import Any

import attrs
import structlog
import trio

from runtime.intensity import backoff_s
from runtime.logging import encode_object, encode_value, get_logger

#: The wait between tries of a results-log write that failed: doubling from the first to
#: the second.
RETRY_S = (0.1, 2.0)
#: Least time between two ``results_log_not_rotated`` lines of a process: every write
#: past the size tries the rotation again.
NOT_ROTATED_EVERY_S = 60.0
_not_rotated_at: dict[str, float] = {}
#: The logs (by path) whose next write checks first that the file ends a line: a write
#: there failed, perhaps cut short, or this process has not written there yet (one before
#: it may have been killed halfway through a write). Kept by path for the process, not by
#: the write: the write tried next may be another consumer's, or the last flush of one
#: whose tries were cut off.
_unchecked: set[str] = set()


def _warn_not_rotated(path: Path, exc: OSError) -> None:
    now = time.monotonic()
    if now - _not_rotated_at.get(str(path), -NOT_ROTATED_EVERY_S) >= NOT_ROTATED_EVERY_S:
        _not_rotated_at[str(path)] = now
        get_logger(actor="results_log").warning(
            "results_log_not_rotated", path=str(path), error=str(exc)
        )


def result_line(fields_json: str, result: Any) -> str:
    """A results-log line from a ``finished`` line's encoded fields (``encode_fields``:
    ``,"key":value...``) and the handler's result (``encode_result``)."""
    return f'{{{fields_json[1:]},"result":{encode_result(result)}}}'


def encode_result(result: Any) -> str:
    """A handler's result as JSON. What JSON cannot carry is written as its text (a dict
    with keys that are not strings, NaN, an object: its ``str``), never raised: the fire
    ran, and an error here would leave its batch unacknowledged, to run again. A lone
    surrogate is escaped when the line is written (``append_lines``)."""
    kind = type(result)
    try:
        if result is None or kind is int or kind is str:  # most results: the fast encoder
            return encode_value(result)  # (an int past 4,300 digits has no text: raises)
        return _encode_result(result)
    except Exception:
        return encode_value(_text_of(result))


#: Strict JSON (no NaN or Infinity, which JSON has no number for), objects by their ``str``.
_encode_result = json.JSONEncoder(
    separators=(",", ":"), ensure_ascii=False, default=str, allow_nan=False
).encode


def _text_of(value: Any) -> str:
    try:
        return str(value)
    except Exception:
        return f"<{type(value).__name__} without text>"


@attrs.frozen
class ResultsLog:
    """Appends to ``path``, rotating it at ``max_bytes`` (0 = never) into ``path.1`` ..
    ``path.<backups>``. Several processes of a node may share one log: each write opens
    the file by name (so a rotation, ours or logrotate's, takes effect at the next write
    of every process), and rotating is done under an exclusive lock on ``path.lock`` by
    whichever process first sees the size reached, after checking it again."""

    path: Path
    max_bytes: int = 0
    backups: int = 5

    def prepare(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        _unchecked.add(str(self.path))

    def append(self, records: list[dict[str, Any]]) -> None:
        """Append records, one JSON line each, in one write; flushed before returning."""
        self.append_lines([encode_object(r) for r in records])

    def append_lines(self, lines: list[str]) -> None:
        """Append lines already encoded (``result_line``), in one write; flushed.
        The first write after one that failed (whoever makes it: ``_unchecked``) and a
        process's first write: a file that does not end in a newline (a write cut short)
        gets one first, so the part line stays a line of its own, which readers skip, and
        these lines are whole (not checked on every write: another process's write in
        progress would read as a part line). A rotation that fails is logged and left to
        the next write: these lines are written (a caller trying the write again would
        write them twice)."""
        if not lines:
            return
        # backslashreplace: a lone surrogate (from a handler's result) is written as its
        # JSON escape rather than failing the write, and with it the batch's acknowledgement.
        data = ("\n".join(lines) + "\n").encode("utf-8", "backslashreplace")
        key = str(self.path)
        if key in _unchecked and not self._ends_a_line():
            data = b"\n" + data
        try:
            with self.path.open("ab") as out:
                out.write(data)
                out.flush()
                size = out.tell()
        except OSError:
            _unchecked.add(key)
            raise
        _unchecked.discard(key)
        if self.max_bytes and size >= self.max_bytes:
            try:
                self.rotate()
            except OSError as exc:
                _warn_not_rotated(self.path, exc)

    def _ends_a_line(self) -> bool:
        """Whether the file is empty, missing, unreadable, or ends in a newline."""
        try:
            with self.path.open("rb") as f:
                size = f.seek(0, os.SEEK_END)
                if not size:
                    return True
                f.seek(size - 1)
                return f.read(1) == b"\n"
        except OSError:  # missing, or not readable: the write says what is wrong
            return True

    def rotate(self) -> None:
        lock_path = self.path.with_name(self.path.name + ".lock")
        with lock_path.open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                if not self.path.exists() or self.path.stat().st_size < self.max_bytes:
                    return  # another process rotated it meanwhile
                self._backup(self.backups).unlink(missing_ok=True)
                for n in range(self.backups - 1, 0, -1):
                    if self._backup(n).exists():
                        self._backup(n).rename(self._backup(n + 1))
                self.path.rename(self._backup(1))
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _backup(self, n: int) -> Path:
        return self.path.with_name(f"{self.path.name}.{n}")


async def append_waiting(
    results: ResultsLog, lines: list[str], log: structlog.typing.FilteringBoundLogger
) -> None:
    """``results.append_lines(lines)``, tried again (cancellably, with a doubling pause)
    until it goes through: the disk full, or the file's directory or permission taken
    away. One ``results_log_failed`` error line when the first try fails, one
    ``results_log_written`` line (with the wait) once a try goes through."""
    failures, since = 0, 0.0
    while True:
        try:
            results.append_lines(lines)
        except OSError as exc:
            if not failures:
                since = trio.current_time()
                log.error(
                    "results_log_failed", path=str(results.path), error=str(exc), lines=len(lines)
                )
            failures += 1
            await trio.sleep(backoff_s(failures, *RETRY_S))
            continue
        if failures:
            waited_s = round(trio.current_time() - since, 3)
            log.info("results_log_written", path=str(results.path), waited_s=waited_s)
        return

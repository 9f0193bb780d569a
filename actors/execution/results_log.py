"""The results log (the seed's "business log"): one JSON line per finished fire, on disk.

Lines carry ``task_id``, ``schedule_id``, ``type``, ``attempt``, ``due_ms``, ``started_ms``,
``finished_ms`` and the handler's ``result``. A line is written and flushed to the OS
before its message is acknowledged, so a fire whose line is missing was not acknowledged
and will run again; downstream de-duplicates on ``schedule_id`` (task id + due time),
since at-least-once can write a line twice.
"""

from __future__ import annotations

import fcntl
from pathlib import Path
from typing import Any

import attrs

from runtime.logging import encode_object


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

    def append(self, records: list[dict[str, Any]]) -> None:
        """Append records, one JSON line each, in one write; flushed before returning."""
        if not records:
            return
        text = "\n".join(encode_object(r) for r in records) + "\n"
        with self.path.open("a", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            size = out.tell()
        if self.max_bytes and size >= self.max_bytes:
            self.rotate()

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

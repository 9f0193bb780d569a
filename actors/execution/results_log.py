"""The results log (the seed's "business log"): one JSON line per finished fire, on disk.

Lines carry ``task_id``, ``schedule_id``, ``type``, ``attempt``, ``due_ms``, ``started_ms``,
``finished_ms`` and the handler's ``result``. A line is written and flushed to the OS
before its message is acknowledged, so a fire whose line is missing was not acknowledged
and will run again; downstream de-duplicates on ``schedule_id`` (task id + due time),
since at-least-once can write a line twice.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs

from runtime.logging import encode_object


@attrs.frozen
class ResultsLog:
    path: Path

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

"""JSON answers that cannot fail on what Redis holds.

Everything Metronome writes is strict JSON (``encode_json`` refuses NaN and Infinity and
text UTF-8 cannot carry), but another writer's record may hold what JSON text has no form
for: NaN or infinity (also a number too large for a float: ``1e400`` reads as infinity),
or a lone surrogate (``"\\ud800"`` reads as one, and UTF-8 cannot encode it). Rendered
strictly, one such value would turn every read that shows it into a 500; here a
non-finite number is shown as its name, a string (``"NaN"``, ``"Infinity"``,
``"-Infinity"``), a lone surrogate as its ``\\u`` escape, and everything else as stored.
"""

from __future__ import annotations

import json
import math
from typing import Any

from starlette.responses import JSONResponse


class JsonAnswer(JSONResponse):
    """Starlette's strict JSON response, with what JSON text cannot carry shown as above."""

    def render(self, content: Any) -> bytes:
        try:
            return super().render(content)
        except ValueError:  # a non-finite number, or a lone surrogate (UnicodeEncodeError)
            text = json.dumps(
                finite(content), ensure_ascii=True, allow_nan=False, separators=(",", ":")
            )
            return text.encode("ascii")


def finite(value: Any) -> Any:
    """``value`` with every NaN or infinite float, at any depth, as its name: walked with
    a stack of its own, not by recursion (a payload nested deeper than Python's recursion
    limit is answered too)."""
    root = [value]
    todo: list[tuple[Any, Any]] = [(root, 0)]
    while todo:
        holder, key = todo.pop()
        item = holder[key]
        if isinstance(item, float) and not math.isfinite(item):
            holder[key] = "NaN" if math.isnan(item) else ("Infinity" if item > 0 else "-Infinity")
        elif isinstance(item, dict):
            copy = dict(item)
            holder[key] = copy
            todo += [(copy, k) for k in copy]
        elif isinstance(item, list | tuple):
            items = list(item)
            holder[key] = items
            todo += [(items, i) for i in range(len(items))]
    return root[0]

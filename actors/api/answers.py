"""JSON answers that cannot fail on what Redis holds.

Everything Metronome writes is strict JSON (``encode_json`` refuses NaN and Infinity), but
another writer's record, or a number too large for a float (``1e400`` reads as
infinity), may carry a value JSON has no form for. Rendered strictly, one such value
would turn every read that shows it into a 500; here it is shown as its name, a string
(``"NaN"``, ``"Infinity"``, ``"-Infinity"``), and everything else as stored.
"""

from __future__ import annotations

import math
from typing import Any

from starlette.responses import JSONResponse


class JsonAnswer(JSONResponse):
    """Starlette's strict JSON response, with non-finite numbers shown as strings."""

    def render(self, content: Any) -> bytes:
        try:
            return super().render(content)
        except ValueError:  # "Out of range float values are not JSON compliant"
            return super().render(finite(content))


def finite(value: Any) -> Any:
    """``value`` with every NaN or infinite float, at any depth, as its name."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value

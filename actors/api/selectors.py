"""Task filters as clients give them: the listing's query (``GET /v1/tasks?type=&status=
&label=k=v&next_before=&last_status=``) and an action's selector (``POST
/v1/tasks/actions``, the same filters as a JSON object, plus ``ids`` and ``all``). Both
end in ``checked_filter`` (``TaskFilter``'s own checks), so a filter means and refuses
the same in either place; a refusal is a 422 naming the field.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from actors.api.problems import invalid
from actors.domain.errors import InvalidTask
from actors.domain.labels import MAX_LABELS, parse_label_filters
from actors.store.labels import TaskFilter
from actors.store.selection import Selector

#: The keys of an action's selector.
SELECTOR_KEYS = (
    "type", "status", "labels", "next_before", "last_status", "last_fate", "ids", "all",
)  # fmt: skip
#: The largest ``next_before`` accepted (Unix ms; as the listing's parameter).
MAX_NEXT_BEFORE = 10**15


def checked_filter(
    task_type: Any, status: Any, labels: Mapping[str, str], next_before: Any, last_status: Any,
    where: str = "", last_fate: Any = None,
) -> TaskFilter:  # fmt: skip
    """The filter, or a 422 naming the field (prefixed by ``where``)."""
    named = (("type", task_type), ("status", status), ("last_status", last_status),
             ("last_fate", last_fate))  # fmt: skip
    for name, value in named:
        if value is not None and not isinstance(value, str):
            raise invalid(f"{where}{name}: must be a string, got {type(value).__name__}")
    if next_before is not None and (
        not isinstance(next_before, int) or isinstance(next_before, bool)
        or not 0 <= next_before <= MAX_NEXT_BEFORE
    ):  # fmt: skip
        raise invalid(f"{where}next_before: must be Unix ms (an integer within 0..10^15)")
    try:
        return TaskFilter(task_type, status, dict(labels), next_before, last_status, last_fate)
    except InvalidTask as exc:
        raise invalid(f"{where}{exc}") from None


def query_filter(query: Any) -> TaskFilter:
    """``GET /v1/tasks``'s filters: ``type``, ``status``, ``label=k=v`` (repeatable, all
    must match), ``next_before`` (Unix ms), ``last_status`` (an outcome) and ``last_fate``
    (the latest occurrence's fate)."""
    try:
        labels = parse_label_filters(query.getlist("label"))
    except InvalidTask as exc:
        raise invalid(str(exc)) from None
    raw = query.get("next_before")
    if raw is not None and (not (raw.isascii() and raw.isdecimal()) or len(raw) > 16):
        raise invalid(f"next_before: must be Unix ms (a non-negative integer), got {raw!r}")
    next_before = None if raw is None else int(raw)
    return checked_filter(
        query.get("type"), query.get("status"), labels, next_before, query.get("last_status"),
        last_fate=query.get("last_fate"),
    )  # fmt: skip


def body_selector(data: Any, every: Any = False) -> Selector:
    """An action's ``selector`` object (``every``: the body's ``all``, the same as the
    selector's own)."""
    if not isinstance(data, dict):
        raise invalid("selector: must be a JSON object of filters (type, status, labels, ...)")
    unknown = sorted(set(data) - set(SELECTOR_KEYS))
    if unknown:
        known = ", ".join(SELECTOR_KEYS)
        raise invalid("; ".join(f"selector.{k}: unknown key (known: {known})" for k in unknown))
    labels = data.get("labels")
    labels = {} if labels is None else labels  # [] or "" is a mistake, said below
    if not isinstance(labels, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
    ):
        raise invalid('selector.labels: must be an object of label key -> value, {"k": "v"}')
    if len(labels) > MAX_LABELS:
        raise invalid(f"selector.labels: at most {MAX_LABELS} label filters, got {len(labels)}")
    wanted = checked_filter(
        data.get("type"), data.get("status"), labels, data.get("next_before"),
        data.get("last_status"), "selector.", data.get("last_fate"),
    )  # fmt: skip
    ids = data.get("ids")
    if ids is not None and (not isinstance(ids, list) or not all(isinstance(i, str) for i in ids)):
        raise invalid("selector.ids: must be a list of task ids")
    flags = (data.get("all", False), every)
    if not all(isinstance(f, bool) for f in flags):
        raise invalid("all: must be true or false")
    try:
        return Selector(wanted, None if ids is None else tuple(ids), any(flags))
    except InvalidTask as exc:
        raise invalid(str(exc)) from None

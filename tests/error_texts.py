"""Error texts as a failed run stores them (``describe_error`` of a raised exception),
whose shown line is not their last: shared by the API's and the dashboard's tests of
``error_line``."""

from __future__ import annotations

from actors.execution.completion import describe_error


def raised(exc: Exception) -> str:
    """What ``describe_error`` keeps of ``exc`` once raised (its traceback and all)."""
    try:
        raise exc
    except Exception as caught:
        return describe_error(caught)


def chained() -> str:
    """An error raised from another (both tracebacks, the cause first)."""
    try:
        try:
            raise OSError("connection reset")
        except OSError as cause:
            raise RuntimeError("sync failed\nretry later") from cause
    except RuntimeError as exc:
        return describe_error(exc)


def noted() -> KeyError:
    exc = KeyError("account")
    exc.add_note("while syncing the ledger for account 7")
    return exc


#: (stored text, the line shown for it).
EXAMPLES = [
    (raised(ValueError("bad row 7\n  expected 3 columns\ngot 2")), "ValueError: bad row 7"),
    (raised(noted()), "KeyError: 'account'"),
    (chained(), "RuntimeError: sync failed"),
    (raised(ValueError("\nbad row 9")), "ValueError: bad row 9"),
    (raised(RuntimeError("failed at 10%\r100%")), "RuntimeError: failed at 10%\r100%"),
    ("timeout: handler ran longer than 3s", "timeout: handler ran longer than 3s"),
]

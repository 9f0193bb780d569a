"""The CLI's exit statuses (the table in ``actors.admin.cli``'s docstring) and what a
command hands back to be printed, so every command module speaks the same contract."""

from __future__ import annotations

from typing import Any

from actors.admin.client import ApiError

EXIT_OK, EXIT_OTHER, EXIT_USAGE = 0, 1, 2
EXIT_NOT_FOUND, EXIT_CONFLICT, EXIT_INVALID, EXIT_AUTH, EXIT_UNAVAILABLE = 3, 4, 5, 6, 7

Result = tuple[Any, str] | tuple[Any, str, int]
"""(the API's JSON answer, its human rendering[, the exit status when not 0])."""


def exit_code(error: ApiError) -> int:
    """The exit status an API error becomes: one per kind of failure a script may test."""
    if error.status == 404:
        return EXIT_NOT_FOUND
    if error.status == 409:
        return EXIT_CONFLICT
    if error.status in (400, 413, 422):
        return EXIT_INVALID
    if error.status in (401, 403):
        return EXIT_AUTH
    if error.status in (502, 503, 504):  # Redis or a node away: try again later
        return EXIT_UNAVAILABLE
    return EXIT_OTHER  # a 500: a record that cannot be read, a bug (the node log says)

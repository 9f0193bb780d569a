"""One row of the route table: what an endpoint does and how it is documented.

The route table (``actors.api.app.ROUTES``) is the one list of endpoints: the app's
routes, the query parameters each accepts (anything else is refused with 422) and the
OpenAPI document (``actors.api.openapi``) are all built from it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import attrs


@attrs.frozen
class Endpoint:
    method: str
    path: str
    """Starlette's template; ``{name}`` parameters are documented from ``openapi.PARAMS``."""
    handler: Callable[[Any], Awaitable[Any]]
    summary: str
    ok: dict[int, str]
    """Success statuses and the name of each one's response schema."""
    body: str | None = None
    """The request body's schema name, if it takes one."""
    body_optional: bool = False
    """Whether the body may be left out (empty)."""
    query: tuple[str, ...] = ()
    """Query parameters it accepts (documented from ``openapi.PARAMS``)."""
    problems: tuple[int, ...] = ()
    """Problem statuses beyond those every signed request can get."""
    public: bool = False
    """Unsigned (health probes)."""

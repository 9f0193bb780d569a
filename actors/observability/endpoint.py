"""``GET /metrics``: on the API, and on a listener of its own (``[metrics] bind``) for
nodes without an API. Either way the answer sums every process of the node
(``runtime.metrics``) and adds the gauges read from Redis (``redis_gauges``), and the same
``ScrapeGate`` decides who may scrape (``[metrics] allow`` and ``token_env``).

Also what every HTTP answer of a node carries, whichever listener serves it: the security
headers (``SecurityHeaders``), and the hypercorn serving itself (``serve_http``).
"""

from __future__ import annotations

import functools
import hmac
import ipaddress
import json
import logging
from collections.abc import Callable
from typing import Any

import hypercorn.config
import hypercorn.trio
import trio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from actors.config import IPNetwork, MetricsSection
from actors.observability.redis_gauges import RedisGauges
from actors.store.tasks import TaskStore
from runtime.actor import ActorContext, TaskStatus
from runtime.metrics import exposition

#: Sent with every answer of a node's HTTP listeners. The policy is the dashboard's: its
#: own script, style sheet and API calls only; no inline script or style, no eval, no
#: framing (clickjacking its write buttons), no plugins, forms posting nowhere else.
SECURITY_HEADERS: dict[str, str] = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
        "frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}
_ENCODED_HEADERS = [(k.lower().encode(), v.encode()) for k, v in SECURITY_HEADERS.items()]


class SecurityHeaders:
    """ASGI middleware: ``SECURITY_HEADERS`` on every HTTP response of ``app`` (errors and
    static files included), so no route can forget them."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                names = {name.lower() for name, _ in message.get("headers", [])}
                extra = [(k, v) for k, v in _ENCODED_HEADERS if k not in names]
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        await self.app(scope, receive, send_with_headers)


class ScrapeGate:
    """Who may read ``/metrics``: ``[metrics] allow`` (client networks; others get 403)
    and ``[metrics] token_env`` (a bearer token; without it, 401). The metrics name every
    task type with its rates and backlog: an operator may keep them from the network."""

    def __init__(self, section: MetricsSection) -> None:
        self.networks: list[IPNetwork] = section.networks()
        token = section.token()
        self.token: bytes | None = token.encode() if token is not None else None

    def refusal(self, request: Request) -> Response | None:
        """None when ``request`` may scrape, else the answer that refuses it."""
        if self.networks and not self.allows(request.client.host if request.client else None):
            return refused(403, "forbidden", "this client's address may not read the metrics")
        if self.token is not None and not self._token_matches(request):
            return refused(401, "bad_token", "send Authorization: Bearer <the metrics token>")
        return None

    def allows(self, host: str | None) -> bool:
        """Whether a client at ``host`` (the TCP peer) is in an allowed network."""
        try:
            address = ipaddress.ip_address(host or "")
        except ValueError:  # a Unix socket's peer has no address
            return False
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped  # a dual-stack listener's view of an IPv4 client
        return any(address in network for network in self.networks)

    def _token_matches(self, request: Request) -> bool:
        scheme, _, credentials = request.headers.get("authorization", "").partition(" ")
        # Constant time: the comparison must not say how much of a guess was right.
        presented = credentials.strip().encode()
        return scheme.lower() == "bearer" and hmac.compare_digest(presented, self.token or b"")


def refused(status: int, code: str, detail: str) -> Response:
    """A refused scrape as RFC 9457 problem details, like the API's refusals."""
    title = {401: "Not authenticated", 403: "Forbidden"}.get(status, "Not found")
    body = {"type": f"urn:metronome:problem:{code}", "title": title, "status": status,
            "code": code, "detail": detail}  # fmt: skip
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return Response(json.dumps(body), status, headers, media_type="application/problem+json")


async def metrics_response(gauges: RedisGauges) -> Response:
    await gauges.refresh()
    body, content_type = exposition([gauges])
    return Response(body, media_type=content_type)


def _count_statuses(
    nursery: trio.Nursery, gauges: RedisGauges, interval_s: float
) -> trio.CancelScope:
    """Count tasks by status in ``nursery`` every ``interval_s`` (0: never); the returned
    scope stops it."""
    scope = trio.CancelScope()

    async def count() -> None:
        with scope:
            if interval_s:
                await gauges.count_statuses_forever(interval_s)

    nursery.start_soon(count)
    return scope


async def serve_http(
    ctx: ActorContext,
    app: Any,
    bind: str,
    gauges: RedisGauges,
    status_count_interval_s: float,
    listening: Callable[[list[str]], None],
    *,
    task_status: TaskStatus,
) -> None:
    """Serve ``app`` (ASGI) with hypercorn's trio worker on ``bind`` until the actor is
    asked to stop, then stop gracefully within its grace; meanwhile count tasks by status
    for ``gauges``. What the API actor and the ``/metrics`` listener share; ``listening``
    gets the URLs before the actor reports itself started."""
    config = hypercorn.config.Config()
    config.bind = [bind]
    config.accesslog = None  # the API logs every signed request itself, as JSON
    # Hypercorn's own errors (protocol-level only: the app catches its own) go to the
    # standard logging module, which prints warnings and worse to stderr.
    config.errorlog = logging.getLogger("hypercorn.error")
    config.graceful_timeout = ctx.cleanup_grace_s
    serve = functools.partial(
        hypercorn.trio.serve, app, config, shutdown_trigger=ctx.wait_stop_requested
    )
    async with trio.open_nursery() as nursery:
        urls = await nursery.start(serve)
        listening(urls)
        counting = _count_statuses(nursery, gauges, status_count_interval_s)
        task_status.started(urls)
        await ctx.wait_stop_requested()
        counting.cancel()  # hypercorn stops gracefully on the same request


class MetricsServer:
    """The ``[metrics] bind`` listener: ``/metrics`` and nothing else, on hypercorn."""

    def __init__(self, store: TaskStore, section: MetricsSection) -> None:
        assert section.bind is not None
        self.gauges = RedisGauges(store, section.cache_s)
        self.gate = ScrapeGate(section)
        self.bind = section.bind
        self.status_count_interval_s = section.status_count_interval_s

    def app(self) -> ASGIApp:
        """The listener's ASGI app: ``/metrics`` behind the gate, anything else a 404, and
        the security headers on every answer."""

        async def metrics(request: Request) -> Response:
            return self.gate.refusal(request) or await metrics_response(self.gauges)

        async def not_found(_request: Request, _exc: Exception) -> Response:
            return refused(404, "no_route", "this listener serves /metrics alone")

        routes = [Route("/metrics", metrics, methods=["GET"])]
        return SecurityHeaders(Starlette(routes=routes, exception_handlers={404: not_found}))

    async def run(self, ctx: ActorContext, *, task_status: TaskStatus) -> None:
        await serve_http(
            ctx, self.app(), self.bind, self.gauges, self.status_count_interval_s,
            lambda urls: ctx.log.info("metrics_listening", urls=urls), task_status=task_status,
        )  # fmt: skip

"""``GET /metrics``: on the API (public, like the probes), and on a listener of its own
(``[metrics] bind``) for nodes without an API. Either way the answer sums every process of
the node (``runtime.metrics``) and adds the gauges read from Redis (``redis_gauges``).
"""

from __future__ import annotations

import functools
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

from actors.config import MetricsSection
from actors.observability.redis_gauges import RedisGauges
from actors.store.tasks import TaskStore
from runtime.actor import ActorContext, TaskStatus
from runtime.metrics import exposition


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
        self.bind = section.bind
        self.status_count_interval_s = section.status_count_interval_s

    async def run(self, ctx: ActorContext, *, task_status: TaskStatus) -> None:
        async def metrics(_request: Request) -> Response:
            return await metrics_response(self.gauges)

        app = Starlette(routes=[Route("/metrics", metrics, methods=["GET"])])
        await serve_http(
            ctx, app, self.bind, self.gauges, self.status_count_interval_s,
            lambda urls: ctx.log.info("metrics_listening", urls=urls), task_status=task_status,
        )  # fmt: skip

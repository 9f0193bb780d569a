"""The API actor: serves ``actors.api.routes`` with hypercorn on trio.

It is the last child of the node (``rest_for_one``): it starts once Redis, the scheduler and
the consumers are up, and stops first. Stopping is graceful: a stop request makes hypercorn
refuse new connections and finish requests in flight within the node's grace.

With ``[processes] api = N`` several processes serve one port: each binds its own socket
with ``SO_REUSEPORT`` and the kernel spreads new connections across them (one core each;
hypercorn's HTTP handling is most of a request's CPU).
"""

from __future__ import annotations

import functools
import logging
import socket

import hypercorn.config
import hypercorn.trio
import trio

from actors.api.app import build_app
from actors.api.queues import Queues
from actors.api.routes import ApiServices
from actors.api.signing import ApiKey, Verifier
from actors.config import ApiSection, MetricsSection
from actors.observability.endpoint import start_status_counts
from actors.observability.redis_gauges import RedisGauges
from actors.store.tasks import TaskStore
from runtime.actor import ActorContext, TaskStatus


class ApiServer:
    def __init__(
        self,
        store: TaskStore,
        section: ApiSection,
        keys: list[ApiKey],
        *,
        shared_port: bool,
        metrics: MetricsSection | None = None,
    ) -> None:
        self.store = store
        self.metrics = metrics or MetricsSection()
        self.gauges = RedisGauges(store, self.metrics.cache_s)
        self.section = section
        self.keys = {key.key_id: key for key in keys}
        self.shared_port = shared_port
        """Bind with ``SO_REUSEPORT``: other API processes of this node serve the same port."""

    async def run(self, ctx: ActorContext, *, task_status: TaskStatus) -> None:
        keys = await self.store.client.ride_out(self.store.keys)  # Redis away: wait
        verifier = Verifier(
            self.store.client, keys.nonce_prefix, self.keys, skew_ms=int(self.section.skew_s * 1000)
        )
        services = ApiServices(
            self.store, Queues(self.store), verifier, self.section, ctx.health, self.gauges, ctx.log
        )
        config = hypercorn.config.Config()
        config.bind = [self._shared_bind() if self.shared_port else self.section.bind]
        config.accesslog = None  # every signed request is logged by the app, as JSON
        # Hypercorn's own errors (protocol-level only: the app catches its own) go to the
        # standard logging module, which prints warnings and worse to stderr.
        config.errorlog = logging.getLogger("hypercorn.error")
        config.graceful_timeout = ctx.cleanup_grace_s
        serve = functools.partial(
            hypercorn.trio.serve,
            build_app(services),  # type: ignore[arg-type]  # ASGI typing differs, same protocol
            config,
            shutdown_trigger=ctx.wait_stop_requested,
        )
        async with trio.open_nursery() as nursery:
            urls = await nursery.start(serve)
            ctx.log.info("api_listening", urls=urls, keys=sorted(self.keys))
            interval = self.metrics.status_count_interval_s
            counting = start_status_counts(nursery, self.gauges, interval)
            task_status.started(urls)
            await ctx.wait_stop_requested()
            counting.cancel()  # hypercorn stops gracefully on the same request

    def _shared_bind(self) -> str:
        """Bind the port ourselves with ``SO_REUSEPORT`` and hand hypercorn the descriptor."""
        host, _, port = self.section.bind.rpartition(":")
        host = host.strip("[]")
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.bind((host, int(port)))
        except BaseException:
            sock.close()
            raise
        return f"fd://{sock.detach()}"  # hypercorn owns and closes it from here

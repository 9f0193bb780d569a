"""The API actor: serves ``actors.api.routes`` with hypercorn on trio.

It starts after the node's scheduling and execution roles and stops before them. It reads
nothing from Redis before it serves, and neither do the roles started before it (each
waits for Redis once started):
a node started while Redis is away answers ``/healthz`` at once and ``/readyz`` with 503
until Redis is back. Stopping is graceful: a stop request makes hypercorn
refuse new connections and finish requests in flight within the node's grace.

With ``[processes] api = N`` several processes serve one port: each binds its own socket
with ``SO_REUSEPORT`` and the kernel spreads new connections across them (one core each;
hypercorn's HTTP handling is most of a request's CPU).
"""

from __future__ import annotations

import socket

from actors.api.app import build_app
from actors.api.queues import Queues
from actors.api.routes import ApiServices
from actors.api.signing import Verifier
from actors.config import ApiSection, MetricsSection, split_bind
from actors.domain.api_keys import ApiKey
from actors.observability.endpoint import ScrapeGate, serve_http
from actors.observability.redis_gauges import RedisGauges
from actors.store.apply_actions import ActionSettings
from actors.store.keys import nonce_prefix
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
        actions: ActionSettings | None = None,
    ) -> None:
        self.store = store
        self.actions = actions or ActionSettings()
        self.metrics = metrics or MetricsSection()
        self.gauges = RedisGauges(store, self.metrics.cache_s)
        self.section = section
        self.keys = {key.key_id: key for key in keys}
        self.shared_port = shared_port
        """Bind with ``SO_REUSEPORT``: other API processes of this node serve the same port."""

    async def run(self, ctx: ActorContext, *, task_status: TaskStatus) -> None:
        # Nothing read from Redis first: with Redis away when the node starts, the API
        # answers at once (/healthz 200, /readyz and what needs Redis 503) and serves
        # once it is back, like a node whose Redis went away later.
        verifier = Verifier(
            self.store.client, nonce_prefix(self.store.namespace), self.keys,
            skew_ms=int(self.section.skew_s * 1000),
        )  # fmt: skip
        services = ApiServices(
            self.store, Queues(self.store), verifier, self.section, ctx.health, self.gauges,
            ScrapeGate(self.metrics), ctx.log, self.actions,
        )  # fmt: skip
        bind = self._shared_bind() if self.shared_port else self.section.bind
        await serve_http(
            ctx, build_app(services), bind, self.gauges, self.metrics.status_count_interval_s,
            lambda urls: ctx.log.info("api_listening", urls=urls, keys=sorted(self.keys)),
            task_status=task_status,
        )  # fmt: skip

    def _shared_bind(self) -> str:
        """Bind the port ourselves with ``SO_REUSEPORT`` and hand hypercorn the descriptor."""
        host, port, _ = split_bind(self.section.bind)
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

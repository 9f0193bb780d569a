"""Building the redis-py client a ``RedisClient`` drives: Sentinel-managed primaries, TLS
options, and URLs with their password hidden for logs."""

from __future__ import annotations

import ssl
from typing import Any

import redis.sentinel

from runtime.config import RedisSection, parse_sentinel_url


def sentinel_master(url: str, settings: RedisSection, common: dict[str, Any]) -> Any:
    """A client of the primary that Sentinel names for the service, found again after a
    failover: a connection to a demoted primary fails (READONLY becomes a connection error
    in redis-py), so ``ride_out`` waits, and the next connection asks the sentinels anew.

    ``redis+sentinel://[user:password@]host:port[,host:port...]/service[/db]`` (port 26379
    when left out; ``rediss+sentinel://`` for TLS to the primary)."""
    sentinels, service, db, username, password = parse_sentinel_url(url)
    timeouts = {
        "socket_timeout": settings.socket_timeout_s,
        "socket_connect_timeout": settings.connect_timeout_s,
    }
    options = dict(common)
    if username is not None:
        options["username"] = username
    if password is not None:
        options["password"] = password
    # Any: redis-py types Sentinel in some versions and not in others.
    sentinel_class: Any = redis.sentinel.Sentinel
    manager = sentinel_class(sentinels, sentinel_kwargs=timeouts)
    return manager.master_for(service, db=db, max_connections=settings.max_connections, **options)


def tls_options(settings: RedisSection) -> dict[str, Any]:
    options: dict[str, Any] = {"ssl_cert_reqs": ssl.CERT_REQUIRED}
    if settings.tls_ca_file:
        options["ssl_ca_certs"] = settings.tls_ca_file
    if settings.tls_cert_file:
        options["ssl_certfile"] = settings.tls_cert_file
    if settings.tls_key_file:
        options["ssl_keyfile"] = settings.tls_key_file
    return options

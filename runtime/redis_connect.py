"""Building the redis-py client a ``RedisClient`` drives: Sentinel-managed primaries, TLS
options, and URLs with their password hidden for logs."""

from __future__ import annotations

import inspect
import ssl
import urllib.parse
from typing import Any

import redis.connection
import redis.sentinel

from runtime.config import RedisSection, parse_sentinel_url, redact
from runtime.errors import ConfigError


def check_url_options(url: str) -> None:
    """ConfigError naming ``redis.url`` for a ``redis://``, ``rediss://`` or ``unix://``
    URL whose query sets an option redis-py cannot read (``socket_timeout=fast``) or its
    connection does not take (a TLS option on ``redis://``): either failed the node in a
    traceback as it started, or at its first call."""
    shown = repr(redact(url))
    parts = urllib.parse.urlsplit(url)
    unknown = sorted(set(urllib.parse.parse_qs(parts.query)) - _url_options(parts.scheme))
    if unknown:
        raise ConfigError(f"redis.url: {shown}: no such connection option: {', '.join(unknown)}")
    try:
        redis.connection.parse_url(url)  # type: ignore[no-untyped-call]
    except ValueError as exc:
        raise ConfigError(f"redis.url: {shown}: {redact(str(exc))}") from None


#: Options of redis-py's connection pool a URL may set as well (``max_connections``
#: overrides ``[redis] max_connections``).
_POOL_OPTIONS = frozenset({"max_connections", "timeout"})


def _url_options(scheme: str) -> set[str]:
    """What the query of a URL of ``scheme`` may set: the keywords of the redis-py
    connection it makes (TLS options with ``rediss://`` alone), and of its pool."""
    kinds = {"rediss": redis.connection.SSLConnection,
             "unix": redis.connection.UnixDomainSocketConnection}  # fmt: skip
    kind = kinds.get(scheme, redis.connection.Connection)
    names: set[str] = set(_POOL_OPTIONS)
    for cls in kind.__mro__:
        init = cls.__dict__.get("__init__")
        if init is not None:
            names |= set(inspect.signature(init).parameters) - {"self", "args", "kwargs"}
    return names


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

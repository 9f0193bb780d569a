"""Node configuration: TOML in, typed frozen classes out, or one clear error.

The runtime owns the sections every node has (``[node]``, ``[log]``, ``[redis]``); the
application (``actors.app`` by default) owns the rest and names its root config class.
Unknown keys and wrong types are errors that name the key path, with a suggestion for a
near miss (``consumers.email: unknown key 'concurency' (did you mean 'concurrency'?)``).
"""

from __future__ import annotations

import difflib
import hashlib
import os
import re
import socket
import tomllib
import typing
import urllib.parse
from pathlib import Path
from typing import Any, Literal, TypeVar
from urllib.parse import unquote

import attrs
import cattrs
from cattrs.errors import ClassValidationError, ForbiddenExtraKeysError, IterableValidationError

from runtime.errors import ConfigError

T = TypeVar("T")

#: Names that end up inside Redis keys or log paths: no braces, colons, spaces or control
#: characters, so no name can break a hash tag or reach another key.
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
#: Longest name (namespace, task type, key id); task ids have their own bound.
MAX_NAME = 64


def check_name(kind: str, value: object, max_len: int = MAX_NAME) -> str:
    """Return ``value`` if it is a safe name, else raise ValueError naming the rule."""
    if not isinstance(value, str) or not NAME_PATTERN.fullmatch(value) or len(value) > max_len:
        raise ValueError(
            f"{kind} {value!r} must be 1-{max_len} characters of letters, digits, '_', '.' or '-',"
            " starting with a letter or digit"
        )
    return value


#: The largest number a setting may be (2^53: exact as a float, in Lua and in JSON): TOML's
#: ``inf``, or a number no deployment means, is refused where it is read, not met later
#: as an overflow in a conversion or a number Redis refuses.
MAX_SETTING = 2**53


def positive(_inst: object, attr: attrs.Attribute[Any], value: float) -> None:
    """attrs validator: ``0 < value <= MAX_SETTING``; the message names the field."""
    if not 0 < value <= MAX_SETTING:
        raise ValueError(f"{attr.name}: must be > 0 and at most 2^53, got {value!r}")


def within(low: float, high: float = MAX_SETTING) -> Any:
    """attrs validator: ``low <= value <= high`` (``high`` at most ``MAX_SETTING``: no
    ``inf``); the message names the field."""
    high = min(high, MAX_SETTING)

    def validate(_inst: object, attr: attrs.Attribute[Any], value: float) -> None:
        if not low <= value <= high:
            bound = f">= {low} and at most 2^53" if high == MAX_SETTING else f"within {low}..{high}"
            raise ValueError(f"{attr.name}: must be {bound}, got {value!r}")

    return validate


def safe_name(kind: str) -> Any:
    """attrs validator: ``check_name``; the message names the field."""

    def validate(_inst: object, attr: attrs.Attribute[Any], value: str) -> None:
        try:
            check_name(kind, value)
        except ValueError as exc:
            raise ValueError(f"{attr.name}: {exc}") from None

    return validate


@attrs.frozen
class NodeSection:
    """``[node]``: who this node is and how it stops."""

    name: str = attrs.field(factory=socket.gethostname)
    app: str = "actors.app"
    """Module that defines ``Config`` and ``build_tree(config, invocation)`` for this node."""
    shutdown_grace_s: float = attrs.field(default=10.0, validator=positive)
    """First SIGTERM/SIGINT: finish work in hand within this many seconds, then cancel."""
    restart_attempts: int = attrs.field(default=20, validator=within(1, 10_000))
    """An actor that fails this many restarts in a row (never up a full intensity period,
    however slowly it fails) makes its supervisor give up: the node escalates instead of
    looking alive in a crash loop. Redis outages do not count: actors wait them out."""


@attrs.frozen
class LogSection:
    """``[log]``: one JSON object per line on stdout, or console lines for humans."""

    format: Literal["json", "console"] = "json"
    level: Literal["debug", "info", "warning", "error"] = "info"


#: URL schemes of a Sentinel-managed primary.
SENTINEL_SCHEMES = ("redis+sentinel://", "rediss+sentinel://")
REDIS_SCHEMES = ("redis://", "rediss://", "unix://", *SENTINEL_SCHEMES)


def parse_sentinel_url(url: str) -> tuple[list[tuple[str, int]], str, int, str | None, str | None]:
    """(sentinels, service, db, username, password) of a ``redis+sentinel://`` URL, or
    ValueError naming what is wrong."""
    rest = url.split("://", 1)[1]
    location, _, path = rest.partition("/")
    credentials, _, hosts = location.rpartition("@")
    username = password = None
    if credentials:
        user, _, secret = credentials.partition(":")
        username, password = (unquote(user) or None), (unquote(secret) or None)
    sentinels = []
    for host in hosts.split(","):
        name, _, port = host.rpartition(":") if ":" in host else (host, "", "26379")
        if not name or not port.isdecimal():
            raise ValueError(f"redis.url: {host!r} is not a sentinel host:port")
        sentinels.append((name.strip("[]"), int(port)))
    service, _, db = path.strip("/").partition("/")
    if not service or (db and not db.isdecimal()):
        raise ValueError("redis.url: a sentinel URL ends with /service or /service/db")
    return sentinels, service, int(db or 0), username, password


def redact(url: str) -> str:
    """The URL without its password (before the host, or a ``password`` query option,
    which redis-py reads too), for logs and errors."""
    url = _QUERY_PASSWORD.sub(r"\1***", url)
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest:
        return url
    creds, _, host = rest.rpartition("@")
    user = creds.split(":", 1)[0]
    return f"{scheme}://{user + ':***@' if user else '***@'}{host}"


#: A URL's ``password=`` query option, up to the next option.
_QUERY_PASSWORD = re.compile(r"([?&]password=)[^&#]*", re.IGNORECASE)


def _redis_url(_inst: object, _attr: attrs.Attribute[Any], value: str) -> None:
    if value == "embedded":
        return
    if not value.startswith(REDIS_SCHEMES):
        raise ValueError(
            f"must be embedded or a URL starting with {', '.join(REDIS_SCHEMES)}, "
            f"got {redact(value)!r}"
        )
    if value.startswith(SENTINEL_SCHEMES):
        parse_sentinel_url(value)
        return
    _plain_redis_url(value)


def _plain_redis_url(value: str) -> None:
    """A ``redis://``, ``rediss://`` or ``unix://`` URL, checked as redis-py would read it
    (a port that is no number made the node fail in a traceback as it started): a path,
    or a ``db`` in the query, is a database number (redis-py dropped a path that is no
    number silently). Errors show the URL without its password."""
    shown = repr(redact(value))
    try:
        parts = urllib.parse.urlsplit(value)
        parts.port  # noqa: B018 (a ValueError: no number, or past 65535)
    except ValueError as exc:
        raise ValueError(f"url: {shown} is not a Redis URL: {exc}") from None
    path = parts.path.strip("/")
    if parts.scheme != "unix" and path and not (path.isascii() and path.isdecimal()):
        raise ValueError(f"url: the path of {shown} is a database number (/0), got {path!r}")
    for db in urllib.parse.parse_qs(parts.query).get("db", []):
        if not (db.isascii() and db.isdecimal()):
            raise ValueError(f"url: the db of {shown} is a database number, got {db!r}")


@attrs.frozen
class RedisSection:
    """``[redis]``: where Redis is and how to talk to it."""

    url: str = attrs.field(default="embedded", validator=_redis_url)
    """``redis://``, ``rediss://`` (TLS), ``unix://``, ``redis+sentinel://host:port,.../service``
    (a Sentinel-managed primary, followed through failovers), or ``embedded`` to start a
    private server under this node's supervision."""
    cluster: bool = False
    username: str | None = None
    password: str | None = None
    password_env: str | None = None
    """Name of an environment variable holding the password (keeps it out of the file,
    e.g. a Kubernetes Secret); exclusive with ``password``."""
    max_connections: int = attrs.field(default=32, validator=positive)
    """Connections in the pool, and threads that may wait on Redis at once."""
    socket_timeout_s: float = attrs.field(default=5.0, validator=positive)
    connect_timeout_s: float = attrs.field(default=2.0, validator=positive)
    native_io: bool = True
    """``redis://`` and ``unix://`` only: pipelined script calls and stream reads (the fire
    path's claims, enqueues, reads and outcomes, and the API's task writes) on trio sockets
    instead of the I/O threads (``runtime.redis_native``: up to ``max_connections`` more
    connections, to each master on a Cluster: ``runtime.redis_cluster_native``); false:
    every call through redis-py on the threads."""
    data_dir: str = "metronome-data"
    """Embedded server only: its AOF, log and socket live here."""
    embedded_port: int = 0
    """Embedded server only: also listen on this loopback TCP port (0 = socket only)."""
    server_binary: str | None = None
    """Embedded server only: the server binary (default: redis-server or valkey-server on
    PATH, else the one of the ``embedded`` pip extra)."""
    tls_ca_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None

    def __attrs_post_init__(self) -> None:
        tls = [k for k in ("tls_ca_file", "tls_cert_file", "tls_key_file") if getattr(self, k)]
        if tls and not self.url.startswith(("rediss://", "rediss+sentinel://")):
            raise ValueError(  # taken as TLS on, the connection would go in plain text
                f"{tls[0]}: TLS files go with a rediss:// (or rediss+sentinel://) URL, and "
                f"url is {redact(self.url)!r}"
            )
        if self.password_env is None:
            return
        if self.password is not None:
            raise ValueError("redis: set password or password_env, not both")
        if not os.environ.get(self.password_env):
            raise ValueError(
                f"redis.password_env: environment variable {self.password_env} is not set"
            )

    def resolved_password(self) -> str | None:
        """The password, from the file or from ``password_env``."""
        if self.password_env is not None:
            return os.environ.get(self.password_env)
        return self.password


def make_converter() -> cattrs.Converter:
    """The one converter: unknown keys and wrong types are errors carrying their key path.

    Scalars are checked, not coerced: ``concurrency = "10"`` is a mistake worth naming.
    """
    conv = cattrs.Converter(forbid_extra_keys=True, detailed_validation=True)
    for kind in (int, float, str, bool):
        conv.register_structure_hook(kind, _strict_scalar(kind))
    return conv


def _strict_scalar(kind: type[Any]) -> Any:
    def structure_scalar(value: Any, _type: Any) -> Any:
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise TypeError(f"expected {kind.__name__}, got {type(value).__name__} {value!r}")
        return value

    return structure_scalar


converter = make_converter()


def load_toml(path: Path) -> tuple[dict[str, Any], str]:
    """The file's tables, and a digest of its bytes (a child process of the node checks it
    reads the file its node read: ``runtime.app.Invocation.config_digest``)."""
    try:
        raw = path.read_bytes()
        text = raw.decode("utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text: {exc}") from exc
    try:
        return tomllib.loads(text), hashlib.sha256(raw).hexdigest()
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from exc


def structure(data: Any, cls: type[T], source: str) -> T:
    """Build ``cls`` from plain data or raise ConfigError listing every problem by key path."""
    try:
        return converter.structure(data, cls)
    except (ClassValidationError, IterableValidationError, ValueError, TypeError) as exc:
        raise ConfigError(f"{source}: {describe(exc)}") from exc


def describe(exc: BaseException, root: str = "") -> str:
    """Every problem in a cattrs validation error as ``key.path: message``, joined by '; '."""
    if isinstance(exc, ClassValidationError | IterableValidationError):
        problems = cattrs.transform_error(exc, path=root, format_exception=_format_problem)
        return "; ".join(_tidy(p) for p in problems)
    return _tidy(f"{exc} @ {root}" if root else str(exc))


def _format_problem(exc: BaseException, type_: type | None) -> str:
    if isinstance(exc, ForbiddenExtraKeysError):
        # The keys a client may send: init fields by their alias (``_x`` is given as ``x``).
        known = (
            [a.alias or a.name for a in attrs.fields(exc.cl) if a.init] if attrs.has(exc.cl) else []
        )
        parts = []
        for key in sorted(exc.extra_fields):
            near = [k for k in difflib.get_close_matches(key, known, n=2) if k != key][:1]
            hint = f" (did you mean {near[0]!r}?)" if near else f" (known keys: {', '.join(known)})"
            parts.append(f"unknown key {key!r}{hint}")
        return ", ".join(parts)
    if isinstance(exc, KeyError):
        return "required key missing"
    if type_ is not None and attrs.has(type_) and isinstance(exc, AttributeError | TypeError):
        return "must be an object (a table in TOML, {...} in JSON)"
    if type_ is not None and typing.get_origin(type_) is Literal:
        allowed = ", ".join(repr(a) for a in typing.get_args(type_))
        return f"must be one of {allowed}"
    if isinstance(exc, ValueError | TypeError) and str(exc):
        return str(exc)
    if isinstance(exc, OverflowError):  # an integer no float holds: 1 and 400 zeros
        return "is too large a number"
    return cattrs.v.format_exception(exc, type_)


_FIELD_MESSAGE = re.compile(r"([a-z_][a-z0-9_]*): (.*)", re.DOTALL)


def _tidy(problem: str) -> str:
    """``"msg @ .consumers.email"`` -> ``"consumers.email: msg"``; a validator's
    ``"field: msg"`` joins the path: ``"consumers.email.field: msg"``."""
    message, _, where = problem.rpartition(" @ ")
    if not _:
        message, where = problem, ""
    where = where.lstrip(".").replace("['", ".").replace("']", "")
    field = _FIELD_MESSAGE.fullmatch(message)
    if field:
        where = f"{where}.{field[1]}" if where else field[1]
        message = field[2]
    return f"{where}: {message}" if where else message

"""Every Redis error reply, classified once: what a node does about it.

Redis answers an error with a code as its first word (``OOM command not allowed…``), also
from inside a Lua script (``redis.call`` keeps the code and appends ``script: …``). The
table ``CLASSES`` maps each code a node can meet to one of four classes, and
``classify`` turns a reply into the exception its class calls for:

- **transient** (``LOADING``, ``BUSY``, ``MASTERDOWN``, ``TRYAGAIN``, ``UNBLOCKED``,
  ``READONLY``, ``CLUSTERDOWN``, a script's "non local key" on a Cluster): a server
  starting, running a long script, changing roles, or a slot moving. The same as
  unreachable for a moment: ``RedisUnavailable``; actors wait it out
  (``RedisClient.ride_out``), ``/readyz`` answers 503.
- **refused write** (``OOM``, ``MISCONF``, ``NOREPLICAS``): the server is up and refuses
  to store anything. ``RedisRefused``: the step is repeated with backoff until Redis takes
  writes again; nothing that depends on the refused write is acknowledged (writes are
  ordered before acknowledgements, ``actors.store.scripts.Scripts.complete``).
- **permission** (``NOPERM``, a script's "can't run this command", an unknown or renamed
  command): the server's configuration forbids what the node needs. (``NOAUTH`` and
  ``WRONGPASS`` are listed too, but redis-py raises them as connection errors: a node with
  the wrong password waits as for an outage, its ``redis_unreachable`` line naming them.)
  ``RedisRefused`` too, with a line naming the fix; the node keeps serving what it can.
- **rejected** (``WRONGTYPE`` and any code not above): the command cannot succeed as
  sent: a key holding data of another kind, a bug. It reaches the caller as the reply
  itself (one may expect it: ``XGROUP CREATE`` expects ``BUSYGROUP``); at ``ride_out`` it
  is a refusal, so no actor crash-loops on it. ``NOGROUP`` (``RESTART``) alone lets the
  step fail: the actor is restarted and creates what is gone.

``NOSCRIPT`` never reaches this table: ``runtime.redis_io`` sends the script's source.
"""

from __future__ import annotations

import enum

import redis.exceptions

from runtime.errors import RedisRefused, RedisUnavailable


class ReplyClass(enum.Enum):
    TRANSIENT = "transient"
    REFUSED_WRITE = "refused_write"
    PERMISSION = "permission"
    REJECTED = "rejected"


#: Error codes and their class; a code not listed is ``REJECTED``.
CLASSES: dict[str, ReplyClass] = {
    "LOADING": ReplyClass.TRANSIENT,
    "BUSY": ReplyClass.TRANSIENT,
    "MASTERDOWN": ReplyClass.TRANSIENT,
    "TRYAGAIN": ReplyClass.TRANSIENT,
    "UNBLOCKED": ReplyClass.TRANSIENT,
    "READONLY": ReplyClass.TRANSIENT,
    "CLUSTERDOWN": ReplyClass.TRANSIENT,
    "OOM": ReplyClass.REFUSED_WRITE,
    "MISCONF": ReplyClass.REFUSED_WRITE,
    "NOREPLICAS": ReplyClass.REFUSED_WRITE,
    "NOPERM": ReplyClass.PERMISSION,
    "NOAUTH": ReplyClass.PERMISSION,
    "WRONGPASS": ReplyClass.PERMISSION,
}

#: Rejected codes that a waiting actor cannot outwait: what it works on is gone (a stream
#: or its consumer group deleted, a server back empty). ``ride_out`` lets the step fail,
#: so the actor is restarted and builds it again (a consumer creates its group).
RESTART = frozenset({"NOGROUP"})


def restarts(error: BaseException) -> bool:
    """Whether ``error`` is a reply no wait can mend (``RESTART``): the actor must fail."""
    return error_code(error) in RESTART


def rejected_alone(error: BaseException) -> bool:
    """Whether ``error`` is Redis rejecting one call as it was sent (a key of another
    kind) and nothing more: outages and refusals reach callers as ``RedisUnavailable``
    (``classify``), and a ``RESTART`` reply fails the actor. Callers that write many
    partitions or streams leave such a call out and go on with the others."""
    return isinstance(error, redis.exceptions.ResponseError) and not restarts(error)


class PartRejected(redis.exceptions.ResponseError):
    """A call Redis rejected (``rejected_alone``) for one part of a step that serves many
    (a poller's partition), returned apart from the others' replies: the caller sets that
    part aside and goes on with the others, rather than wait on it with every part."""

    def __init__(self, part: int, error: Exception) -> None:
        super().__init__(str(error))
        self.part = part
        self.error = error


#: ``ERR`` replies that are about permission or configuration, not the command's data.
_PERMISSION_PHRASES = ("can't run this command", "unknown command", "no permissions")

#: ``ERR`` replies of a script on a Cluster whose slot is moving or whose cluster is down:
#: a key it builds from its tag has left for the slot's next master (the command that met
#: it did not run), or the cluster cannot serve it. Waited out like ``TRYAGAIN``.
_TRANSIENT_PHRASES = ("non local key", "while the cluster is down")

#: What an operator does about each class that is not transient (the log line says it).
FIXES: dict[ReplyClass, str] = {
    ReplyClass.REFUSED_WRITE: (
        "Redis refuses writes: raise maxmemory or free memory (OOM), fix the failing save "
        "(MISCONF), or bring replicas back (NOREPLICAS); the node retries until it can write"
    ),
    ReplyClass.PERMISSION: (
        "the node's Redis user lacks a permission or a command is disabled: "
        "deploy/redis/users.acl lists what Metronome needs"
    ),
    ReplyClass.REJECTED: (
        "Redis rejected a command: a key in the namespace holds data of another kind, or a "
        "bug; the node retries and reports it until the cause is removed"
    ),
}


def error_code(error: BaseException | str) -> str:
    """An error reply's code: redis-py takes the codes it knows off the text (``OOM``
    becomes ``OutOfMemoryError("command not allowed…")``) and keeps them as
    ``status_code``; any other reply's text starts with its code."""
    code = getattr(error, "status_code", None)
    return code if isinstance(code, str) and code else str(error).split(" ", 1)[0]


def reply_text(error: BaseException | str) -> str:
    """An error reply as Redis sent it, its code first (for log lines)."""
    text, code = str(error), error_code(error)
    return text if text.startswith(code) else f"{code} {text}"


def reply_class(error: BaseException | str) -> ReplyClass:
    """The class of an error reply (its text, or redis-py's exception for it)."""
    text = str(error)
    code = error_code(error)
    known = CLASSES.get(code)
    if known is not None:
        return known
    lowered = text.lower()
    if any(phrase in lowered for phrase in _TRANSIENT_PHRASES):
        return ReplyClass.TRANSIENT
    if any(phrase in lowered for phrase in _PERMISSION_PHRASES):
        return ReplyClass.PERMISSION
    return ReplyClass.REJECTED


def classify(error: redis.exceptions.ResponseError, where: str) -> Exception:
    """The exception a node raises for an error reply, naming ``where`` (the server) and
    the reply: ``RedisUnavailable`` (transient), ``RedisRefused`` (refused write,
    permission), or ``error`` itself (rejected: a caller may expect it, as ``XGROUP
    CREATE`` expects ``BUSYGROUP``; ``RedisClient.ride_out`` treats it as refused when
    it reaches it)."""
    kind = reply_class(error)
    if kind is ReplyClass.TRANSIENT:
        return RedisUnavailable(f"redis at {where}: {reply_text(error)}")
    if kind is ReplyClass.REJECTED:
        return error
    return refused(error, where)


def refused(error: redis.exceptions.ResponseError, where: str) -> RedisRefused:
    """``error`` as ``RedisRefused`` of its class (transient replies are not refusals)."""
    kind = reply_class(error)
    return RedisRefused(kind.value, f"redis at {where}: {reply_text(error)}", FIXES.get(kind, ""))

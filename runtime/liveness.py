"""Who holds a lease, and whether that holder can still be alive.

Leases in Redis (a consumer's name, a poller's partitions) name their holder as
``host:pid:token``. Another process of the same host can tell when that holder has exited
(killed, or restarted by its supervisor in a fresh process) and take over at once instead
of waiting for the lease to run out; a holder on another host is only trusted to be gone
once its lease has expired.
"""

from __future__ import annotations

import os
import secrets
import socket


def owner_value() -> str:
    """A fresh holder value for this process: ``host:pid:token``."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


def holder_is_gone(holder: str, *, this_process_is_gone: bool = True) -> bool:
    """Whether an owner value names a process that cannot be running the name any more: one
    of this host that has exited, or this very process (an earlier incarnation; pass
    ``this_process_is_gone=False`` where several live holders share a process, like a
    node's pollers)."""
    host, pid_text, _ = [*holder.rsplit(":", 2), "", ""][:3]
    if host != socket.gethostname() or not pid_text.isdigit():
        return False
    pid = int(pid_text)
    if pid == os.getpid():
        return this_process_is_gone
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # alive, under another user
    return _zombie(pid)


def _zombie(pid: int) -> bool:
    """A process that has exited but is not reaped yet (its parent has not waited for it):
    gone all the same. Linux only (``/proc``); elsewhere such a holder waits out its lease."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            state = stat.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state in (b"Z", b"X")

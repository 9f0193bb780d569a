"""Who holds a lease, and whether that holder can still be alive.

Leases in Redis (a consumer's name, a poller's partitions) name their holder as
``host:pid:instance:token``. Another process of the same host can tell when that holder
has exited (killed, or restarted by its supervisor in a fresh process) and take over at
once instead of waiting for the lease to run out.

A host name and a pid alone do not name a process: containers may share a host name while
each has a PID namespace of its own, where a pid alive in ours can be another process, and
a pid absent from ours can be alive in theirs; and after a reboot the same pid is someone
else. So ``instance`` names the kernel boot and the PID namespace the pid belongs to (a
short hash of ``/proc/sys/kernel/random/boot_id`` and the inode of ``/proc/self/ns/pid``),
and a pid is looked at only for a holder of this host name *and* this instance. Any other
holder (another host, container or boot) is trusted to be gone only once its lease has
expired. So is a holder in the older ``host:pid:token`` form, which does not say where its
pid lives: it waits out its lease, as a holder of another host does.

The token is last, so ``value.rsplit(":", 1)[1]`` is the holder's own token.
"""

from __future__ import annotations

import functools
import hashlib
import os
import secrets
import socket


def owner_value() -> str:
    """A fresh holder value for this process: ``host:pid:instance:token``."""
    return f"{socket.gethostname()}:{os.getpid()}:{instance_id()}:{secrets.token_hex(4)}"


@functools.cache
def instance_id() -> str:
    """Where this process's pid means this process: the kernel boot and the PID namespace,
    hashed short (12 hex digits). Where neither can be read (no ``/proc``: not Linux), it
    is the same for every process of the host, as the host name alone was."""
    try:
        with open("/proc/sys/kernel/random/boot_id", "rb") as boot:
            boot_id = boot.read().strip()
    except OSError:
        boot_id = b""
    try:
        pid_namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        pid_namespace = 0
    return hashlib.blake2b(b"%s/%d" % (boot_id, pid_namespace), digest_size=6).hexdigest()


def holder_is_gone(holder: str, *, this_process_is_gone: bool = True) -> bool:
    """Whether an owner value names a process that cannot be running the name any more: one
    of this host, boot and PID namespace that has exited, or this very process (an earlier
    incarnation; pass ``this_process_is_gone=False`` where several live holders share a
    process, like a node's pollers). Any other holder is not known to be gone."""
    pid = _our_instances_pid(holder)
    if pid is None:
        return False
    if pid == os.getpid():
        return this_process_is_gone
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # alive, under another user
    return _zombie(pid)


def _our_instances_pid(holder: str) -> int | None:
    """The holder's pid if it is a pid of this host name, boot and PID namespace; None
    otherwise, or for a value that does not say (the older ``host:pid:token``)."""
    parts = holder.rsplit(":", 3)
    if len(parts) != 4:
        return None
    host, pid_text, instance, _token = parts
    if host != socket.gethostname() or instance != instance_id() or not pid_text.isdigit():
        return None
    return int(pid_text)


def _zombie(pid: int) -> bool:
    """A process that has exited but is not reaped yet (its parent has not waited for it):
    gone all the same. Linux only (``/proc``); elsewhere such a holder waits out its lease."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            state = stat.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state in (b"Z", b"X")

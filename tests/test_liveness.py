"""Whether a lease holder (``host:pid:instance:token``) can still be alive: real processes,
and a real PID namespace where the machine lets us make one."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runtime.liveness import holder_is_gone, instance_id, owner_value

HOST = socket.gethostname()
OURS = instance_id()
OTHER = "0123456789ab"  # another container's, or another boot's: not ours
REPO = Path(__file__).resolve().parents[1]


def test_a_live_process_of_this_host_holds_on() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert not holder_is_gone(f"{HOST}:{child.pid}:{OURS}:t")
    finally:
        child.kill()
        child.wait()


def test_an_exited_process_is_gone_reaped_or_not() -> None:
    child = subprocess.Popen(["true"])
    deadline = time.monotonic() + 30
    while _state(child.pid) != "Z":  # exited, not reaped: a zombie until its parent waits
        assert time.monotonic() < deadline, "the child never exited"
        time.sleep(0.01)
    assert holder_is_gone(f"{HOST}:{child.pid}:{OURS}:t")
    child.wait()
    assert holder_is_gone(f"{HOST}:{child.pid}:{OURS}:t")


def test_this_process_is_gone_only_for_a_single_holder_per_process() -> None:
    me = owner_value()
    assert me.startswith(f"{HOST}:{os.getpid()}:{OURS}:")
    assert holder_is_gone(me)  # an earlier incarnation of a consumer name
    assert not holder_is_gone(me, this_process_is_gone=False)  # a sibling poller


def test_a_holder_on_another_host_or_unreadable_is_trusted() -> None:
    assert not holder_is_gone(f"elsewhere:1:{OURS}:t")
    assert not holder_is_gone(f"{HOST}:notapid:{OURS}:t")
    assert not holder_is_gone("garbage")


def test_a_pid_of_another_pid_namespace_or_boot_is_not_ours_to_judge() -> None:
    """A container with our host name in a PID namespace of its own: its pid, dead or
    alive in ours, says nothing about its process, so its lease is waited out."""
    exited = subprocess.Popen(["true"])
    exited.wait()
    assert holder_is_gone(f"{HOST}:{exited.pid}:{OURS}:t")  # ours: gone
    assert not holder_is_gone(f"{HOST}:{exited.pid}:{OTHER}:t")  # theirs: maybe alive
    assert not holder_is_gone(f"{HOST}:{os.getpid()}:{OTHER}:t")  # not this process


def test_a_holder_in_the_older_form_waits_out_its_lease() -> None:
    """``host:pid:token`` does not say which namespace its pid is in: never taken as gone,
    even when that pid is free here."""
    exited = subprocess.Popen(["true"])
    exited.wait()
    assert not holder_is_gone(f"{HOST}:{exited.pid}:t")
    assert not holder_is_gone(f"{HOST}:{os.getpid()}:t")


#: Runs in a PID namespace of its own: a process there gets the pid ``argv[1]`` (free in the
#: test's namespace), prints its owner value and lives until its stdin closes.
_IN_ANOTHER_NAMESPACE = """
import os, sys
with open("/proc/sys/kernel/ns_last_pid", "w") as last:
    last.write(str(int(sys.argv[1]) - 1))
if os.fork() == 0:
    from runtime.liveness import owner_value
    print(owner_value(), flush=True)
    sys.stdin.read()
    os._exit(0)
os.wait()
"""


def test_a_live_holder_in_another_pid_namespace_is_not_taken_for_gone() -> None:
    """A container with our host name and a PID namespace of its own (``unshare``, where
    the machine allows it): its live process has a pid that no process has in ours, so
    the pid alone would call it gone; its instance says the pid is not ours to judge."""
    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1) here")
    free = subprocess.Popen(["true"])
    free.wait()  # its pid is free in our namespace now
    other = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child",
         sys.executable, "-c", _IN_ANOTHER_NAMESPACE, str(free.pid)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        cwd=REPO, text=True, env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    try:
        assert other.stdout is not None
        theirs = other.stdout.readline().strip()
        if not theirs:
            error = other.communicate(timeout=60)[1]
            pytest.skip(f"cannot make a PID namespace here: {error.strip()[-200:]}")
        host, pid, instance, _token = theirs.rsplit(":", 3)
        if Path(f"/proc/{pid}").exists():
            pytest.skip(f"pid {pid} was taken again in our namespace meanwhile")
        assert (host, pid) == (HOST, str(free.pid))  # same host name, a pid free here
        assert instance != OURS
        assert not holder_is_gone(theirs)  # alive over there: its lease is waited out
    finally:
        if other.returncode is None:
            other.communicate(timeout=60)  # closes its stdin: it ends
    assert other.returncode == 0


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0]

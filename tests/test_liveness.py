"""Whether a lease holder (``host:pid:token``) can still be alive: real processes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

from runtime.liveness import holder_is_gone, owner_value

HOST = socket.gethostname()


def test_a_live_process_of_this_host_holds_on() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert not holder_is_gone(f"{HOST}:{child.pid}:t")
    finally:
        child.kill()
        child.wait()


def test_an_exited_process_is_gone_reaped_or_not() -> None:
    child = subprocess.Popen(["true"])
    deadline = time.monotonic() + 30
    while _state(child.pid) != "Z":  # exited, not reaped: a zombie until its parent waits
        assert time.monotonic() < deadline, "the child never exited"
        time.sleep(0.01)
    assert holder_is_gone(f"{HOST}:{child.pid}:t")
    child.wait()
    assert holder_is_gone(f"{HOST}:{child.pid}:t")


def test_this_process_is_gone_only_for_a_single_holder_per_process() -> None:
    me = owner_value()
    assert me.startswith(f"{HOST}:{os.getpid()}:")
    assert holder_is_gone(me)  # an earlier incarnation of a consumer name
    assert not holder_is_gone(me, this_process_is_gone=False)  # a sibling poller


def test_a_holder_on_another_host_or_unreadable_is_trusted() -> None:
    assert not holder_is_gone("elsewhere:1:t")
    assert not holder_is_gone(f"{HOST}:notapid:t")
    assert not holder_is_gone("garbage")


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0]

"""``bench chaos endpoint-failover``: a failover behind one address, as a managed Redis
endpoint does it (a DNS name moved from the old primary to the new one).

The nodes know only the address of ``SwitchingProxy``, a TCP forwarder in the bench
process: each connection it accepts goes on to the server it names at that moment, and
stays there. The failover pauses the primary's writes, lets its replica catch up,
promotes the replica, makes the old primary a replica of it (it answers ``READONLY`` to
every write from then on, on the connections the nodes still hold) and points the proxy
at the new primary: only a node that connects again reaches it.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from typing import Any

import redis

from runtime.testing.local_redis import RedisProcess, free_port, pause_until_caught_up


class SwitchingProxy:
    """Forwards each connection to ``target`` (a port on loopback) as it is when the
    connection is accepted; ``switch`` changes it for the connections accepted later."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.port = free_port()
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._open: list[socket.socket] = []
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def switch(self, target: int) -> None:
        self.target = target

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(("127.0.0.1", self.target), timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            with self._lock:
                self._open += [client, server]
            for source, sink in ((client, server), (server, client)):
                threading.Thread(target=_pump, args=(source, sink), daemon=True).start()

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            for sock in self._open:
                with contextlib.suppress(OSError):
                    sock.close()
            self._open = []


def _pump(source: socket.socket, sink: socket.socket) -> None:
    """Bytes from ``source`` to ``sink`` until either end closes; then both are shut."""
    with contextlib.suppress(OSError):
        while data := source.recv(65536):
            sink.sendall(data)
    for sock in (source, sink):
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


def start_pair(binary: str, args: list[str]) -> tuple[RedisProcess, RedisProcess]:
    """A primary and its replica (both with ``args``), once the replica is in sync."""
    primary = RedisProcess(binary, args).start()
    replica = RedisProcess(binary, args).start()
    client: Any = redis.Redis(port=replica.port, socket_timeout=5)
    try:
        client.replicaof("127.0.0.1", primary.port)
        deadline = time.monotonic() + 30
        while client.info("replication").get("master_link_status") != "up":
            if time.monotonic() > deadline:
                raise SystemExit("chaos: the replica did not sync with its primary")
            time.sleep(0.05)
    finally:
        client.close()
    return primary, replica


def fail_over(
    proxy: SwitchingProxy, primary: RedisProcess, replica: RedisProcess
) -> tuple[float, float]:
    """The replica promoted with no write lost, the old primary demoted to its replica
    (still answering at the connections the nodes hold), the proxy pointed at the new
    primary. The fault ends once the proxy names it."""
    old: Any = redis.Redis(port=primary.port, socket_timeout=10)
    new: Any = redis.Redis(port=replica.port, socket_timeout=10)
    start = time.time()
    try:
        pause_until_caught_up(old, new, 30_000, time.monotonic() + 30)
        new.replicaof("NO", "ONE")
        old.replicaof("127.0.0.1", replica.port)
        proxy.switch(replica.port)
        old.execute_command("CLIENT", "UNPAUSE")
    finally:
        old.close()
        new.close()
    return start, time.time()

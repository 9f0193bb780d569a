"""Throwaway Redis servers on free loopback ports, for tests and benchmarks.

Unlike ``runtime.embedded_redis`` (a supervised actor with persistence), this starts a plain
server process synchronously, with nothing on disk (``--save "" --appendonly no``) unless
asked, in its own temp dir, and never on port 6379.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import redis

#: A primary sends a new replica its data at once, instead of waiting (Redis's default:
#: 5 s) for more replicas to share one diskless transfer.
SYNC_AT_ONCE = ["--repl-diskless-sync-delay", "0"]


def free_port() -> int:
    """A free loopback port a cluster node may use too (its bus port, 10,000 higher, must
    exist: Redis refuses a cluster port above 55535)."""
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port <= 55535:
            return port


@contextlib.contextmanager
def removed_if_it_fails(setup: LocalCluster | LocalSentinel) -> Iterator[None]:
    """A local setup whose start fails (or is interrupted) is removed, its servers stopped,
    rather than left running behind the error."""
    try:
        yield
    except BaseException:
        setup.remove()
        raise


def pause_until_caught_up(primary: Any, replica: Any, pause_ms: int, deadline: float) -> None:
    """Pause writes to ``primary`` (for ``pause_ms`` at most) and wait until ``replica`` has
    every write it took: what a failover does first so that none is lost. ``RuntimeError``
    once ``deadline`` (``time.monotonic()``) passes; the pause is the caller's to end."""
    primary.execute_command("CLIENT", "PAUSE", pause_ms, "WRITE")
    wanted = primary.info("replication").get("master_repl_offset")
    while replica.info("replication").get("slave_repl_offset", -1) < wanted:
        if time.monotonic() > deadline:
            raise RuntimeError("the replica did not catch up with its primary")
        time.sleep(0.02)


class RedisProcess:
    """One redis-server process on a loopback port, in its own temp dir."""

    def __init__(self, binary: str, extra_args: list[str] | None = None) -> None:
        self.binary = binary
        self.dir = Path(tempfile.mkdtemp(prefix="metronome-redis-"))
        self.extra_args = list(extra_args or [])
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _spawn(self, port: int) -> None:
        self.port = port
        self.process = subprocess.Popen(
            [
                self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
                "--dir", str(self.dir), "--save", "", "--appendonly", "no",
                "--logfile", "redis.log", *self.extra_args,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip

    def start(self, port: int | None = None) -> RedisProcess:
        return self.spawn(port).wait_started(port)

    def spawn(self, port: int | None = None) -> RedisProcess:
        """Start the process and return at once: ``wait_started`` waits for it (several
        servers boot side by side)."""
        self._spawn(port or free_port())
        return self

    def wait_started(self, port: int | None = None) -> RedisProcess:
        """Once the spawned server answers PING; one that exits first (its free port taken
        meanwhile) is spawned again, on a new port unless ``port`` is given."""
        for attempt in range(5):
            if attempt:
                self._spawn(port or free_port())
            if self._wait_ready():
                return self
            self.stop()
        log = (self.dir / "redis.log").read_text(errors="replace")[-1000:]
        raise RuntimeError(f"could not start {self.binary}: {log}")

    def start_without_ping(self) -> RedisProcess:
        """Start a server that needs credentials: ready once its port accepts connections."""
        self._spawn(free_port())
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), 0.2),
            ):
                return self
            time.sleep(0.02)
        raise RuntimeError(f"{self.binary} did not open port {self.port}")

    def _wait_ready(self) -> bool:
        client = redis.Redis(port=self.port, socket_timeout=0.5)
        deadline = time.monotonic() + 10
        try:
            while time.monotonic() < deadline:
                assert self.process is not None
                if self.process.poll() is not None:
                    return False
                with contextlib.suppress(redis.exceptions.ConnectionError):
                    if client.ping():
                        return True
                time.sleep(0.01)
            return False
        finally:
            client.close()

    def kill(self) -> None:
        """SIGKILL, as a crash would; the port is free again afterwards."""
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.kill()

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


class LocalCluster:
    """A Redis Cluster of ``size`` primaries, each a local process on a free port, formed
    with CLUSTER ADDSLOTSRANGE and CLUSTER MEET (no redis-cli needed)."""

    SLOTS = 16384

    def __init__(self, binary: str, size: int = 3, replicas: bool = False) -> None:
        args = ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", *SYNC_AT_ONCE]
        if replicas:  # replicas must be able to take over: persist as a primary would
            args += ["--appendonly", "yes", "--appendfsync", "always"]
        self.nodes = [RedisProcess(binary, args) for _ in range(size)]
        self.replicas = [RedisProcess(binary, args) for _ in range(size)] if replicas else []

    @property
    def url(self) -> str:
        return self.nodes[0].url

    def start(self, timeout_s: float = 30.0) -> LocalCluster:
        """Start and form the cluster; one that does not form is removed, not left running."""
        with removed_if_it_fails(self):
            self._form(timeout_s)
        return self

    def _form(self, timeout_s: float) -> None:
        everyone = self.nodes + self.replicas
        for node in everyone:
            node.spawn()
        for node in everyone:
            node.wait_started()
        # Any: redis-py's execute_command is untyped.
        clients: list[Any] = [redis.Redis(port=node.port, socket_timeout=2) for node in everyone]
        try:
            per = self.SLOTS // len(self.nodes)
            for i, client in enumerate(clients[: len(self.nodes)]):
                last = self.SLOTS - 1 if i == len(self.nodes) - 1 else (i + 1) * per - 1
                client.execute_command("CLUSTER", "ADDSLOTSRANGE", i * per, last)
            # Every pair meets: nodes that only heard of each other through gossip take
            # seconds to shake hands.
            for i, client in enumerate(clients):
                for node in everyone[i + 1 :]:
                    client.execute_command("CLUSTER", "MEET", "127.0.0.1", node.port)
            deadline = time.monotonic() + timeout_s
            self._wait(clients, deadline, lambda: all(self._agrees(c, 0) for c in clients))
            for primary, replica in zip(clients, clients[len(self.nodes) :], strict=False):
                node_id = primary.execute_command("CLUSTER", "MYID")
                replica.execute_command("CLUSTER", "REPLICATE", node_id)
            self._wait(clients, deadline, lambda: all(
                b"cluster_state:ok" in c.execute_command("CLUSTER", "INFO")
                and self._agrees(c, len(self.replicas))
                for c in clients
            ) and all(self._synced(r) for r in clients[len(self.nodes) :]))  # fmt: skip
        finally:
            for client in clients:
                client.close()

    @staticmethod
    def _wait(clients: list[Any], deadline: float, ready: Any) -> None:
        while time.monotonic() < deadline:
            if ready():
                return
            time.sleep(0.02)
        raise RuntimeError("local Redis Cluster did not settle")

    def _agrees(self, client: Any, replicas: int) -> bool:
        """Whether a node sees every node of the cluster, none in a handshake or suspected,
        and ``replicas`` of them as replicas (a primary votes in a failover only for a node
        it knows as a replica of the primary failed over)."""
        lines = client.execute_command("CLUSTER", "NODES").decode().splitlines()
        flags = [set(line.split()[2].split(",")) for line in lines]
        unsettled = {"handshake", "noaddr", "fail", "fail?"}
        return (
            len(lines) == len(self.nodes) + len(self.replicas)
            and not any(unsettled & f for f in flags)
            and sum("slave" in f for f in flags) == replicas
        )

    @staticmethod
    def _synced(replica: Any) -> bool:
        return bool(replica.info("replication").get("master_link_status") == "up")

    def fail_over(self, index: int = 0, timeout_s: float = 90.0) -> None:
        """Primary ``index`` and its replica swap roles with no write lost, as ``CLUSTER
        FAILOVER`` does; returns once the replica serves as a primary.

        Done by hand, without the primaries' votes: writes to the primary are paused, the
        replica catches up with it and takes over (``CLUSTER FAILOVER TAKEOVER``), and once
        the primary knows itself a replica the paused writes go on, redirected. ``CLUSTER
        FAILOVER`` itself cannot be relied on on a loaded machine: a vote round later than
        Redis's 5 s is abandoned without a word, and a replica asks for votes again, and
        the primaries grant them, only after a multiple of the cluster node timeout (a
        minute and half a minute by default on Redis 7.0). A step that meets a slow or
        busy server is tried again until ``timeout_s`` runs out."""
        primary: Any = redis.Redis(port=self.nodes[index].port, socket_timeout=10)
        replica: Any = redis.Redis(port=self.replicas[index].port, socket_timeout=10)
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                try:
                    if replica.info("replication").get("role") == "master":
                        return
                    pause_until_caught_up(primary, replica, int(timeout_s * 1000), deadline)
                    replica.execute_command("CLUSTER", "FAILOVER", "TAKEOVER")
                    # Unpaused only once it knows it is a replica: a paused write let
                    # through before would be acknowledged, then lost in its resync.
                    while (
                        replica.info("replication").get("role") != "master"
                        or primary.info("replication").get("role") != "slave"
                    ):
                        if time.monotonic() > deadline:
                            raise RuntimeError("the replica did not take over")
                        time.sleep(0.05)
                    return
                except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError,
                        redis.exceptions.ResponseError):  # fmt: skip
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.5)
        finally:
            with contextlib.suppress(redis.exceptions.RedisError):
                primary.execute_command("CLIENT", "UNPAUSE")
            primary.close()
            replica.close()

    def take_over(self, index: int = 0, timeout_s: float = 30.0) -> None:
        """``CLUSTER FAILOVER TAKEOVER`` on the replica of primary ``index``: it becomes
        the primary without its primary's agreement or the other primaries' votes (the
        way to promote a replica of a killed primary at once); returns once it serves."""
        client: Any = redis.Redis(port=self.replicas[index].port, socket_timeout=2)
        try:
            if client.info("replication").get("role") != "master":  # not promoted already
                client.execute_command("CLUSTER", "FAILOVER", "TAKEOVER")
            deadline = time.monotonic() + timeout_s
            while client.info("replication").get("role") != "master":
                if time.monotonic() > deadline:
                    raise RuntimeError("the replica did not take over")
                time.sleep(0.05)
        finally:
            client.close()

    def remove(self) -> None:
        for node in self.nodes + self.replicas:
            node.remove()


class LocalSentinel:
    """A Sentinel-managed primary: a primary, a replica and three sentinels, each a local
    process on a free port, watching the primary as ``service``."""

    def __init__(self, binary: str, service: str = "metronome") -> None:
        self.binary = binary
        self.service = service
        persist = ["--appendonly", "yes", "--appendfsync", "always", *SYNC_AT_ONCE]
        self.primary = RedisProcess(binary, persist)
        self.replica = RedisProcess(binary, persist)
        self.sentinels: list[subprocess.Popen[bytes]] = []
        self.sentinel_ports: list[int] = []
        self.dir = Path(tempfile.mkdtemp(prefix="metronome-sentinel-"))

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.sentinel_ports)
        return f"redis+sentinel://{hosts}/{self.service}"

    def start(self, timeout_s: float = 30.0) -> LocalSentinel:
        """Start everything and wait until it settles; a setup that does not is removed,
        not left running."""
        with removed_if_it_fails(self):
            self._settle(timeout_s)
        return self

    def _settle(self, timeout_s: float) -> None:
        self.primary.start()
        self.replica.extra_args += ["--replicaof", "127.0.0.1", str(self.primary.port)]
        self.replica.start()
        deadline = time.monotonic() + timeout_s
        # Synced before the sentinels start: a sentinel lists a primary's replicas from its
        # INFO, asked at once and then every 10 s.
        while not self._replica_synced():
            if time.monotonic() > deadline:
                raise RuntimeError("the local Sentinel's replica did not sync")
            time.sleep(0.02)
        for i in range(3):
            port = free_port()
            conf = self.dir / f"sentinel-{i}.conf"
            conf.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {self.dir}\n"
                f"sentinel monitor {self.service} 127.0.0.1 {self.primary.port} 2\n"
                f"sentinel down-after-milliseconds {self.service} 1000\n"
                f"sentinel failover-timeout {self.service} 5000\n"
                f"sentinel parallel-syncs {self.service} 1\n"
            )
            self.sentinels.append(
                subprocess.Popen(
                    [self.binary, str(conf), "--sentinel", "--logfile", f"sentinel-{i}.log"],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    cwd=self.dir,
                )
            )
            self.sentinel_ports.append(port)
        while time.monotonic() < deadline:
            if all(self._settled(p) for p in self.sentinel_ports):
                return
            time.sleep(0.02)
        raise RuntimeError("local Sentinel setup did not settle")

    def master_port(self) -> int | None:
        """The primary's port as the sentinels see it now."""
        for port in self.sentinel_ports:
            with contextlib.suppress(redis.exceptions.ConnectionError):
                client: Any = redis.Redis(port=port, socket_timeout=1)
                try:
                    reply = client.execute_command(
                        "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service
                    )
                finally:
                    client.close()
                if reply:
                    return int(reply[1])
        return None

    def _replica_synced(self) -> bool:
        client = redis.Redis(port=self.replica.port, socket_timeout=1)
        try:
            return client.info("replication").get("master_link_status") == "up"
        except redis.exceptions.ConnectionError:
            return False
        finally:
            client.close()

    def _settled(self, port: int) -> bool:
        """Whether the sentinel on ``port`` knows the replica and the other sentinels (a
        failover needs their votes)."""
        client: Any = redis.Redis(port=port, socket_timeout=1)
        try:
            others = len(self.sentinel_ports) - 1
            return bool(client.sentinel_slaves(self.service)) and (
                len(client.sentinel_sentinels(self.service)) >= others
            )
        except redis.exceptions.RedisError:
            return False
        finally:
            client.close()

    def remove(self) -> None:
        for proc in self.sentinels:
            proc.kill()
            proc.wait()
        self.primary.remove()
        self.replica.remove()
        shutil.rmtree(self.dir, ignore_errors=True)

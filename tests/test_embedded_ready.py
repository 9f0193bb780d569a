"""When a starting embedded server is ready: a real redis-server that loads its data slowly
(``key-load-delay``, one of its own debug settings), and one that stops answering
(SIGSTOP)."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest
import redis
import trio

from runtime.embedded_redis import find_server_binary
from runtime.errors import RuntimeStartError
from runtime.redis_readiness import Answer, probe, probe_client, wait_ready

KEYS = 2000
#: Each key takes this long to load (µs), so the dataset loads for a couple of seconds.
KEY_LOAD_DELAY_US = 1500


def _server(directory: Path, *extra: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            find_server_binary(), "--port", "0", "--unixsocket", str(directory / "redis.sock"),
            "--dir", str(directory), "--save", "", "--appendonly", "no",
            "--logfile", "redis.log", *extra,
        ],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip


def _client(directory: Path, timeout_s: float = 1.0) -> redis.Redis:
    return probe_client(directory / "redis.sock", None, timeout_s)


def _wait_pong(client: redis.Redis) -> None:
    for _ in range(500):
        try:
            client.ping()
            return
        except redis.exceptions.RedisError:
            time.sleep(0.02)
    raise AssertionError("the server never answered")


@pytest.fixture
def slow_loading(tmp_path: Path) -> Path:
    """A data dir whose dump loads for a couple of seconds."""
    filler = _server(tmp_path)
    client = _client(tmp_path)
    try:
        _wait_pong(client)
        pipe = client.pipeline(transaction=False)
        for i in range(KEYS):
            pipe.set(f"k{i}", "x" * 100)
        pipe.execute()
        client.save()
    finally:
        client.close()
        filler.terminate()
        filler.wait()
    return tmp_path


def test_a_server_loading_for_longer_than_the_silence_limit_is_waited_for(
    slow_loading: Path,
) -> None:
    """It answers LOADING all along: alive and making progress, so it is waited for past
    the limit on silence, with a progress report at once and then every interval."""
    server = _server(
        slow_loading,
        "--key-load-delay", str(KEY_LOAD_DELAY_US),
        "--loading-process-events-interval-bytes", "1024",
    )  # fmt: skip
    client = _client(slow_loading)
    reports: list[tuple[float, float | None]] = []

    def running() -> None:
        assert server.poll() is None, "the server exited"

    async def report(elapsed_s: float) -> None:
        info = await trio.to_thread.run_sync(client.info, "persistence")
        reports.append((elapsed_s, info.get("loading_loaded_perc")))

    try:
        trio.run(
            lambda: wait_ready(
                lambda: probe(client), running, report, silence_limit_s=1.5, report_every_s=0.3
            )
        )
        assert client.dbsize() == KEYS  # ready: everything loaded
    finally:
        client.close()
        server.terminate()
        server.wait()
    assert len(reports) >= 2, reports
    assert reports[-1][0] > 1.5, reports  # it loaded for longer than the silence limit
    percents = [perc for _, perc in reports if perc is not None]
    assert percents and percents == sorted(percents) and 0 <= percents[-1] < 100, reports


def test_a_server_that_answers_nothing_is_given_up_after_the_silence_limit(
    tmp_path: Path,
) -> None:
    server = _server(tmp_path)
    client = _client(tmp_path, timeout_s=0.3)
    try:
        _wait_pong(client)
        server.send_signal(signal.SIGSTOP)  # alive, but answers nothing
        with pytest.raises(RuntimeStartError, match=r"gave no answer for 1 s"):
            trio.run(
                lambda: wait_ready(
                    lambda: probe(client), lambda: None, _never_called, silence_limit_s=1.0
                )
            )
        assert probe(client) is Answer.NONE
    finally:
        client.close()
        server.send_signal(signal.SIGCONT)
        server.terminate()
        server.wait()


def test_a_server_that_exits_while_starting_ends_the_wait_with_its_reason(
    tmp_path: Path,
) -> None:
    server = _server(tmp_path, "--no-such-setting", "1")
    server.wait()  # refuses its config at once
    client = _client(tmp_path)

    def running() -> None:
        if server.poll() is not None:
            raise RuntimeStartError(f"exited with status {server.returncode}")

    try:
        with pytest.raises(RuntimeStartError, match="exited with status 1"):
            trio.run(lambda: wait_ready(lambda: probe(client), running, _never_called))
    finally:
        client.close()


async def _never_called(_elapsed_s: float) -> None:
    raise AssertionError("no server here was loading")

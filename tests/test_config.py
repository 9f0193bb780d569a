"""node.toml loading: typed classes, and errors that name the key path."""

from __future__ import annotations

import fcntl
import subprocess
import sys
from pathlib import Path

import pytest

from actors.config import Config
from runtime.app import load_app
from runtime.config import structure
from runtime.errors import ConfigError
from tests.node_process import REPO


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "node.toml"
    path.write_text(text)
    return path


def test_example_configs_load() -> None:
    app = load_app(REPO / "deploy" / "node.toml")
    assert isinstance(app.config, Config)
    assert app.config.redis.url == "embedded"
    assert set(app.config.consumers) == {"demo"}
    poller = load_app(REPO / "deploy" / "poller.toml").config
    consumer = load_app(REPO / "deploy" / "consumer.toml").config
    assert (poller.scheduler.pollers, poller.consumers) == (1, {})
    assert (consumer.scheduler.pollers, set(consumer.consumers)) == (0, {"demo"})


def test_defaults_fill_an_empty_file(tmp_path: Path) -> None:
    app = load_app(write(tmp_path, ""))
    assert app.config.namespace == "metronome"
    assert app.node.shutdown_grace_s == 10.0
    assert app.config.scheduler.partitions is None
    assert app.config.new_namespace_partitions() == 16
    assert app.config.scheduler.buckets == 1024


def test_a_new_namespace_on_a_cluster_gets_partitions_enough_to_spread(tmp_path: Path) -> None:
    """Not set, partitions are 16 on a standalone Redis and 64 on a Redis Cluster (the busiest
    master sets a cluster's ceiling); set, they are what is set."""
    cluster = '[redis]\nurl = "redis://127.0.0.1:7000"\ncluster = true\n'
    assert load_app(write(tmp_path, cluster)).config.new_namespace_partitions() == 64
    both = cluster + "[scheduler]\npartitions = 24\n"
    assert load_app(write(tmp_path, both)).config.new_namespace_partitions() == 24


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        (
            "[scheduler]\npolers = 2\n",
            "scheduler: unknown key 'polers' (did you mean 'pollers'?)",
        ),
        ("[redis]\nurl = 5\n", "redis.url: expected str, got int 5"),
        ('[redis]\nurl = "redis://h:6379x"\n', "redis.url: 'redis://h:6379x' is not a Redis URL"),
        (
            '[redis]\nurl = "redis://:hunter2@h/metronome"\n',
            "the path of 'redis://***@h/metronome' is a database number (/0), got 'metronome'",
        ),
        ('[redis]\nurl = "unix:///r.sock?db=one"\n', "the db of 'unix:///r.sock?db=one' is a"),
        (
            '[redis]\nurl = "redis://h"\ntls_ca_file = "ca.crt"\n',
            "redis.tls_ca_file: TLS files go with a rediss://",
        ),
        ('[scheduler]\npollers = "2"\n', "scheduler.pollers: expected int, got str '2'"),
        (
            "[node]\nshutdown_grace_s = -1\n",
            "node.shutdown_grace_s: must be > 0 and at most 2^53, got -1.0",
        ),
        ('namespace = "a{b}"\n', "namespace: namespace 'a{b}' must be 1-64 characters"),
        ('[log]\nformat = "xml"\n', "log.format:"),
        ("wat = 1\n", "unknown key 'wat'"),
        ("[scheduler]\nbuckets = 0\n", "scheduler.buckets: must be within 1..65536, got 0"),
        ("[scheduler]\npartitions = 0\n", "scheduler.partitions: must be within 1..1024, got 0"),
        ('[scheduler]\npartitions = "64"\n', "scheduler.partitions: expected int"),
        ("[scheduler]\ndefinition_cache = -1\n", "scheduler.definition_cache: must be >= 0"),
        (
            "[scheduler]\nclaim_lease_ms = 90000\n",
            "scheduler.dedupe_window_s: must be longer than claim_lease_ms (90000 ms), got 60 s",
        ),
        (
            "[redis]\nmax_connections = 9\n"
            + "".join(f'[consumers.t{i}]\nhandler = "actors.examples:echo"\n' for i in range(2)),
            "redis.max_connections: 9 is too few for 2 consumer types",
        ),
        (
            '[redis]\nsocket_timeout_s = 1\n[consumers.t]\nhandler = "actors.examples:echo"\n'
            "block_ms = 2000\n",
            "consumers.t.block_ms: 2000 ms must be at most half of redis.socket_timeout_s (1 s)",
        ),
        ("[node]\nrestart_attempts = 0\n", "node.restart_attempts: must be within 1..10000"),
        # no infinity, no number past 2^53: refused here, not an overflow later
        ("[scheduler]\ndedupe_window_s = inf\n", "scheduler.dedupe_window_s: must be >= 0 and"),
        ("[node]\nshutdown_grace_s = inf\n", "node.shutdown_grace_s: must be > 0 and at most"),
        (
            "[scheduler]\nclaim_lease_ms = 100000000000000000000\n",
            "scheduler.claim_lease_ms: must be within 100..3600000",
        ),
        ('[consumers.t]\nhandler = "actors.examples:echo"\nlease_s = inf\n', "lease_s: must be"),
    ],
)
def test_config_errors_name_the_key(tmp_path: Path, toml: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_app(write(tmp_path, toml))
    assert message in str(info.value)
    assert str(tmp_path / "node.toml") in str(info.value)


def test_every_problem_is_reported_at_once() -> None:
    with pytest.raises(ConfigError) as info:
        structure({"scheduler": {"pollers": "x", "batch_sise": 1}}, Config, "n.toml")
    text = str(info.value)
    assert "scheduler.pollers" in text
    assert "did you mean 'batch_size'" in text


def test_invalid_toml_names_the_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"invalid TOML: .*line 2"):
        load_app(write(tmp_path, "[node]\nname = \n"))


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config"):
        load_app(tmp_path / "nope.toml")


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "runtime", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
        check=False,
    )


def test_cli_config_error_is_one_line_and_exit_status_2(tmp_path: Path) -> None:
    result = run_cli(str(write(tmp_path, "[scheduler]\nconcurency = 3\n")))
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("config error: ")
    assert "scheduler: unknown key 'concurency'" in lines[0]


def test_embedded_redis_cannot_be_a_cluster(tmp_path: Path) -> None:
    result = run_cli("--check", str(write(tmp_path, '[redis]\nurl = "embedded"\ncluster = true\n')))
    assert result.returncode == 2
    assert "redis.cluster: the embedded server is a single standalone Redis" in result.stderr


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("redis://h/0?socket_timeout=fast", "Invalid value for 'socket_timeout'"),
        ("redis://:pw@h/0?ssl_cert_reqs=none&sockettimeout=1",
         "no such connection option: sockettimeout, ssl_cert_reqs"),
        ("redis://h/0?max_connections=50&socket_keepalive=true", None),
    ],
)  # fmt: skip
def test_a_url_option_redis_py_cannot_take_is_a_config_error(
    tmp_path: Path, url: str, message: str | None
) -> None:
    """Read by redis-py as the node built its client, such an option failed the node in a
    traceback (or at its first call): ``--check`` says it in one line naming the key. The
    options of its connection and its pool pass."""
    result = run_cli("--check", str(write(tmp_path, f'[redis]\nurl = "{url}"\n')))
    if message is None:
        assert result.returncode == 0, result.stderr
        return
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("config error: redis.url: ") and message in line
    assert ":pw@" not in line


def test_check_locks_and_writes_nothing_of_an_embedded_servers_data_dir(
    tmp_path: Path,
) -> None:
    """``--check`` beside a running node (its data dir locked) answers at once, and on a
    fresh data dir creates nothing there: run as root before the first start, files it
    made would be root's, and the node, started as its own user, could not open them."""
    data = tmp_path / "data"
    toml = f'[redis]\nurl = "embedded"\ndata_dir = "{data}"\nembedded_port = 6399\n'
    fresh = run_cli("--check", str(write(tmp_path, toml)))
    assert fresh.returncode == 0, fresh.stderr
    assert not data.exists() or not any(data.iterdir())
    data.mkdir(exist_ok=True)
    with open(data / "metronome.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # as a running node holds it
        busy = run_cli("--check", str(write(tmp_path, toml)))
    assert busy.returncode == 0, busy.stderr


def test_cli_check_validates_without_running() -> None:
    result = run_cli("--check", "deploy/node.toml")
    assert result.returncode == 0
    assert result.stdout.strip() == "deploy/node.toml: ok"


def test_cli_help_explains_usage() -> None:
    result = run_cli("--help")
    assert result.returncode == 0
    assert "NODE_TOML" in result.stdout
    assert "SIGTERM" in result.stdout


@pytest.mark.parametrize("section", ["api", "metrics"])
@pytest.mark.parametrize("bind", ["256.1.1.1:8080", "1.2.3.4.5:8080", "::1:8080", "[nope]:8080"])
def test_a_bind_address_that_is_no_ip_address_is_a_config_error(
    tmp_path: Path, section: str, bind: str
) -> None:
    """An address written as numbers that is none passed the check and failed only when
    the listener started: the actor crash-looped, and the node gave up."""
    keys = '[[api.keys]]\nid = "admin"\nsecret = "0123456789abcdef0123"\n'
    toml = f'[{section}]\nbind = "{bind}"\n' + (keys if section == "api" else "")
    result = run_cli("--check", str(write(tmp_path, toml)))
    assert result.returncode == 2, result.stderr
    assert "is not an IP address" in result.stderr and bind in result.stderr


@pytest.mark.parametrize(("bind", "refused"), [("0.0.0.0:0", True), ("127.0.0.1:0", False)])
def test_a_placeholder_secret_is_refused_on_an_api_that_listens_beyond_this_host(
    tmp_path: Path, bind: str, refused: bool
) -> None:
    """The examples' secrets say ``change-me``: an API reachable from elsewhere under one
    of them serves anyone who read the examples. Kept on this host (the quick start), it
    is allowed."""
    toml = (
        f'[api]\nbind = "{bind}"\n[[api.keys]]\nid = "admin"\n'
        'secret = "change-me-to-48-random-hex-characters"\n'
    )
    result = run_cli("--check", str(write(tmp_path, toml)))
    if refused:
        assert result.returncode == 2, result.stderr
        assert "api.keys 'admin': the secret is an example's placeholder" in result.stderr
    else:
        assert result.returncode == 0, result.stderr

"""``python -m bench screenshots [OUT_DIR]``: PNGs of the dashboard's main views (queues,
dead letters, nodes, a task's explanation) for docs/, from a real node with a little
traffic, in headless Chromium (Debian's ``chromium``; Playwright drives it)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from actors.admin.client import Client
from runtime.embedded_redis import find_server_binary
from runtime.testing.local_redis import RedisProcess, free_port

KEY = ("admin", "screenshot-secret-0123456789")
CONFIG = """
namespace = "shots"
[node]
name = "host-1"
[redis]
url = "{url}"
[scheduler]
max_tick_s = 0.05
[execution]
results_log = "{dir}/results.jsonl"
[consumers.email]
handler = "actors.examples:echo"
[consumers.report]
handler = "actors.examples:echo"
[consumers.billing]
handler = "actors.examples:fail"
max_attempts = 1
[api]
bind = "127.0.0.1:{port}"
[[api.keys]]
id = "{key}"
secret = "{secret}"
"""


def take(out_dir: Path, chromium: str) -> list[Path]:
    from playwright.sync_api import sync_playwright

    out_dir.mkdir(parents=True, exist_ok=True)
    server = RedisProcess(find_server_binary()).start()
    work = Path(tempfile.mkdtemp(prefix="metronome-shots-"))
    port = free_port()
    config = work / "node.toml"
    config.write_text(CONFIG.format(url=server.url, dir=work, port=port, key=KEY[0],
                                    secret=KEY[1]))  # fmt: skip
    node = subprocess.Popen([sys.executable, "-m", "runtime", str(config)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(url)
        _traffic(url)
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1280, "height": 640})
            page.goto(url + "/dashboard/")
            page.fill("#key-id", KEY[0])
            page.fill("#secret", KEY[1])
            page.click("#login button[type=submit]")
            page.locator("#queues tbody tr").first.wait_for()
            page.wait_for_timeout(4500)  # two refreshes: fires/s and the sparkline
            shots = [out_dir / "dashboard-queues.png"]
            page.screenshot(path=shots[-1])
            page.click('#tabs button[data-view="dlq"]')
            page.select_option("#dlq-type", "billing")
            page.locator("#dlq tbody tr").first.wait_for()
            page.locator("#dlq tbody tr button", has_text="Show").first.click()
            page.locator("#dlq-detail").wait_for()
            shots.append(out_dir / "dashboard-dlq.png")
            page.screenshot(path=shots[-1])
            page.click('#tabs button[data-view="nodes"]')
            page.locator(".node").first.wait_for()
            shots.append(out_dir / "dashboard-nodes.png")
            page.screenshot(path=shots[-1], full_page=True)  # the partitions are below
            page.click('#tabs button[data-view="tasks"]')
            page.fill("#task-id", "daily-digest")
            page.click("#task-search button")
            page.locator("#explain li").first.wait_for()
            page.fill("#list-type", "email")
            page.click("#task-list button")
            page.locator("#tasks tbody tr").first.wait_for()
            shots.append(out_dir / "dashboard-task.png")
            page.screenshot(path=shots[-1])
            browser.close()
        return shots
    finally:
        node.terminate()
        node.wait(30)
        server.remove()
        shutil.rmtree(work, ignore_errors=True)


def _wait_ready(url: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/readyz", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise RuntimeError("the node did not become ready")


def _traffic(url: str) -> None:
    with Client(url, *KEY) as api:
        api.create_task("email", {"kind": "cron", "cron": "0 9 * * 1-5", "tz": "Europe/Paris"},
                        {"to": "team@example.com"}, "daily-digest")  # fmt: skip
        every = {"kind": "interval", "every_s": 1}
        api.create_tasks([{"type": "email", "schedule": every, "payload": i} for i in range(40)])
        api.create_tasks([{"type": "report", "schedule": every, "payload": i} for i in range(15)])
        now = int(time.time() * 1000)
        api.create_tasks([{"type": "billing", "schedule": {"kind": "once", "at_ms": now},
                           "payload": {"invoice": i}} for i in range(4)])  # fmt: skip
    time.sleep(3)


def main(out_dir: str) -> dict[str, object]:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("screenshots need Debian's chromium: apt-get install chromium")
    shots = take(Path(out_dir), chromium)
    return {"screenshots": [str(p) for p in shots]}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1] if len(sys.argv) > 1 else "docs")))

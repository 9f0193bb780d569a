"""Run ``python -m runtime`` as a real process and read its JSON log lines."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def alive(pid: int) -> bool:
    """Whether a process runs; a zombie (exited, not yet reaped) counts as gone."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/stat")
    return status.exists() and status.read_text().split()[2] != "Z"


class NodeProcess:
    """A node process whose stdout (JSON lines) is collected by a reader thread."""

    def __init__(
        self,
        config: Path,
        *extra: str,
        cwd: Path | None = None,
        own_group: bool = False,
        pythonpath: tuple[Path, ...] = (),
        launcher: tuple[str, ...] = (),
    ) -> None:
        """``own_group``: the node leads a process group of its own, like a command started
        at a terminal (``signal_group`` then signals it as Ctrl-C would). ``pythonpath``:
        directories the node imports from after the repository (a test's handler modules).
        ``launcher``: the command that runs the node instead of this interpreter's
        ``python -m runtime`` (e.g. an installed ``metronome serve``); it imports Metronome
        from its own installation, not from the repository."""
        on_path = pythonpath if launcher else (REPO, *pythonpath)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, on_path)),
               "PYTHONUNBUFFERED": "1"}  # fmt: skip
        self.proc = subprocess.Popen(
            [*(launcher or (sys.executable, "-m", "runtime")), str(config), *extra],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=cwd or REPO,
            env=env,
            text=True,
            process_group=0 if own_group else None,
        )
        self.lines: list[dict[str, Any]] = []
        self.raw: list[str] = []
        self._stderr: list[str] = []
        self._lock = threading.Lock()
        self._new_line = threading.Condition(self._lock)  # or the end of the output
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._err_reader = threading.Thread(target=self._read_stderr, daemon=True)
        self._err_reader.start()

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        with self.proc.stderr:
            for line in self.proc.stderr:
                self._stderr.append(line)

    def _read(self) -> None:
        assert self.proc.stdout is not None
        with self.proc.stdout:
            for line in self.proc.stdout:
                with self._lock:
                    self.raw.append(line)
                    with contextlib.suppress(json.JSONDecodeError):
                        self.lines.append(json.loads(line))
                    self._new_line.notify_all()
        with self._lock:
            self._new_line.notify_all()

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        with self._lock:
            return [e for e in self.lines if name is None or e.get("event") == name]

    def wait_for(self, event: str, count: int = 1, timeout_s: float = 60.0) -> list[dict[str, Any]]:
        """Every ``event`` line so far, once there are ``count``; fails if the node exits or
        ``timeout_s`` passes first."""
        deadline = time.monotonic() + timeout_s
        found: list[dict[str, Any]] = []
        with self._lock:
            while (left := deadline - time.monotonic()) > 0:
                found = [e for e in self.lines if e.get("event") == event]
                if len(found) >= count or self.proc.poll() is not None:
                    break
                self._new_line.wait(min(left, 0.1))
        if self.proc.poll() is not None:
            self._reader.join(5)  # the lines it wrote before it exited
            found = self.events(event)
        if len(found) >= count:
            return found
        raise AssertionError(
            f"no {count}x {event!r} within {timeout_s}s; exit={self.proc.poll()}; "
            f"stderr={self.stderr_text()!r}; last lines={self.raw[-5:]!r}"
        )

    def signal_group(self, signum: int = signal.SIGINT) -> None:
        """Signal every process of the node's group (needs ``own_group``): a terminal's
        Ctrl-C."""
        os.killpg(self.proc.pid, signum)

    def signal(self, signum: int = signal.SIGTERM) -> None:
        self.proc.send_signal(signum)

    def wait(self, timeout_s: float = 60.0) -> int:
        code = self.proc.wait(timeout_s)
        self._reader.join(5)
        self._err_reader.join(5)
        return code

    def stderr_text(self) -> str:
        return "".join(self._stderr)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.wait()

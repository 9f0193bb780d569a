"""The ``metronome`` command run in the test's own process: ``main(argv)`` with the
environment, stdout and stderr it would have as a process, answered as a
``subprocess.CompletedProcess``.

A console-script start costs a fresh interpreter and its imports (~0.15 s of CPU); the CLI
tests make well over a hundred calls, so most of them go through ``main`` directly. What only
a real process shows (the installed entry point, exit statuses seen by a shell, a closed pipe,
``serve``) stays tested with ``subprocess`` (``tests/test_cli.py``).
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping

from actors.admin.cli import main

#: One call at a time in a process: the environment and the standard streams are global.
_LOCK = threading.Lock()


@contextlib.contextmanager
def _environment(env: Mapping[str, str]) -> Iterator[None]:
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def run_in_process(args: list[str], env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    """What ``metronome *args`` with environment ``env`` prints and exits with. ``serve``
    runs a node: a real process only (``run_process``)."""
    if "serve" in args:
        raise ValueError("metronome serve runs a node: run it as a process")
    out, err = io.StringIO(), io.StringIO()
    with _LOCK, _environment(env), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as exit_:  # as the interpreter reads it: argparse's 2, --help's 0
            if exit_.code is None or isinstance(exit_.code, int):
                code = exit_.code or 0
            else:
                print(exit_.code, file=sys.stderr)
                code = 1
    return subprocess.CompletedProcess(["metronome", *args], code, out.getvalue(), err.getvalue())

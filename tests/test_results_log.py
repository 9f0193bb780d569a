"""The results log rotates by size without losing a line, also with several processes
appending to it (a node with ``[processes] consumers = N``)."""

from __future__ import annotations

import errno
import json
import multiprocessing
from pathlib import Path
from typing import Any

import pytest
import trio

from actors.execution.results_log import ResultsLog, append_waiting, encode_result
from runtime.logging import get_logger

LINES_PER_WRITER, BATCH = 2000, 10


def write_lines(path: str, writer: int, max_bytes: int) -> None:
    log = ResultsLog(Path(path), max_bytes=max_bytes, backups=1000)
    for start in range(0, LINES_PER_WRITER, BATCH):
        log.append([{"writer": writer, "n": n} for n in range(start, start + BATCH)])


def test_rotation_keeps_every_line_across_processes(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    context = multiprocessing.get_context("spawn")
    writers = [context.Process(target=write_lines, args=(str(path), w, 20_000)) for w in range(3)]
    for process in writers:
        process.start()
    for process in writers:
        process.join(60)
        assert process.exitcode == 0
    files = [path, *sorted(tmp_path.glob("results.jsonl.*[0-9]"))]
    assert len(files) > 3  # it did rotate
    seen = [json.loads(line) for f in files for line in f.read_text().splitlines()]
    assert sorted((r["writer"], r["n"]) for r in seen) == [
        (w, n) for w in range(3) for n in range(LINES_PER_WRITER)
    ]


def test_old_files_beyond_the_backups_are_deleted(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    log = ResultsLog(path, max_bytes=100, backups=2)
    for n in range(20):
        log.append([{"n": n, "pad": "x" * 60}])
    names = sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock"))
    assert names == ["results.jsonl.1", "results.jsonl.2"]  # the live one was just rotated
    newest = json.loads((tmp_path / "results.jsonl.1").read_text().splitlines()[-1])
    assert newest["n"] == 19


def test_size_zero_never_rotates(tmp_path: Path) -> None:
    log = ResultsLog(tmp_path / "r.jsonl")
    for n in range(100):
        log.append([{"n": n, "pad": "x" * 100}])
    assert [p.name for p in tmp_path.iterdir()] == ["r.jsonl"]


def test_a_rotation_that_fails_leaves_the_lines_written_once(tmp_path: Path) -> None:
    """The lines are written before the rotation: a rotation that fails (here its lock
    file cannot be opened) is left to a later write, never raised to a caller that would
    write the same lines again."""
    path = tmp_path / "results.jsonl"
    (tmp_path / "results.jsonl.lock").mkdir()  # opening it fails
    log = ResultsLog(path, max_bytes=10, backups=2)
    log.append([{"n": 1}])
    log.append([{"n": 2}])
    assert [json.loads(line) for line in path.read_text().splitlines()] == [{"n": 1}, {"n": 2}]


class _CutPath(type(Path())):  # type: ignore[misc]
    """A path whose next ``cuts`` appends write part of a line, then fail (a full disk)."""

    cuts, part = 0, b'{"n":9,"cu'

    def open(self, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        out = super().open(mode, *args, **kwargs)
        if mode == "ab" and _CutPath.cuts:
            _CutPath.cuts -= 1
            out.write(_CutPath.part)
            out.close()
            raise OSError(errno.ENOSPC, "No space left on device")
        return out


def test_a_write_after_one_that_failed_keeps_its_lines_whole(tmp_path: Path) -> None:
    """A write after one that failed leaving part of a line begins on a new line (the part
    line stays one of its own), whoever makes it: the failed write's caller, or another
    consumer of the process sharing the log; after a failure that left a whole line, or
    none, no blank line is added."""
    path = _CutPath(tmp_path / "results.jsonl")
    log, other = ResultsLog(path), ResultsLog(path)
    log.append_lines(['{"n":1}'])
    _CutPath.cuts, _CutPath.part = 1, b'{"n":9,"cu'
    with pytest.raises(OSError, match="No space left"):
        log.append_lines(['{"n":2}'])
    other.append_lines(['{"m":1}'])
    with path.open("a") as out:
        out.write('{"n":3}\n')  # a whole line, then a failure that left nothing
    _CutPath.cuts, _CutPath.part = 1, b""
    with pytest.raises(OSError, match="No space left"):
        log.append_lines(['{"n":4}'])
    log.append_lines(['{"n":4}'])
    written = path.read_text().splitlines()
    assert written == ['{"n":1}', '{"n":9,"cu', '{"m":1}', '{"n":3}', '{"n":4}']


async def test_the_last_flush_after_a_cut_off_try_mends_the_part_line(tmp_path: Path) -> None:
    """A batch's write failed halfway and its tries were cut off while waiting (the node
    stopping); the consumer's last flush writes the batch afresh, on a line of its own:
    joined to the part line, the batch's first line would be lost, its fire acknowledged."""
    path = _CutPath(tmp_path / "results.jsonl")
    log = ResultsLog(path)
    lines = ['{"n":1}', '{"n":2}']
    _CutPath.cuts, _CutPath.part = 1, b'{"n":9,"cu'
    with trio.move_on_after(0.05):  # within the first pause between tries
        await append_waiting(log, lines, get_logger(actor="test"))
    await append_waiting(log, lines, get_logger(actor="test"))
    assert path.read_text().splitlines() == ['{"n":9,"cu', *lines]


def test_a_processs_first_write_mends_a_part_line_an_earlier_one_left(tmp_path: Path) -> None:
    """A process killed halfway through a write left part of a line: the next process's
    first write (its consumer prepared the log) begins on a new line."""
    path = tmp_path / "results.jsonl"
    path.write_text('{"n":1}\n{"n":2,"cu')
    log = ResultsLog(path)
    log.prepare()
    log.append_lines(['{"n":3}'])
    log.append_lines(['{"n":4}'])
    assert path.read_text().splitlines() == ['{"n":1}', '{"n":2,"cu', '{"n":3}', '{"n":4}']


def test_a_result_no_json_or_text_carries_is_written_as_what_it_is() -> None:
    """A handler's result becomes JSON whatever it is: an int past 4,300 digits has no
    text in Python (str raises), which crashed the consumer mid-flush and left its
    batch acknowledged without a single results line."""
    big = json.loads(encode_result(10**5000))
    assert big == "<int without text>"
    assert json.loads(encode_result(float("nan"))) == "nan"
    assert json.loads(encode_result({"a": [1, "b"]})) == {"a": [1, "b"]}
    assert json.loads(encode_result(7)) == 7

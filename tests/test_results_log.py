"""The results log rotates by size without losing a line, also with several processes
appending to it (a node with ``[processes] consumers = N``)."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

from actors.execution.results_log import ResultsLog

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


def test_a_write_tried_again_keeps_its_lines_whole(tmp_path: Path) -> None:
    """A write tried again after a failure that left part of a line begins on a new line
    (the part line stays one of its own); after a failure that left nothing, or a whole
    line, it adds no blank line."""
    path = tmp_path / "results.jsonl"
    log = ResultsLog(path)
    log.append_lines(['{"n":1}'], mend=True)  # no file yet
    log.append_lines(['{"n":2}'], mend=True)  # ends in a newline: none added
    with path.open("a") as out:
        out.write('{"n":3,"cut')  # what a failed write left
    log.append_lines(['{"n":3}'], mend=True)
    assert path.read_text().splitlines() == ['{"n":1}', '{"n":2}', '{"n":3,"cut', '{"n":3}']

"""Following a directory of hourly files on a real filesystem: partial lines, rotation, truncation, replacement."""

from __future__ import annotations

import os
from pathlib import Path

from kvscope.collectors.requests.log_tail import DirectoryTail

PATTERN = "app-*.log"


def append(path: Path, data: bytes) -> None:
    with open(path, "ab") as handle:
        handle.write(data)


def followed(tmp_path: Path, **options: int) -> tuple[Path, DirectoryTail]:
    """An empty hourly file and a tail that follows it from its (empty) end."""
    log = tmp_path / "app-20261205_20.log"
    log.write_bytes(b"")
    return log, DirectoryTail(str(tmp_path), PATTERN, **options)  # type: ignore[arg-type]


def test_a_missing_directory_is_no_data(tmp_path: Path) -> None:
    tail = DirectoryTail(str(tmp_path / "not-yet"), PATTERN)
    read = tail.read()
    assert read.lines == [] and read.bytes_read == 0 and tail.current is None


def test_start_at_end_skips_what_was_written_before(tmp_path: Path) -> None:
    log = tmp_path / "app-20261205_20.log"
    log.write_bytes(b"old 1\nold 2\n")
    tail = DirectoryTail(str(tmp_path), PATTERN, "end")
    assert tail.read().lines == []
    append(log, b"new 1\n")
    assert tail.read().lines == [b"new 1"]
    whole = DirectoryTail(str(tmp_path), PATTERN, "start")
    assert whole.read().lines == [b"old 1", b"old 2", b"new 1"]


def test_a_partial_line_waits_for_its_newline(tmp_path: Path) -> None:
    log, tail = followed(tmp_path)
    append(log, b'{"id": "a"}\n{"id": ')
    assert tail.read().lines == [b'{"id": "a"}']
    assert tail.read().lines == []
    append(log, b'"b"}\n')
    assert tail.read().lines == [b'{"id": "b"}']


def test_the_next_hour_is_read_after_the_rest_of_this_one(tmp_path: Path) -> None:
    first, tail = followed(tmp_path)
    append(first, b"a\n")
    assert tail.read().lines == [b"a"]
    append(first, b"b\n")  # the last line of the hour, then the writer moves on
    (tmp_path / "app-20261205_21.log").write_bytes(b"c\n")
    (tmp_path / "app-20261205_22.log").write_bytes(b"d\n")
    (tmp_path / "other.txt").write_bytes(b"not ours\n")
    read = tail.read()
    assert read.lines == [b"b", b"c", b"d"] and read.reopened == {"rotated": 2}
    assert tail.current == "app-20261205_22.log"


def test_a_truncated_file_is_read_again_from_its_start(tmp_path: Path) -> None:
    log, tail = followed(tmp_path)
    append(log, b"first line, long enough\n")
    assert tail.read().lines == [b"first line, long enough"]
    with open(log, "r+b") as handle:  # copytruncate: the same inode, emptied, then written again
        handle.truncate(0)
    append(log, b"after\n")
    read = tail.read()
    assert read.lines == [b"after"] and read.reopened == {"truncated": 1}


def test_a_file_replaced_under_its_name_is_read_from_its_start(tmp_path: Path) -> None:
    log, tail = followed(tmp_path)
    append(log, b"one\n")
    assert tail.read().lines == [b"one"]
    replacement = tmp_path / "replacement"
    replacement.write_bytes(b"two\nthree\n")
    os.replace(replacement, log)
    read = tail.read()
    assert read.lines == [b"two", b"three"] and read.reopened == {"replaced": 1}


def test_a_line_over_the_limit_is_skipped_whole(tmp_path: Path) -> None:
    log, tail = followed(tmp_path, max_read_bytes=4096, max_line_bytes=1024)
    append(log, b"short\n" + b"x" * 3000)
    read = tail.read()
    assert read.lines == [b"short"] and read.too_long == 1
    append(log, b"x" * 500 + b"\nnext\n")  # the rest of the long line, then one more
    read = tail.read()
    assert read.lines == [b"next"] and read.too_long == 0


def test_reads_are_bounded_and_resume(tmp_path: Path) -> None:
    log = tmp_path / "app-20261205_20.log"
    log.write_bytes(b"".join(b"line %04d\n" % i for i in range(1000)))  # 10,000 bytes
    tail = DirectoryTail(str(tmp_path), PATTERN, "start", max_read_bytes=4096, max_line_bytes=1024)
    got: list[bytes] = []
    sizes = []
    for _ in range(4):
        read = tail.read()
        got += read.lines
        sizes.append(read.bytes_read)
    assert sizes == [4096, 4096, 1808, 0]
    assert got == [b"line %04d" % i for i in range(1000)]


def test_a_file_that_appears_after_the_start_is_read_whole(tmp_path: Path) -> None:
    tail = DirectoryTail(str(tmp_path), PATTERN, "end")
    (tmp_path / "app-20261205_20.log").write_bytes(b"first\n")
    assert tail.read().lines == [b"first"]

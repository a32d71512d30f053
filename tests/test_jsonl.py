"""The one JSONL reader (rufus_data/base/jsonl.py): its errors name the file and the line, and every reader of
JSONL in Rufus (sources, benchmark files, eval tasks, the example shards) goes through it."""

from __future__ import annotations

import json

import pytest

from rufus_data.base.errors import RufusError
from rufus_data.base.jsonl import parse_jsonl, read_jsonl
from rufus_data.benchmarks.suite import load_suite
from rufus_data.sources.dataset_source import read_file_rows
from rufus_eval.task_data import source_rows


def write_lines(path, *lines: bytes):
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    return path


def test_rows_in_order_blank_lines_and_a_byte_order_mark(tmp_path):
    path = write_lines(tmp_path / "ok.jsonl", b'\xef\xbb\xbf{"a": 1}', b"", b"   ", '{"a": "caf\u00e9"}'.encode())
    assert list(read_jsonl(path)) == [{"a": 1}, {"a": "café"}]


@pytest.mark.parametrize(("line", "problem"), [
    (b'{"a": "caf\xe9"}', r"line 3 is not valid UTF-8 \(invalid continuation byte at byte 10\); re-encode"),
    (b'{"a": ', r"line 3 is not valid JSON \(Expecting value\); fix or remove it"),
    (b"[1, 2]", r"line 3 is a JSON list, not an object"),
    (b'"text"', r"line 3 is a JSON str, not an object"),
    (b"[" * 100_000 + b"]" * 100_000, r"line 3 nests its JSON deeper than a reader can follow; flatten"),  # issue #47
])
def test_bad_lines_name_the_file_and_the_line(tmp_path, line, problem):
    path = write_lines(tmp_path / "bad.jsonl", b'{"a": 1}', b"", line, b'{"a": 2}')
    rows = read_jsonl(path, "source 'mine'")
    assert next(rows) == {"a": 1}  # streamed: the rows before the bad line arrive first
    with pytest.raises(RufusError, match=rf"^source 'mine': {path} {problem}"):
        next(rows)


def test_missing_file_and_lines_from_elsewhere(tmp_path):
    with pytest.raises(RufusError, match=r"nope.jsonl does not exist"):
        list(read_jsonl(tmp_path / "nope.jsonl"))
    with pytest.raises(RufusError, match=r"^wheel.whl:data.json line 2 is not valid JSON"):
        list(parse_jsonl([b'{"a": 1}', b"{"], "wheel.whl:data.json"))


def test_eval_task_rows_read_through_it(tmp_path, monkeypatch):
    """An eval task's local file: the error names the task, the file and the line."""
    folder = tmp_path / "aime25"
    folder.mkdir()
    write_lines(folder / "test.jsonl", json.dumps({"problem": "p", "answer": "1"}).encode(), b"[]")
    monkeypatch.setenv("RUFUS_DATA_ROOT", str(tmp_path))
    task = {t.name: t for t in load_suite("smollm3").tasks}["aime25"]
    with pytest.raises(RufusError, match=r"^task aime25: .*aime25/test.jsonl line 2 is a JSON list, not an object"):
        source_rows(task)


def test_benchmark_files_read_through_it(tmp_path):
    path = write_lines(tmp_path / "bench.jsonl", b'{"question": "q"}', b'{"question": ')
    with pytest.raises(RufusError, match=r"^benchmark file: .*bench.jsonl line 2 is not valid JSON"):
        list(read_file_rows(path, "benchmark file"))

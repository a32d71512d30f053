"""Bad input to `rufus-data mix`: one clear paragraph, exit code 2, and no output folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rufus_data.cli import app

runner = CliRunner()


def run_mix(tmp_path: Path, catalog_text: str, *extra: str):
    catalog = tmp_path / "bad.yaml"
    catalog.write_text(catalog_text)
    out = tmp_path / "out"
    result = runner.invoke(app, ["mix", str(catalog), "--out", str(out), *extra])
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith((".out", "out"))]
    return result, " ".join(result.output.split()), leftovers


def source_file(tmp_path: Path, rows: list[dict], name: str = "rows.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def catalog(source_path: Path, extra: str = "", share: str = "1.0", fmt: str = "auto") -> str:
    return f"kind: sft\nname: bad\nsources:\n  - name: src\n    path: {source_path}\n    format: {fmt}\n    share: {share}\n{extra}"


def assert_refused(result, leftovers):
    assert result.exit_code == 2, result.output
    assert leftovers == []


def test_missing_catalog(tmp_path):
    result = runner.invoke(app, ["mix", str(tmp_path / "nope.yaml"), "--out", str(tmp_path / "out")])
    assert result.exit_code == 2 and "does not exist" in result.output
    assert not (tmp_path / "out").exists()


def test_missing_source_file(tmp_path):
    result, text, left = run_mix(tmp_path, catalog(tmp_path / "missing.jsonl"))
    assert_refused(result, left)
    assert "source 'src'" in text and "missing.jsonl does not exist" in text


def test_malformed_yaml_gives_line_and_column(tmp_path):
    result, text, left = run_mix(tmp_path, "kind: sft\nname: x\nsources: [\n  - name: a\n")
    assert_refused(result, left)
    assert "malformed YAML at line" in text and "column" in text


def test_unknown_key_named_with_line_and_suggestion(tmp_path):
    src = source_file(tmp_path, [{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}])
    result, text, left = run_mix(tmp_path, catalog(src, extra="    shaer: 0.5\n"))
    assert_refused(result, left)
    assert "unknown key 'sources.0.shaer'" in text and "bad.yaml:8" in text and "did you mean 'share'" in text


def test_unknown_top_level_key(tmp_path):
    src = source_file(tmp_path, [{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}])
    result, text, left = run_mix(tmp_path, "seeed: 3\n" + catalog(src))
    assert_refused(result, left)
    assert "unknown key 'seeed'" in text and "did you mean 'seed'" in text and "bad.yaml:1" in text


def test_shares_must_sum_to_one(tmp_path):
    src = source_file(tmp_path, [{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}])
    text_catalog = catalog(src, share="0.6") + f"  - name: other\n    path: {src}\n    share: 0.3\n"
    result, text, left = run_mix(tmp_path, text_catalog)
    assert_refused(result, left)
    assert "shares must sum to 1, they sum to 0.9" in text and "src=0.6 + other=0.3" in text


def test_undetectable_format_shows_fields(tmp_path):
    src = source_file(tmp_path, [{"foo": 1, "bar": "x"}])
    result, text, left = run_mix(tmp_path, catalog(src))
    assert_refused(result, left)
    assert "cannot detect its format from the fields ['bar', 'foo']" in text


def test_rows_missing_fields_reported_then_skippable(tmp_path, data_root):
    cat = catalog(data_root / "code_alpaca_2k/code_alpaca_2k.jsonl")
    result, text, left = run_mix(tmp_path, cat)
    assert_refused(result, left)
    assert "2 of 2017 rows" in text and "row 238" in text and "row 1860" in text and "--on-bad-row skip" in text
    result, text, _ = run_mix(tmp_path, cat, "--on-bad-row", "skip")
    assert result.exit_code == 0, result.output
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["sources"][0]["rows_dropped"]["bad_row"] == 2


@pytest.mark.parametrize("name, content, message", [
    ("empty.jsonl", b"", "is empty"),
    ("latin1.jsonl", json.dumps({"instruction": "x", "output": "y"}).encode() + b'\n{"instruction": "caf\xe9", "output": "y"}\n',
     "line 2 is not valid UTF-8"),
    ("broken.jsonl", b'{"instruction": "x", "output": "y"}\n{"instruction": \n', "line 2 is not valid JSON"),
])
def test_unreadable_source_is_refused(tmp_path, name, content, message):
    """An empty file, a line that is not UTF-8, a line that is not JSON: refused, naming the line."""
    src = tmp_path / name
    src.write_bytes(content)
    result, text, left = run_mix(tmp_path, catalog(src))
    assert_refused(result, left)
    assert message in text


def test_existing_output_needs_overwrite(tmp_path):
    src = source_file(tmp_path, [{"instruction": f"q{i}", "output": f"a{i}"} for i in range(20)])
    cat = catalog(src)
    first, _, _ = run_mix(tmp_path, cat)
    assert first.exit_code == 0, first.output
    second, text, _ = run_mix(tmp_path, cat)
    assert second.exit_code == 2 and "--overwrite" in text
    third, _, _ = run_mix(tmp_path, cat, "--overwrite")
    assert third.exit_code == 0


def test_hub_source_without_hub_access_says_what_to_do(tmp_path, monkeypatch):
    """The hub loading code is real; offline it fails with a message that points at `path:`."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    text_catalog = "kind: sft\nname: hub\nsources:\n  - name: tulu\n    hub: allenai/tulu-3-sft-mixture\n    share: 1.0\n"
    result, text, left = run_mix(tmp_path, text_catalog)
    assert_refused(result, left)
    assert "could not load hub dataset allenai/tulu-3-sft-mixture" in text and "use `path:`" in text


@pytest.mark.spawn
def test_an_unpinned_hub_revision_is_warned_once_on_one_line(tmp_path):
    """From the command line the console's warning is the only one (no second copy from Python's
    warnings with a source line), and it is not cut at 80 columns when stderr is no terminal."""
    catalog_path = tmp_path / "unpinned.yaml"
    catalog_path.write_text("kind: sft\nname: hub\nsources:\n  - name: a\n"
                            "    hub: {id: someone/some-set, split: train, revision: main}\n    share: 1.0\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "80"}
    run = subprocess.run([str(Path(sys.executable).with_name("rufus-data")), "mix", str(catalog_path), "--out",
                          str(tmp_path / "out")], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
                         check=False)
    assert run.returncode == 2
    warned = [line for line in run.stderr.splitlines() if "revision 'main' of someone/some-set" in line]
    assert len(warned) == 1 and warned[0].startswith("WARNING: source 'a'") and warned[0].endswith("/commits/main)")
    assert "UserWarning" not in run.stderr


@pytest.mark.parametrize("bad", ["0", "1.5"])
def test_share_out_of_range(tmp_path, bad):
    src = source_file(tmp_path, [{"instruction": "q", "output": "a"}])
    result, text, left = run_mix(tmp_path, catalog(src, share=bad))
    assert_refused(result, left)
    assert "sources.0.share" in text


@pytest.mark.parametrize("share", ['"0.5"', "yes"])
def test_share_must_be_a_number(tmp_path, share):
    """Numbers are explicit: a quoted share or a boolean is refused, naming the key and line."""
    src = tmp_path / "a.jsonl"
    src.write_text(json.dumps({"instruction": "hi", "output": "hello"}) + "\n")
    catalog = tmp_path / "c.yaml"
    catalog.write_text(f"kind: sft\nname: c\nsources:\n  - name: a\n    path: {src}\n    share: {share}\n")
    result = CliRunner().invoke(app, ["mix", str(catalog), "--out", str(tmp_path / "out")])
    assert result.exit_code == 2
    assert f"{catalog}:6" in result.output and "sources.0.share" in result.output
    assert not (tmp_path / "out").exists()


def test_a_corrupt_parquet_source_names_the_file(tmp_path):
    """A parquet file whose footer reads but whose data pages are damaged (the error comes while
    its rows are read): one paragraph naming the file, exit 2, no traceback and no output."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    conversations = [[{"role": "user", "content": f"question {i} " + "word " * (i % 50)},
                      {"role": "assistant", "content": f"answer {i}"}] for i in range(20_000)]
    good = tmp_path / "good.parquet"
    pq.write_table(pa.table({"messages": conversations}), good, row_group_size=2_000, compression="zstd")
    data = bytearray(good.read_bytes())
    start = pq.ParquetFile(good).metadata.row_group(5).column(0).data_page_offset
    for i in range(start + 50, start + 3_000):
        data[i] = (data[i] * 7 + 3) % 256
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(bytes(data))
    result, text, leftovers = run_mix(tmp_path, f"kind: sft\nname: c\nsources:\n  - name: broken\n    path: {bad}\n    share: 1.0\n")
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), result.output
    assert f"source 'broken': {bad} is not a readable parquet file" in text and "Traceback" not in result.output
    assert leftovers == []


@pytest.mark.parametrize("local", ["../..", "gsm8k/../../secrets.jsonl", "/etc/passwd", "~/notes.jsonl"])
def test_a_local_path_may_not_leave_the_data_root(tmp_path, local):
    """issue #47, item 15: `local:` reads under $RUFUS_DATA_ROOT only, refused with the line."""
    text = f"kind: sft\nname: bad\nsources:\n  - name: src\n    local: {local}\n    share: 1.0\n"
    result, text, left = run_mix(tmp_path, text)
    assert_refused(result, left)
    assert "bad.yaml:5" in text and "must be a path under $RUFUS_DATA_ROOT (relative, without `..`)" in text


def test_bad_lines_are_all_named_and_skip_skips_them(tmp_path):
    """issue #47, item 11: --on-bad-row skip skips lines that are no JSON object (not UTF-8, not
    JSON, too deep, a list) as it skips rows, and both modes name every kind with its count."""
    good = [json.dumps({"instruction": f"q{i}", "output": f"a{i}"}).encode() for i in range(10)]
    bad = [b'{"instruction": "caf\xe9", "output": "y"}', b'{"instruction": ', b"[" * 100_000 + b"]" * 100_000, b"[1]"]
    src = tmp_path / "rows.jsonl"
    src.write_bytes(b"\n".join(good[:3] + bad[:2] + good[3:6] + bad[2:] + good[6:]) + b"\n")
    refused, text, left = run_mix(tmp_path, catalog(src))
    assert_refused(refused, left)
    assert "4 lines of the file hold no JSON object (first: line 4 is not valid UTF-8" in text
    for named in ("line 5 is not valid JSON", "line 9 nests its JSON deeper", "line 10 is a JSON list"):
        assert named in text, text
    skipped, text, _ = run_mix(tmp_path, catalog(src), "--on-bad-row", "skip")
    assert skipped.exit_code == 0, skipped.output
    assert "4 lines of the file hold no JSON object" in text and "skipped (--on-bad-row skip)" in text
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["counts"]["rows_dropped"] == 4 and manifest["counts"]["rows_train"] == 10

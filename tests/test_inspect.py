"""`rufus-data inspect` warnings and `rufus-data sql` on shard folders."""

from __future__ import annotations

import json

import pyarrow as pa
from typer.testing import CliRunner

from rufus_data.cli import app
from rufus_data.folders.shards import write_manifest, write_shards
from rufus_data.shard_inspect import inspect_shards, run_sql


def msgs(*pairs):
    return [{"role": r, "content": c} for r, c in pairs]


def make_folder(tmp_path):
    rows = [
        # declares /no_think via the manifest but lacks it
        {"id": "a-0", "source": "a", "label": "a", "messages": msgs(("user", "hi"), ("assistant", "hello")), "num_tokens": 10},
        {"id": "a-1", "source": "a", "label": "a",
         "messages": msgs(("system", "/no_think"), ("user", "q"), ("assistant", "x")), "num_tokens": 12},
        # reasoning tag only in the first user turn of a multi-turn row
        {"id": "b-0", "source": "b", "label": "b",
         "messages": msgs(("user", "solve this /think"), ("assistant", "ok"), ("user", "and now?"), ("assistant", "done")),
         "num_tokens": 30},
        # empty assistant turn
        {"id": "b-1", "source": "b", "label": "b", "messages": msgs(("user", "q"), ("assistant", "  ")), "num_tokens": 5},
        # exact duplicates
        {"id": "b-2", "source": "b", "label": "b", "messages": msgs(("user", "dup"), ("assistant", "dup")), "num_tokens": 8},
        {"id": "b-3", "source": "b", "label": "b", "messages": msgs(("user", "dup"), ("assistant", "dup")), "num_tokens": 8},
    ]
    folder = tmp_path / "shards"
    write_shards(pa.Table.from_pylist(rows), folder)
    write_manifest(folder, {"sources": [{"name": "a", "system": "/no_think"}, {"name": "b", "system": None}]})
    return folder


def test_inspect_finds_each_data_bug(tmp_path):
    found = inspect_shards(make_folder(tmp_path))
    text = "\n".join(found.warnings)
    assert "source 'a' declares system prompt '/no_think' but 1 rows lack it (e.g. a-0)" in text
    assert "1 multi-turn rows carry a reasoning-mode tag" in text and "b-0" in text
    assert "1 rows have an empty assistant turn (e.g. b-1)" in text
    assert "1 exact duplicate rows" in text and "b-2, b-3" in text
    per = {(r["source"]): r for r in found.per_source}
    assert per["a"]["rows"] == 2 and per["b"]["tokens"] == 51
    assert sum(n for _, _, n in found.histogram) == 6


def test_inspect_checks_preference_replies(tmp_path):
    """An empty chosen or rejected reply is an empty assistant turn too."""
    rows = [{"id": f"p-{i}", "source": "p", "label": "p", "prompt": msgs(("user", f"q{i}")),
             "chosen": msgs(("assistant", chosen)), "rejected": msgs(("assistant", rejected)), "num_tokens": 9}
            for i, (chosen, rejected) in enumerate([("good", "bad"), ("", "bad"), ("good", " ")])]
    folder = tmp_path / "pref"
    write_shards(pa.Table.from_pylist(rows), folder)
    write_manifest(folder, {"sources": [{"name": "p", "system": None}]})
    assert "2 rows have an empty assistant turn (e.g. p-1, p-2)" in "\n".join(inspect_shards(folder).warnings)


def test_clean_sample_mix_has_no_warnings(tmp_path):
    from pathlib import Path

    from rufus_data.mix import mix

    repo = Path(__file__).resolve().parents[1]
    result = mix(repo / "catalogs/sft.yaml", tmp_path / "sft")
    found = inspect_shards(result.out)
    assert found.warnings == []
    assert found.loss_mask == {**found.loss_mask, "route": "markers", "chat_template": "rufus_chatml"}  # from the manifest


def test_sql_and_cli(tmp_path):
    folder = make_folder(tmp_path)
    columns, rows = run_sql(folder, "SELECT source, count(*) AS n FROM shards GROUP BY source ORDER BY source")
    assert columns == ["source", "n"] and rows == [("a", 2), ("b", 4)]
    runner = CliRunner()
    result = runner.invoke(app, ["sql", str(folder), "SELECT count(*) FROM train"])
    assert result.exit_code == 0 and "6" in result.output
    bad = runner.invoke(app, ["sql", str(folder), "SELECT nope FROM train"])
    assert bad.exit_code == 2 and "query failed" in bad.output
    result = runner.invoke(app, ["inspect", str(folder), "--json"])
    assert result.exit_code == 0
    assert len(json.loads(result.output)["warnings"]) == 4
    missing = runner.invoke(app, ["inspect", str(tmp_path / "nothing")])
    assert missing.exit_code == 2 and "does not exist" in missing.output

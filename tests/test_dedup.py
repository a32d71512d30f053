"""dedup on real rows: planted near duplicates go, their first copy stays, clusters are reported."""

from __future__ import annotations

import json
import random

import pyarrow as pa
import pytest
from conftest import read_jsonl
from decontam_planting import recased_respaced

from rufus_data.dedup import DedupConfig, deduplicate
from rufus_data.errors import RufusError
from rufus_data.shards import read_shards, write_shards


def test_near_duplicates_are_dropped_keeping_the_first(data_root, tmp_path):
    rng = random.Random(3)
    train = read_jsonl(data_root / "gsm8k" / "train.jsonl", limit=1200)
    rows = [{"id": f"g{i}", "source": "gsm8k_train", "label": "g",
             "messages": [{"role": "user", "content": r["question"]}, {"role": "assistant", "content": r["answer"]}]}
            for i, r in enumerate(train)]
    originals = rng.sample(range(len(rows)), 60)
    expected = {}
    for k, i in enumerate(originals):
        q, a = (m["content"] for m in rows[i]["messages"])
        if k % 3 == 0:
            copy = (q, a)  # exact copy
        elif k % 3 == 1:
            copy = (recased_respaced(q, rng), a)  # re-cased and re-spaced
        else:
            words = a.split(" ")
            words[len(words) // 2] = "so"
            copy = (q, " ".join(words))  # one word of the answer changed
        dup_id = f"dup{k}"
        rows.append({"id": dup_id, "source": "copies", "label": "c",
                     "messages": [{"role": "user", "content": copy[0]}, {"role": "assistant", "content": copy[1]}]})
        expected[dup_id] = f"g{i}"
    write_shards(pa.Table.from_pylist(rows), tmp_path / "mix", shard_rows=500)
    result = deduplicate(tmp_path / "mix", tmp_path / "out", config=DedupConfig(), show_progress=False)
    pairs = {p["duplicate_id"]: p["kept_id"] for p in result.clusters.to_pylist()}
    assert {d: pairs.get(d) for d in expected} == expected
    extra = {d: k for d, k in pairs.items() if d not in expected}
    print(f"{len(extra)} near duplicates within GSM8K train itself:", list(extra.items())[:10])
    assert len(extra) <= 0.01 * len(train)
    kept = read_shards(tmp_path / "out").column("id").to_pylist()
    assert len(kept) == len(rows) - len(pairs) == result.rows_out
    assert all(f"g{i}" in kept for i in originals) and not set(expected) & set(kept)
    assert kept == [r["id"] for r in rows if r["id"] not in pairs]  # order kept
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["rows_dropped"] == len(pairs)
    assert "Largest clusters" in (tmp_path / "out" / "report.md").read_text()
    assert (tmp_path / "out" / "clusters.parquet").exists()


def test_dedup_bad_input_and_cli(data_root, tmp_path):
    from typer.testing import CliRunner

    from rufus_data.cli import app

    with pytest.raises(RufusError, match="does not exist"):
        deduplicate(tmp_path / "nowhere", tmp_path / "out", show_progress=False)
    assert not (tmp_path / "out").exists()
    rows = [{"id": str(i), "source": "s", "label": "s", "messages": [{"role": "user", "content": text}]}
            for i, text in enumerate(["Write a poem about the sea and the sky.", "write a poem about the SEA and the sky",
                                      "Explain recursion to a child."])]
    write_shards(pa.Table.from_pylist(rows), tmp_path / "mix")
    res = CliRunner().invoke(app, ["dedup", str(tmp_path / "mix"), "--out", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    assert read_shards(tmp_path / "out").column("id").to_pylist() == ["0", "2"]
    res = CliRunner().invoke(app, ["dedup", str(tmp_path / "mix"), "--out", str(tmp_path / "out")])
    assert res.exit_code == 2 and "already exists" in res.output

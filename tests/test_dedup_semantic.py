"""dedup --semantic on real rows: reworded copies (GSM-Plus "problem understanding" rewrites of
GSM8K test questions, and `decontam_planting.paraphrased` rewordings) placed among distinct GSM8K
train and Code Alpaca rows are dropped with the row they restate, which stays; the distinct rows
stay; clusters.parquet and the report say which stage dropped each row. The full-size figures
are in bench/decontam_semantic_bench.py."""

from __future__ import annotations

import json
import random

import pyarrow as pa
import pyarrow.parquet as pq
from conftest import read_jsonl
from decontam_planting import paraphrased, shared_ngrams
from typer.testing import CliRunner

from rufus_data.cli import app
from rufus_data.dedup import DedupConfig, dedup
from rufus_data.folders.shards import read_shards, write_shards

PAIRS = 40


def user(rid: str, source: str, text: str, answer: str | None = None) -> dict:
    turns = [{"role": "user", "content": text}] + ([{"role": "assistant", "content": answer}] if answer else [])
    return {"id": rid, "source": source, "label": source, "messages": turns}


def test_reworded_rows_go_and_distinct_rows_stay(data_root, tmp_path):
    rng = random.Random(5)
    rows = [user(f"train{i}", "gsm8k_train", r["question"], r["answer"])
            for i, r in enumerate(read_jsonl(data_root / "gsm8k" / "train.jsonl", limit=300))]
    rows += [user(f"alpaca{i}", "code_alpaca", r["instruction"] + (f"\n{r['input']}" if r["input"] else ""), r["output"])
             for i, r in enumerate(read_jsonl(data_root / "code_alpaca_2k" / "code_alpaca_2k.jsonl", limit=300))]
    plus = [r for r in read_jsonl(data_root / "gsm_plus" / "testmini.jsonl") if r["perturbation_type"] == "problem understanding"]
    originals, copies, truth = [], [], {}
    for k, r in enumerate(plus[:PAIRS]):  # a real rewrite of each question
        originals.append(user(f"seed{k}", "original", r["seed_question"]))
        copies.append(user(f"plus{k}", "gsm_plus", r["question"]))
        truth[f"plus{k}"] = f"seed{k}"
    seeds = {r["seed_question"] for r in plus}
    tests = [r["question"] for r in read_jsonl(data_root / "gsm8k" / "test.jsonl") if r["question"] not in seeds]
    for k, question in enumerate(q for q in tests if len(q.split()) >= 25):  # planted rewordings, no 8-gram shared
        text = paraphrased(question, rng)
        if shared_ngrams(question, text) == 0:
            originals.append(user(f"test{k}", "original", question))
            copies.append(user(f"planted{k}", "planted", text))
            truth[f"planted{k}"] = f"test{k}"
        if len(copies) == 2 * PAIRS:
            break
    rows = originals + rows + copies  # the restated rows come first: they are the ones kept
    write_shards(pa.Table.from_pylist(rows), tmp_path / "mix", shard_rows=500)
    base = dedup(tmp_path / "mix", report_only=True)
    result = dedup(tmp_path / "mix", tmp_path / "out", DedupConfig(semantic=True))
    for run, name in ((base, "MinHash"), (result, "MinHash + semantic")):
        pairs = {p["duplicate_id"]: p["kept_id"] for p in run.clusters.to_pylist()}
        recall = {s: sum(pairs.get(d) == k for d, k in truth.items() if d.startswith(s)) / PAIRS for s in ("plus", "planted")}
        print(f"{name}: recall {recall}, {len(pairs)} rows dropped")
    assert not set(base.clusters.column("duplicate_id").to_pylist()) & set(truth)  # MinHash sees no rewording
    assert recall["plus"] >= 0.4 and recall["planted"] >= 0.4  # 0.64 and 0.56 at full size (bench)
    distinct = [d for d in pairs if d not in truth]
    print("distinct rows dropped:", distinct)
    assert len(distinct) <= 0.01 * 600, distinct  # distinct GSM8K train and Code Alpaca rows stay
    kept = read_shards(tmp_path / "out").column("id").to_pylist()
    assert all(k in kept for k in truth.values()) and len(kept) == len(rows) - len(pairs)
    clusters = pq.read_table(tmp_path / "out" / "clusters.parquet").to_pylist()
    found = [c for c in clusters if c["duplicate_id"] in truth]
    assert found and all(c["method"] == "semantic" and c["similarity"] >= 0.75 and c["jaccard"] is None for c in found)
    assert all(c["shared_quantities"] >= 1 or c["similarity"] >= 0.95 for c in found)
    report = (tmp_path / "out" / "report.md").read_text()
    assert "## Rows dropped, by stage" in report and "| semantic |" in report and "Examples (semantic):" in report
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["config"]["semantic"] is True and "wordllama" in manifest["versions"]


def test_a_mixs_repeats_follow_their_first_copy(data_root, tmp_path, monkeypatch):
    """A repeat of a row (same origin_id) is no duplicate of it; when the row restates an earlier
    one, its repeats go with it (through the command line, offline)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    plus = read_jsonl(data_root / "gsm_plus" / "testmini.jsonl", limit=30)[29]  # Fishio's Instagram likes, reworded
    assert plus["perturbation_type"] == "problem understanding"
    rows = [{**user("seed", "s", plus["seed_question"]), "origin_id": "seed"},
            {**user("plus", "s", plus["question"]), "origin_id": "plus"},
            {**user("plus#rep1", "s", plus["question"]), "origin_id": "plus"},
            {**user("other", "s", "Write a haiku about autumn leaves falling on a quiet pond."), "origin_id": "other"},
            {**user("other#rep1", "s", "Write a haiku about autumn leaves falling on a quiet pond."), "origin_id": "other"}]
    write_shards(pa.Table.from_pylist(rows), tmp_path / "mix")
    res = CliRunner().invoke(app, ["dedup", str(tmp_path / "mix"), "--semantic", "--out", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    clusters = pq.read_table(tmp_path / "out" / "clusters.parquet").to_pylist()
    assert {p["duplicate_id"]: (p["kept_id"], p["method"]) for p in clusters} == {
        "plus": ("seed", "semantic"), "plus#rep1": ("seed", "semantic")}
    assert read_shards(tmp_path / "out").column("id").to_pylist() == ["seed", "other", "other#rep1"]

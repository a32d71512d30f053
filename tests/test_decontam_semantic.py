"""The semantic decontam stage on a small slice of the real data: paraphrased GSM8K test items
(GSM-Plus "problem understanding" rows, and leaks planted by `decontam_planting.paraphrased`
that no 8-gram or MinHash window survives) are found with their item and evidence, clean rows
(Code Alpaca, GSM8K train) stay clean, and the optional LLM judge's verdict decides and is
recorded. The full-size figures are in bench/decontam_semantic_bench.py."""

from __future__ import annotations

import json
import random

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import read_jsonl
from decontam_planting import paraphrased, shared_ngrams
from openai_stub import Reply, Request

from rufus_data.base.errors import RufusError
from rufus_data.benchmarks import load_benchmarks
from rufus_data.decontam import DecontamConfig, decontam
from rufus_data.decontam.semantic_stage import eval_side, spans
from rufus_data.folders.shards import write_shards
from rufus_data.rewards.llm_judge import LLMJudgeReward
from rufus_data.similarity.ngram_hash import TokenHasher, tokenize_batch
from rufus_data.similarity.semantic_evidence import (
    NUMBER_WORDS,
    EvidenceModel,
    compare,
    content_words,
    item_quantities,
    may_hold_quantities,
    quantity_keys,
)
from rufus_data.similarity.textnorm import words
from rufus_data.similarity.vector_search import ClusteredSearch, ExactSearch

PLANTED = 40


def chat(source: str, user: str, assistant: str | None = None) -> dict:
    turns = [{"role": "user", "content": user}] + ([{"role": "assistant", "content": assistant}] if assistant else [])
    return {"source": source, "messages": turns}


@pytest.fixture(scope="module")
def slice_rows(data_root):
    """300 GSM8K train and 300 Code Alpaca rows (clean), 40 GSM-Plus paraphrases, 40 planted ones."""
    rng = random.Random(3)
    gsm_train = [chat("gsm8k_train", r["question"], r["answer"])
                 for r in read_jsonl(data_root / "gsm8k" / "train.jsonl", limit=300)]
    alpaca = [chat("code_alpaca", r["instruction"] + (f"\n{r['input']}" if r["input"] else ""), r["output"])
              for r in read_jsonl(data_root / "code_alpaca_2k" / "code_alpaca_2k.jsonl", limit=300)]
    test_ids = {r["question"]: str(i) for i, r in enumerate(read_jsonl(data_root / "gsm8k" / "test.jsonl"))}
    plus = [r for r in read_jsonl(data_root / "gsm_plus" / "testmini.jsonl") if r["perturbation_type"] == "problem understanding"]
    gsm_plus = [(chat("gsm_plus", r["question"]), test_ids[r["seed_question"]]) for r in plus[:PLANTED]]
    items = [it for it in load_benchmarks(["gsm8k"]).items if len(words(it.problems[0])) >= 25]
    planted = []
    for item in rng.sample(items, 2 * PLANTED):
        text = paraphrased(item.problems[0], rng)
        if shared_ngrams(item.problems[0], text) == 0 and len(planted) < PLANTED:  # the exact stage cannot see it
            planted.append((chat("planted", text), item.item_id))
    assert len(planted) == PLANTED
    rows = gsm_train + alpaca + [r for r, _ in gsm_plus] + [r for r, _ in planted]
    truth = {len(gsm_train) + len(alpaca) + i: item for i, (_, item) in enumerate(gsm_plus + planted)}
    table = pa.Table.from_pylist([{"id": f"{r['source']}-{i}", "source": r["source"], "label": r["source"],
                                   "messages": r["messages"]} for i, r in enumerate(rows)])
    return table, truth


@pytest.fixture(scope="module")
def runs(slice_rows, tmp_path_factory):
    table, _ = slice_rows
    src = tmp_path_factory.mktemp("semantic") / "mix"
    write_shards(table, src, shard_rows=400)
    base = decontam(src, None, DecontamConfig(against=["gsm8k"], workers=1), report_only=True)
    out = src.parent / "clean"
    semantic = decontam(src, out, DecontamConfig(against=["gsm8k"], workers=1, semantic=True))
    return base, semantic, out


def recall(result, truth: dict[int, str], source: str, table: pa.Table) -> float:
    found = {(h["row"], h["eval_item_id"]) for h in result.hits.to_pylist()}
    sources = table.column("source").to_pylist()
    rows = [r for r in truth if sources[r] == source]
    return sum((r, truth[r]) in found for r in rows) / len(rows)


def test_paraphrases_are_found_with_their_item(slice_rows, runs):
    table, truth = slice_rows
    base, semantic, _ = runs
    for source, floor in (("gsm_plus", 0.6), ("planted", 0.7)):
        with_stage, without = recall(semantic, truth, source, table), recall(base, truth, source, table)
        print(f"{source}: recall {without:.2f} without the semantic stage, {with_stage:.2f} with it")
        assert with_stage >= floor, source
        assert without <= 0.3, source  # the stage is what finds them
    planted_hits = [h for h in semantic.hits.to_pylist() if h["source"] == "planted" and h["method"] == "semantic"]
    assert planted_hits
    for hit in planted_hits:
        e = hit["evidence"]
        assert hit["similarity"] >= 0.7 and e["quantity_share"] >= 0.75 and e["quantities_kept"] >= 1
        assert e["word_share"] >= 0.3 and e["shared_words"] and hit["fields"] == ["messages[0].user"]
        assert hit["judge"] is None  # no judge asked


def test_clean_rows_stay_clean(slice_rows, runs):
    table, truth = slice_rows
    _, semantic, _ = runs
    sources = table.column("source").to_pylist()
    flagged = {h["row"] for h in semantic.hits.to_pylist() if h["row"] not in truth}
    by_source = {s: sum(sources[r] == s for r in flagged) for s in ("code_alpaca", "gsm8k_train")}
    print("flagged clean rows:", by_source)
    assert by_source["code_alpaca"] == 0
    assert by_source["gsm8k_train"] <= 0.02 * 300


def test_provenance_and_report(runs):
    _, _, out = runs
    hits = pq.read_table(out / "contaminated.parquet")
    assert {"similarity", "evidence", "judge"} <= set(hits.column_names)
    methods = set(hits.column("method").to_pylist())
    assert "semantic" in methods
    report = (out / "report.md").read_text()
    assert "## Rows flagged, by stage" in report and "Examples (semantic):" in report
    assert "| semantic |" in report and "quantities" in report
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["semantic"] is True and manifest["index"]["semantic_model"] == "wordllama"
    assert "wordllama" in manifest["versions"]


def test_quantities_survive_rewording():
    assert dict(item_quantities(words("Three women wear 4 inch heels for 2 hours and pay $1,000.")))
    same = quantity_keys(words("For one hundred and twenty minutes, 3 ladies wore four-inch heels; they paid 1000 dollars."))
    for _, keys in item_quantities(words("Three women wear 4 inch heels for 2 hours and pay $1,000.")):
        assert keys & same
    assert not quantity_keys(words("no numbers here")) & {"v:3"}
    model = EvidenceModel(["Martha knits 3 hats for her grandchildren.", "A bakery sells 3 cakes."])
    martha, _ = model.items(["Martha knits 3 hats for her grandchildren.", "A bakery sells 3 cakes."])
    text = words("martha is knitting three hats")
    evidence = compare(martha, quantity_keys(text), content_words(text))
    assert evidence.quantities_kept == 1 and evidence.entities_kept == 1 and "martha" in evidence.shared_words


def test_spans_without_quantities_are_known_before_reading_them(data_root):
    """may_hold_quantities (one Arrow kernel) flags every word quantity_keys reads a quantity
    from, so skipping spans without one changes no verdict."""
    texts = [r["question"] + " " + r["answer"] for r in read_jsonl(data_root / "gsm8k" / "train.jsonl", limit=200)]
    texts += [r["instruction"] + " " + r["output"] for r in read_jsonl(data_root / "code_alpaca_2k" / "code_alpaca_2k.jsonl", limit=200)]
    texts.append("one's twenty-five 3rd half café $ dozen eggs, a quarter hour; Twice the ONE")
    hasher = TokenHasher()
    tokens, ids, _ = tokenize_batch(texts, hasher)
    flags = may_hold_quantities(tokens, ids, hasher(sorted(NUMBER_WORDS)))
    words_seen = tokens.to_pylist()
    with_quantity = {w for w in set(words_seen) if quantity_keys([w])}
    assert with_quantity and all(flags[i] for i, w in enumerate(words_seen) if w in with_quantity)
    assert not flags[[i for i, w in enumerate(words_seen) if w in ("eggs", "the", "function")]].any()
    assert flags.mean() < 0.5  # most words are plain words: the check is worth its kernel


def test_eval_side_is_cached_by_texts_and_code(tmp_path, monkeypatch):
    """The second decontam command reads the eval items' vectors and evidence from $RUFUS_CACHE
    instead of computing them; other texts are another entry, and an unreadable one is replaced."""
    monkeypatch.setenv("RUFUS_CACHE", str(tmp_path))
    texts = [it.problems[0] for it in load_benchmarks(["gsm8k"]).items[:50]]
    vectors, evidence = eval_side(texts, "wordllama")
    [stored] = (tmp_path / "decontam").glob("semantic-*.pkl")
    monkeypatch.setattr(EvidenceModel, "items", lambda *a: pytest.fail("computed again instead of read"))
    again_vectors, again_evidence = eval_side(texts, "wordllama")
    assert np.array_equal(again_vectors, vectors) and again_evidence == evidence
    monkeypatch.undo()
    monkeypatch.setenv("RUFUS_CACHE", str(tmp_path))
    eval_side(texts[:49], "wordllama")
    assert len(list((tmp_path / "decontam").glob("semantic-*.pkl"))) == 2
    stored.write_bytes(b"truncated")
    assert np.array_equal(eval_side(texts, "wordllama")[0], vectors) and stored.stat().st_size > 100


def test_windows_cover_long_fields():
    offsets = np.array([0, 50, 50, 350, 355])
    field, start, stop = spans(offsets, 128, min_words=8)
    assert field.tolist() == [0, 2, 2, 2, 2] and (stop - start).max() == 128  # the 5-word field has no span
    assert start[1] == 50 and stop[-1] == 350 and all(np.diff(start[1:]) <= 64)


def test_clustered_search_finds_what_exact_search_finds():
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(60, 32))
    vectors = centres[rng.integers(0, 60, 3000)] + 0.3 * rng.normal(size=(3000, 32))
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    queries = vectors[:200] + 0.05 * rng.normal(size=(200, 32))
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    exact = ExactSearch(vectors).search(queries.astype(np.float32), 5, -1.0)
    clustered = ClusteredSearch(vectors).search(queries.astype(np.float32), 5, -1.0)
    top_exact = {(q, v) for q, v in zip(exact[0].tolist(), exact[1].tolist())}
    top_clustered = {(q, v) for q, v in zip(clustered[0].tolist(), clustered[1].tolist())}
    assert len(top_exact & top_clustered) >= 0.9 * len(top_exact)


class VerdictServer:
    """An OpenAI-compatible judge on 127.0.0.1 (tests/openai_stub.py): "Score: 9" when the
    benchmark item's text has an even length, "Score: 2" when odd, and HTTP 500 for items with a "$"."""

    def __init__(self, openai_stub):
        self.asked: list[str] = []
        self.url = openai_stub(self.verdict, models=["judge"]).v1_url

    def verdict(self, request: Request) -> Reply:
        item = request.text.split("[Benchmark item]\n", 1)[1].split("\n\n[Training text", 1)[0]
        self.asked.append(item)
        if "$" in item:
            return Reply(status=500, error="down")
        score = 9 if len(item) % 2 == 0 else 2
        return Reply(f"Looks alike.\nScore: {score}")


def test_judge_verdict_decides_and_is_recorded(slice_rows, tmp_path, openai_stub):
    table, _ = slice_rows
    rows = table.filter(pa.array([s in ("gsm_plus", "planted") for s in table.column("source").to_pylist()]))
    write_shards(rows, tmp_path / "mix")
    server = VerdictServer(openai_stub)
    config = DecontamConfig(workers=1, semantic=True, judge_url=server.url, judge_model="judge")
    result = decontam(tmp_path / "mix", tmp_path / "out", config.model_copy(update={"against": ["gsm8k"]}))
    items = {it.item_id: "\n".join(it.problems) for it in load_benchmarks(["gsm8k"]).items}
    attempts = LLMJudgeReward().retries + 1  # a failing request is retried
    pairs = result.judge["yes"] + result.judge["no"] + result.judge["failed"]
    # every pair asked once, a failing one up to `attempts` times (an attempt lost in transport on a
    # loaded machine never reaches the stub, so the upper bound is not exact)
    assert pairs + result.judge["failed"] <= len(server.asked) <= pairs + (attempts - 1) * result.judge["failed"]
    semantic = [h for h in result.hits.to_pylist() if h["method"] == "semantic"]
    assert semantic
    for hit in semantic:
        text = items[hit["eval_item_id"]]
        expected = "failed" if "$" in text else "yes" if len(text) % 2 == 0 else "no"
        assert hit["judge"] == expected == ("failed" if "$" in text else "yes")
    # a "no" removes a pair the rule passed: it is recorded nowhere as a hit
    assert result.judge["no"] > 0 and result.judge["failed"] > 0
    report = (tmp_path / "out" / "report.md").read_text()
    assert "LLM judge judge at" in report and "judge yes" in report


def test_judge_needs_the_semantic_stage(tmp_path):
    with pytest.raises(RufusError, match="--semantic"):
        decontam(tmp_path, None, DecontamConfig(against=["gsm8k"], judge_url="http://127.0.0.1:9/v1"), report_only=True)


def test_cli_semantic_flag(data_root, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from rufus_data.cli import app

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    question = read_jsonl(data_root / "gsm_plus" / "testmini.jsonl", limit=22)[21]  # Martha knits for three grandchildren
    assert question["perturbation_type"] == "problem understanding"
    rows = [{"id": "leak", "source": "s", "label": "s", "messages": [{"role": "user", "content": question["question"]}]},
            {"id": "ok", "source": "s", "label": "s", "messages": [{"role": "user", "content": "Write a haiku."}]}]
    write_shards(pa.Table.from_pylist(rows), tmp_path / "mix")
    flagged = {}
    for flags in ([], ["--semantic"]):
        res = CliRunner().invoke(app, ["decontam", str(tmp_path / "mix"), "--against", "gsm8k", *flags,
                                       "--report-only", "--workers", "1"])
        assert res.exit_code == 0, res.output
        flagged[bool(flags)] = " ".join(res.output.split())
    assert "0 of 2 rows flagged" in flagged[False] and "1 of 2 rows flagged" in flagged[True]

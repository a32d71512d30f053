"""decontam on the real files of the data root: planted leaks are found with the right benchmark
and item id, clean data stays clean, output is atomic and complete."""

from __future__ import annotations

import json
import random
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from conftest import read_jsonl
from decontam_planting import KINDS, no_ngram_survives, shared_ngrams

from rufus_data.base.errors import RufusError
from rufus_data.benchmarks import load_benchmarks, load_registry
from rufus_data.benchmarks.against import resolve_against
from rufus_data.decontam import DecontamConfig, decontam
from rufus_data.folders.shards import read_shards, write_shards
from rufus_data.similarity.minhash_lsh import BatchMinHasher, signatures
from rufus_data.similarity.textnorm import words

PER_BENCHMARK = 24  # eval items planted per benchmark and kind


def sft_rows(data_root: Path) -> tuple[list[dict], list[dict]]:
    gsm = [{"source": "gsm8k_train", "messages": [{"role": "user", "content": r["question"]},
                                                  {"role": "assistant", "content": r["answer"]}]}
           for r in read_jsonl(data_root / "gsm8k" / "train.jsonl", limit=1500)]
    alpaca = [{"source": "code_alpaca", "messages": [
        {"role": "user", "content": r["instruction"] + (f"\n{r['input']}" if r["input"] else "")},
        {"role": "assistant", "content": r["output"]}]}
        for r in read_jsonl(data_root / "code_alpaca_2k" / "code_alpaca_2k.jsonl")]
    return gsm, alpaca


def to_table(rows: list[dict]) -> pa.Table:
    return pa.Table.from_pylist([{"id": f"{r['source']}-{i}", "source": r["source"], "label": r["source"],
                                  "messages": r["messages"], "solution": r.get("solution")} for i, r in enumerate(rows)])


COPIES = ("verbatim", "recased_respaced", "embedded")  # the text of the item survives: 100% recall


@pytest.fixture(scope="module")
def planted(data_root, tmp_path_factory):
    """GSM8K train + Code Alpaca rows with GSM8K test and MATH-500 problems planted five ways,
    plus a subset rewritten so that no 8-gram survives; decontam run once over all of it.
    Copies use any item, and every MATH-500 problem shorter than 8 words (one whole-text gram)."""
    rng = random.Random(7)
    gsm, alpaca = sft_rows(data_root)
    items = load_benchmarks(["gsm8k", "math500"]).items
    rows = [dict(r) for r in gsm + alpaca]
    rng.shuffle(rows)
    truth = []  # (row index, kind, benchmark, item id)
    short_ids = set()  # (benchmark, item id) of the planted items shorter than n words
    for bench in ("gsm8k", "math500"):
        pool = rng.sample([it for it in items if it.benchmark == bench], sum(it.benchmark == bench for it in items))
        short = [it for it in pool if len(words(it.problems[0])) < 8]
        rest = [it for it in pool if it not in short]
        short_ids |= {(bench, it.item_id) for it in short}
        plans = []
        for k, kind in enumerate(COPIES):
            copied = short[k :: len(COPIES)] + rest[k * PER_BENCHMARK : (k + 1) * PER_BENCHMARK]
            plans += [(kind, item, KINDS[kind](item.problems[0], rng)) for item in copied]
        # one-line problems ("Compute $\\dbinom{8}{4}$.") with a number changed are a different
        # problem, so the edited kinds use problems of at least 15 words, as a paraphraser would need
        edit = [it for it in rest[len(COPIES) * PER_BENCHMARK :] if len(words(it.problems[0])) >= 15]
        for k, kind in enumerate(k for k in KINDS if k not in COPIES):
            plans += [(kind, item, KINDS[kind](item.problems[0], rng)) for item in edit[k * PER_BENCHMARK : (k + 1) * PER_BENCHMARK]]
        rewritten = ((item, no_ngram_survives(item.problems[0], rng)) for item in edit[2 * PER_BENCHMARK :])
        # the subset that keeps no 8-gram of its eval item (checked with the shared normalisation)
        plans += [("no_8gram", item, text) for item, text in rewritten if shared_ngrams(item.problems[0], text) == 0][:PER_BENCHMARK]
        for kind, item, text in plans:
            target = rng.randrange(len(rows))
            while target in {t[0] for t in truth}:
                target = rng.randrange(len(rows))
            row = rows[target]
            user = row["messages"][0]["content"]
            content = f"{user}\n\n{text}" if kind == "embedded" else text
            row["messages"] = [{"role": "user", "content": content}, row["messages"][1]]
            truth.append((target, kind, bench, item.item_id))
    src = tmp_path_factory.mktemp("planted") / "mix"
    write_shards(to_table(rows), src, shard_rows=1500)
    out = src.parent / "clean"
    result = decontam(src, out, DecontamConfig(against=["gsm8k", "math500"], workers=2))
    return result, truth, rows, src, out, short_ids


def test_planted_leaks_are_found_with_their_item(planted):
    result, truth, rows, _, _, short_ids = planted
    hits = result.hits.to_pylist()
    by_row: dict[int, list[dict]] = {}
    for hit in hits:
        by_row.setdefault(hit["row"], []).append(hit)
    recall, methods = Counter(), Counter()
    for row, kind, bench, item_id in truth:
        match = [h for h in by_row.get(row, []) if h["benchmark"] == bench and h["eval_item_id"] == item_id]
        if match:
            recall[kind] += 1
            methods[(kind, match[0]["method"])] += 1
    total = Counter(kind for _, kind, _, _ in truth)
    print({k: f"{recall[k]}/{total[k]}" for k in total}, dict(methods))
    for kind in COPIES:
        assert recall[kind] == total[kind], kind
    short = [(row, bench, item_id) for row, _, bench, item_id in truth if (bench, item_id) in short_ids]
    assert len(short) >= 25  # MATH-500's 27 problems under 8 words, copied three ways
    assert all(any(h["benchmark"] == b and h["eval_item_id"] == i and h["method"] == "exact" for h in by_row.get(r, []))
               for r, b, i in short)
    for kind in ("number_changed", "sentence_reworded"):
        assert recall[kind] >= 0.9 * total[kind], kind
    # no 8-gram of these survives: whatever is found must come from the MinHash stage
    assert methods[("no_8gram", "minhash")] == recall["no_8gram"] >= 0.8 * total["no_8gram"]
    planted_rows = {t[0] for t in truth}
    extra = [h for h in hits if h["row"] not in planted_rows]
    print(f"{len(extra)} hits on rows nothing was planted in (GSM8K train and test share near-duplicates):")
    for h in extra[:10]:
        print("  ", h["row_id"], h["benchmark"], h["eval_item_id"], h["method"], h["containment"], h["matched_ngrams"][:2])
    assert len({h["row"] for h in extra}) <= 0.02 * len(rows)


def test_output_folder_is_complete(planted):
    result, _, rows, src, out, _ = planted
    clean = read_shards(out)
    source = read_shards(src)
    assert clean.schema == source.schema
    assert clean.num_rows == len(rows) - len(result.flagged_rows) == result.rows_out
    dropped_ids = set(source.column("id").to_pylist()) - set(clean.column("id").to_pylist())
    assert dropped_ids == {rows_id for rows_id in pq.read_table(out / "contaminated.parquet").column("row_id").to_pylist()}
    hits = pq.read_table(out / "contaminated.parquet")
    assert {"row_id", "source", "benchmark", "eval_item_id", "method", "matched_ngrams", "containment"} <= set(hits.column_names)
    assert set(hits.column("method").to_pylist()) == {"exact", "minhash"}
    exact = [h for h in hits.to_pylist() if h["method"] == "exact"]
    assert all(h["matched_ngrams"] and 0 < h["containment"] <= 1 for h in exact)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["rows_dropped"] == len(result.flagged_rows)
    assert manifest["benchmarks"]["gsm8k"]["fingerprint"].startswith("sha256:")
    report = (out / "report.md").read_text()
    assert "| source | gsm8k | math500 |" in report and "| code_alpaca |" in report


@pytest.mark.parametrize(("training", "benchmark"), [("code_alpaca", "gsm8k"), ("mbpp", "humaneval")])
def test_clean_data_is_left_alone(data_root, tmp_path, training, benchmark):
    if training == "code_alpaca":
        rows = sft_rows(data_root)[1]
    else:
        rows = [{"source": "mbpp", "messages": [{"role": "user", "content": r["prompt"]},
                                                {"role": "assistant", "content": r["code"]}]}
                for r in read_jsonl(data_root / "mbpp_sanitized" / "sanitized-mbpp.jsonl")]
    write_shards(to_table(rows), tmp_path / "mix")
    result = decontam(tmp_path / "mix", None, DecontamConfig(against=[benchmark], workers=1), report_only=True)
    print(f"{training} vs {benchmark}: {len(result.flagged_rows)} of {len(rows)} rows flagged")
    for hit in result.hits.to_pylist():
        print("  ", hit["row_id"], hit["eval_item_id"], hit["method"], hit["containment"], hit["matched_ngrams"][:3])
    assert len(result.flagged_rows) <= 0.005 * len(rows)


def test_every_text_field_is_checked(data_root, tmp_path):
    """system turn, assistant turn, an RL prompt, a passthrough `solution` column, a preference pair."""
    gsm = read_jsonl(data_root / "gsm8k" / "test.jsonl", limit=5)
    filler = "Tell me a story about a dragon who learns to bake bread in a small village."
    rows = [
        {"id": "sys", "source": "s", "label": "s", "solution": None,
         "messages": [{"role": "system", "content": gsm[0]["question"]}, {"role": "user", "content": filler}]},
        {"id": "asst", "source": "s", "label": "s", "messages": [{"role": "user", "content": filler},
                                                               {"role": "assistant", "content": gsm[1]["question"]}]},
        {"id": "sol", "source": "s", "label": "s", "messages": [{"role": "user", "content": filler}],
         "solution": gsm[2]["answer"]},
        {"id": "clean", "source": "s", "label": "s", "messages": [{"role": "user", "content": filler}]},
    ]
    write_shards(pa.Table.from_pylist(rows), tmp_path / "sft")
    rl = [{"id": "rl", "source": "r", "label": "r", "prompt": [{"role": "user", "content": gsm[3]["question"]}],
           "expected_output": "18"}]
    write_shards(pa.Table.from_pylist(rl), tmp_path / "rl")
    pref = [{"id": "pref", "source": "p", "label": "p", "prompt": [{"role": "user", "content": filler}],
             "chosen": [{"role": "assistant", "content": gsm[4]["question"]}],
             "rejected": [{"role": "assistant", "content": "no"}]}]
    write_shards(pa.Table.from_pylist(pref), tmp_path / "pref")
    cfg = DecontamConfig(workers=1)
    found = {}
    for name in ("sft", "rl", "pref"):
        hits = decontam(tmp_path / name, None, cfg.model_copy(update={"against": ["gsm8k"]}), report_only=True).hits.to_pylist()
        found.update({h["row_id"]: (h["eval_item_id"], h["fields"]) for h in hits})
    assert found["sys"] == ("0", ["messages[0].system"])
    assert found["asst"] == ("1", ["messages[1].assistant"])
    assert found["sol"] == ("2", ["solution"])  # a leaked worked solution counts: it is long
    assert found["rl"] == ("3", ["prompt[0].user"])
    assert found["pref"] == ("4", ["chosen[0].assistant"])
    assert "clean" not in found


def test_short_answers_only_count_with_their_problem(data_root, tmp_path):
    aime = read_jsonl(data_root / "aime24" / "test.jsonl", limit=2)
    rows = [
        {"id": "answer-only", "source": "s", "label": "s",
         "messages": [{"role": "user", "content": f"What is 20 + 5? The answer is {aime[0]['answer']}."}]},
        {"id": "both", "source": "s", "label": "s",
         "messages": [{"role": "user", "content": aime[1]["problem"]},
                      {"role": "assistant", "content": f"The answer is {aime[1]['answer']}."}]},
    ]
    write_shards(pa.Table.from_pylist(rows), tmp_path / "mix")
    hits = decontam(tmp_path / "mix", None, DecontamConfig(against=["aime24"], workers=1), report_only=True).hits.to_pylist()
    assert [(h["row_id"], h["eval_item_id"], h["answer_hit"]) for h in hits] == [("both", str(aime[1]["id"]), True)]


def test_batch_signatures_equal_datasketch_bulk():
    rng = np.random.default_rng(0)
    sets = [np.unique(rng.integers(0, 2**32, size=int(rng.integers(1, 300)), dtype=np.uint64).astype(np.uint32))
            for _ in range(200)]
    starts = np.cumsum([0] + [len(s) for s in sets[:-1]])
    batch = BatchMinHasher(64, 1).segments(np.concatenate(sets), starts, chunk=512)
    reference = signatures(sets, 64, 1)
    assert all(np.array_equal(batch[i], m.hashvalues) for i, m in enumerate(reference))


def test_eval_index_is_kept_in_the_cache_by_items_and_settings(data_root, tmp_path, monkeypatch):
    """A new decontam command reads the exact and MinHash indexes from $RUFUS_CACHE instead of
    building them; other eval items or n-gram settings are another entry (settings of the run or
    of the semantic stage are not), and a truncated entry is built again."""
    from rufus_data.decontam import index as eval_index

    def arrays(index) -> list[np.ndarray]:
        return [index.exact.postings.keys, index.exact.postings.items, index.exact.item_grams,
                index.minhash.lsh.keys, index.minhash.lsh.owners, index.minhash.shingles, index.minhash.bounds]

    monkeypatch.setenv("RUFUS_CACHE", str(tmp_path))
    monkeypatch.setattr(eval_index, "_CACHE", {})  # nothing in this process's memory: a new command
    loaded = load_benchmarks(["gsm8k"])
    built = eval_index.cached_eval_index(loaded, DecontamConfig())
    [stored] = (tmp_path / "decontam").glob("ngrams-*.pkl")
    size = stored.stat().st_size
    leak = to_table([{"source": "leak", "messages": [{"role": "user", "content": loaded.items[5].problems[0]}]}])
    write_shards(leak, tmp_path / "mix")
    with monkeypatch.context() as m:
        m.setattr(eval_index, "_CACHE", {})
        m.setattr(eval_index, "build_exact_index", lambda *a: pytest.fail("built again instead of read"))
        read = eval_index.build_eval_index(loaded.items, DecontamConfig(workers=3, semantic_min_cosine=0.9), cache=True)
        assert all(np.array_equal(a, b) for a, b in zip(arrays(read), arrays(built), strict=True))
        result = decontam(tmp_path / "mix", None, {"against": ["gsm8k"]}, report_only=True)
        assert result.hits.column("eval_item_id").to_pylist() == [loaded.items[5].item_id]
    for items, config in ((loaded.items[:-1], DecontamConfig()), (loaded.items, DecontamConfig(ngram=7)),
                          (loaded.items, DecontamConfig(shingle=3))):
        eval_index.build_eval_index(items, config, cache=True)
    assert len(list((tmp_path / "decontam").glob("ngrams-*.pkl"))) == 4
    stored.write_bytes(stored.read_bytes()[: size // 2])
    rebuilt = eval_index.build_eval_index(loaded.items, DecontamConfig(), cache=True)
    assert all(np.array_equal(a, b) for a, b in zip(arrays(rebuilt), arrays(built), strict=True))
    assert stored.stat().st_size == size


def test_normalisation_is_shared_and_keeps_numbers_and_latex():
    assert words("Natalia  SOLD clips,\nto 48 friends.") == ["natalia", "sold", "clips", "to", "48", "friends"]
    assert words("It costs $1,000.50 (or 3.5%)!") == ["it", "costs", "$1,000.50", "or", "3.5%"]
    assert words("Find $\\frac{1}{2}+x^2$.") == ["find", "$\\frac{1}{2}+x^2$"]
    assert words("“Quoted” — text’s end…") == ["quoted", "text", "s", "end"]
    assert words("") == []


# Hub revisions that are not commit shas: none could be looked up offline. Loading one of these
# from the hub prints a warning; pin a commit and remove it from this list.
UNPINNED = {
    "aime25", "ifeval", "mbpp", "gsm_plus", "gpqa_diamond", "mixeval_hard", "global_mmlu", "mmlu_pro",  # `main`
    "livecodebench",  # `main`: the files of the v4_v5 window (the repo's version tags are loader-script configs)
}


def test_registry_sets_and_missing_benchmarks(tmp_path, monkeypatch, data_root):
    registry, _ = load_registry()
    assert {"gsm8k", "math500", "aime24", "aime25", "ifeval", "humaneval", "mbpp", "gpqa_diamond",
            "livecodebench"} <= set(registry.benchmarks)
    for name, spec in registry.benchmarks.items():
        if spec.hub is None:  # a wheel (BFCL) or haystacks (RULER): no hub revision to pin
            continue
        pinned = re.fullmatch(r"[0-9a-f]{40}", spec.hub.revision) if spec.hub else None
        assert bool(pinned) == (name not in UNPINNED), f"{name}: revision {spec.hub and spec.hub.revision}"
    # `--against quick` and `--against smollm3` resolve the eval suites' own task lists (no set mirrors them)
    assert not {"smollm3", "quick"} & set(registry.sets)
    assert set(resolve_against(registry, ["quick"]).benchmarks) == {"gsm8k", "math500", "ifeval", "humaneval"}
    for suite in ("quick", "smollm3"):
        suite_file = Path(__file__).resolve().parents[1] / "catalogs" / "suites" / f"{suite}.yaml"
        tasks = [t.get("benchmark") or t["name"] for t in yaml.safe_load(suite_file.read_text())["tasks"]]
        resolved = resolve_against(registry, [suite])
        assert resolved.benchmarks == [t for t in tasks if not registry.benchmarks[t].not_decontaminable], suite
        assert resolved.not_checked == {f"{suite}/{t}": registry.benchmarks[t].not_decontaminable
                                        for t in tasks if registry.benchmarks[t].not_decontaminable}, suite
        assert resolved.suites == [suite]
    smollm3 = resolve_against(registry, ["smollm3"])
    assert {"bfcl_simple_python", "bfcl_multiple"} <= set(smollm3.benchmarks) and set(smollm3.not_checked) == {"smollm3/ruler"}
    assert resolve_against(registry, ["all"]).benchmarks == list(registry.benchmarks)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(RufusError, match=r"gpqa_diamond.*(path:|--skip-missing)"):
        load_benchmarks(["gpqa_diamond"])
    loaded = load_benchmarks(["smollm3"], skip_missing=True)
    assert set(loaded.missing) == {"gpqa_diamond", "livecodebench", "mixeval_hard", "global_mmlu"}  # hub-only here
    assert {i.benchmark for i in loaded.items} == {"aime25", "ifeval", "gsm_plus", "bfcl_simple_python", "bfcl_multiple"}
    assert next(i for i in loaded.items if i.benchmark == "aime25").item_id == "aime_2025_I/1"
    # a local file of one's own through --benchmarks
    gpqa = tmp_path / "gpqa.jsonl"
    gpqa.write_text(json.dumps({"Record ID": "rec1", "Question": "Which gas is most abundant in air?",
                                "Correct Answer": "Nitrogen", "Incorrect Answer 1": "Oxygen",
                                "Incorrect Answer 2": "Argon", "Incorrect Answer 3": "Helium"}) + "\n")
    text = (Path(__file__).resolve().parents[1] / "catalogs" / "benchmarks.yaml").read_text()
    mine = tmp_path / "benchmarks.yaml"
    mine.write_text(text.replace("local: gpqa/gpqa_diamond.jsonl", f"path: {gpqa}"))
    assert [i.item_id for i in load_benchmarks(["gpqa_diamond"], mine).items] == ["rec1"]
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace("problem_fields: [question]", "problem_field: [question]", 1))
    with pytest.raises(RufusError, match=r"problem_field.*did you mean `problem_fields`"):
        load_registry(bad)
    with pytest.raises(RufusError, match=r"unknown benchmark or set `gsm8`.*did you mean `gsm8k`"):
        load_benchmarks(["gsm8"])


def test_skip_missing_is_reported_and_bad_input_leaves_nothing(data_root, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    rows = [{"id": "a", "source": "s", "label": "s", "messages": [{"role": "user", "content": "hello there"}]}]
    write_shards(pa.Table.from_pylist(rows), tmp_path / "mix")
    result = decontam(tmp_path / "mix", tmp_path / "out", DecontamConfig(against=["ifeval", "livecodebench"], skip_missing=True, workers=1))
    assert "livecodebench" in (tmp_path / "out" / "report.md").read_text()
    assert result.rows_out == 1
    with pytest.raises(RufusError, match="livecodebench"):
        decontam(tmp_path / "mix", tmp_path / "out2", {"against": ["livecodebench"]})
    broken = tmp_path / "broken" / "data"
    broken.mkdir(parents=True)
    (broken / "train-00000-of-00001.parquet").write_bytes(b"not parquet")
    with pytest.raises(RufusError, match="not a readable parquet shard"):
        decontam(tmp_path / "broken", tmp_path / "out3", {"against": ["ifeval"]})
    with pytest.raises(RufusError, match="does not exist"):
        decontam(tmp_path / "nowhere", tmp_path / "out4", {"against": ["ifeval"]})
    assert not (tmp_path / "out2").exists() and not (tmp_path / "out3").exists() and not (tmp_path / "out4").exists()
    assert not list(tmp_path.glob(".out*"))


def test_cli_decontam_and_errors(data_root, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from rufus_data.cli import app

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    gsm = read_jsonl(data_root / "gsm8k" / "test.jsonl", limit=1)
    rows = [{"id": "leak", "source": "s", "label": "s", "messages": [{"role": "user", "content": gsm[0]["question"]}]},
            {"id": "ok", "source": "s", "label": "s", "messages": [{"role": "user", "content": "Write a haiku."}]}]
    write_shards(pa.Table.from_pylist(rows), tmp_path / "mix")
    runner = CliRunner()
    res = runner.invoke(app, ["decontam", str(tmp_path / "mix"), "--against", "quick", "--out", str(tmp_path / "out"),
                              "--workers", "1"])
    assert res.exit_code == 0, res.output
    assert read_shards(tmp_path / "out").column("id").to_pylist() == ["ok"]
    res = runner.invoke(app, ["decontam", str(tmp_path / "mix"), "--against", "gpqa_diamond", "--out", str(tmp_path / "o2")])
    assert res.exit_code == 2 and "gpqa_diamond" in res.output and not (tmp_path / "o2").exists()

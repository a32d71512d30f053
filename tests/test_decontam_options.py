"""decontam and dedup beyond the planted-recall test: suites as benchmark sets, every split of a
mix, dry runs, the boilerplate rules, perturbation families, config files, the answer rules,
registry checks and branch revisions. All on the real files of the data root."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from conftest import read_jsonl
from decontam_planting import no_ngram_survives, shared_ngrams
from typer.testing import CliRunner

from rufus_data.base.errors import RufusError
from rufus_data.benchmarks import load_benchmarks, load_registry
from rufus_data.benchmarks.against import resolve_against
from rufus_data.benchmarks.bfcl import bfcl_rows
from rufus_data.cli import app
from rufus_data.decontam import DecontamConfig, decontam
from rufus_data.dedup import dedup
from rufus_data.folders.shards import read_shards, write_shards
from rufus_data.rewards.bfcl import BFCL_WHEEL
from rufus_data.similarity.textnorm import words

REGISTRY = Path(__file__).resolve().parents[1] / "catalogs" / "benchmarks.yaml"
ONE = DecontamConfig(workers=1)


def rows_of(texts: dict[str, str], source: str = "s") -> pa.Table:
    return pa.Table.from_pylist([{"id": i, "source": source, "label": source,
                                  "messages": [{"role": "user", "content": t}]} for i, t in texts.items()])


def fillers(data_root: Path, n: int, start: int = 0) -> list[str]:
    """Code Alpaca instructions: real text with nothing of the math benchmarks in it."""
    return [r["instruction"] for r in read_jsonl(data_root / "code_alpaca_2k" / "code_alpaca_2k.jsonl")][start : start + n]


def test_against_suite_maps_tasks_and_reports_the_rest(data_root, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    gsm = read_jsonl(data_root / "gsm8k" / "test.jsonl", limit=1)[0]
    aime = read_jsonl(data_root / "aime25" / "test.jsonl", limit=1)[0]
    plus = read_jsonl(data_root / "gsm_plus" / "testmini.jsonl", limit=40)[-1]
    write_shards(rows_of({"gsm": gsm["question"], "aime": aime["problem"], "plus": plus["question"],
                          "ok": fillers(data_root, 1)[0]}), tmp_path / "mix")
    runner = CliRunner()
    res = runner.invoke(app, ["decontam", str(tmp_path / "mix"), "--against-suite", "smollm3", "--against", "gsm8k",
                              "--skip-missing", "--out", str(tmp_path / "out"), "--workers", "1"])
    assert res.exit_code == 0, res.output
    assert read_shards(tmp_path / "out").column("id").to_pylist() == ["ok"]
    hits = pq.read_table(tmp_path / "out" / "contaminated.parquet").to_pylist()
    by_row = {(h["row_id"], h["benchmark"]) for h in hits}
    assert {("gsm", "gsm8k"), ("aime", "aime25"), ("plus", "gsm_plus")} <= by_row
    # tasks with nothing to check are named in the output and the report, never dropped silently
    report = (tmp_path / "out" / "report.md").read_text()
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert "smollm3/ruler" in res.output and "smollm3/ruler" in report and "smollm3/ruler" in manifest["not_decontaminable"]
    assert {"bfcl_simple_python", "bfcl_multiple"} <= set(manifest["benchmarks"])  # BFCL is checked (from its wheel)
    # every other task names a registry benchmark; here only the hub holds these (offline: skipped, listed)
    assert manifest["against_suites"] == ["smollm3"] and set(manifest["skipped_benchmarks"]) == {
        "gpqa_diamond", "livecodebench", "mixeval_hard", "global_mmlu"}
    # a suite task the registry does not know is an error naming it; so is an unknown suite
    suite = tmp_path / "mine.yaml"
    suite.write_text(yaml.safe_dump({"name": "mine", "tasks": [
        {"name": "gsm8k", "kind": "lm_eval", "role": "test", "lm_eval_task": "gsm8k", "metric_key": "exact_match"},
        {"name": "mystery", "kind": "lm_eval", "role": "test", "lm_eval_task": "x", "metric_key": "acc"}]}))
    res = runner.invoke(app, ["decontam", str(tmp_path / "mix"), "--against-suite", str(suite), "--out", str(tmp_path / "o2")])
    assert res.exit_code == 2 and "`mystery`" in res.output and "not_decontaminable" in res.output
    res = runner.invoke(app, ["decontam", str(tmp_path / "mix"), "--against-suite", "nosuch", "--out", str(tmp_path / "o3")])
    assert res.exit_code == 2 and "nosuch" in res.output
    assert not (tmp_path / "o2").exists() and not (tmp_path / "o3").exists()


def test_against_smollm3_checks_bfcl_from_its_wheel(data_root, tmp_path, monkeypatch):
    """BFCL's questions come from the bfcl-eval wheel (offline: the Rufus cache), the rows eval scores:
    `--against smollm3` flags a training row that asks one."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    simple = bfcl_rows(BFCL_WHEEL, "simple_python")[3]
    multiple = bfcl_rows(BFCL_WHEEL, "multiple")[7]
    write_shards(rows_of({"simple": f"Use the tools you have. {simple['question']}", "multiple": multiple["question"],
                          "ok": fillers(data_root, 1)[0]}), tmp_path / "mix")
    res = CliRunner().invoke(app, ["decontam", str(tmp_path / "mix"), "--against", "smollm3", "--skip-missing",
                                   "--out", str(tmp_path / "out"), "--workers", "1"])
    assert res.exit_code == 0, res.output
    assert read_shards(tmp_path / "out").column("id").to_pylist() == ["ok"]
    hits = {(h["row_id"], h["benchmark"], h["eval_item_id"])
            for h in pq.read_table(tmp_path / "out" / "contaminated.parquet").to_pylist()}
    assert {("simple", "bfcl_simple_python", simple["id"]), ("multiple", "bfcl_multiple", multiple["id"])} <= hits
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    wheel = manifest["benchmarks"]["bfcl_simple_python"]
    assert wheel["origin"] == "wheel" and wheel["rows"] == 400 and wheel["sha256"]
    assert not any("bfcl" in name for name in manifest["not_decontaminable"])
    assert manifest["against"] == ["smollm3"] and manifest["against_suites"] == ["smollm3"]  # the suite, resolved
    assert manifest["not_decontaminable"] == {"smollm3/ruler": load_registry()[0].benchmarks["ruler"].not_decontaminable}


def test_against_resolves_suites_and_refuses_a_set_that_shadows_one(tmp_path):
    """A registry copy that still lists a suite's benchmarks as a set is refused with what to do; a
    suite task whose data is inline in the suite is listed as not checked."""
    text = REGISTRY.read_text()
    old = tmp_path / "old.yaml"
    old.write_text(text.replace("sets:\n", "sets:\n  smollm3: [aime25, ifeval]\n", 1))
    registry, path = load_registry(old)
    with pytest.raises(RufusError, match=r"`smollm3` is both a set of .*old.yaml and the eval suite .*remove the set"):
        resolve_against(registry, ["smollm3"], registry_path=path)
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace("sets:\n", "sets:\n  all: [aime25]\n", 1))
    with pytest.raises(RufusError, match=r"set `all` has the name of every benchmark"):
        load_registry(bad)
    rows = tmp_path / "mine.jsonl"
    rows.write_text(json.dumps({"q": "What is 2 + 2?", "a": "4"}) + "\n")
    suite = tmp_path / "mine.yaml"
    suite.write_text(yaml.safe_dump({"name": "mine", "repeats": 1, "tasks": [
        {"name": "gsm8k", "kind": "rufus", "role": "validation", "benchmark": "gsm8k", "prompt": "{question}",
         "gold_fields": ["answer"], "scorer": "string_match:last_number"},
        {"name": "own", "kind": "rufus", "role": "validation", "data": {"path": str(rows)}, "prompt": "{q}",
         "gold_fields": ["a"], "scorer": "string_match:last_number"}]}))
    resolved = resolve_against(load_registry()[0], [str(suite)], ["quick"])
    assert resolved.benchmarks == ["gsm8k", "math500", "ifeval", "humaneval"] and resolved.suites == [str(suite), "quick"]
    assert list(resolved.not_checked) == ["mine/own"] and "inline" in resolved.not_checked["mine/own"]
    with pytest.raises(RufusError, match=r"unknown benchmark or set `smolm3`.*did you mean `smollm3`.*suites: checkpoint_eval, quick, smollm3"):
        resolve_against(load_registry()[0], ["smolm3"])


def test_every_split_of_a_mix_is_scanned_and_written(data_root, tmp_path):
    """A folder written by `mix` with a holdout: leaked rows go from train and holdout alike."""
    from rufus_data.mix import mix

    leaky = tmp_path / "leaky.jsonl"
    leaky.write_text("".join(json.dumps({"question": r["question"], "answer": r["answer"]}) + "\n"
                             for r in read_jsonl(data_root / "gsm8k" / "test.jsonl", limit=12)))
    clean = tmp_path / "clean.jsonl"
    clean.write_text("".join(json.dumps({"question": q, "answer": "Here is how."}) + "\n" for q in fillers(data_root, 30)))
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(yaml.safe_dump({"kind": "sft", "name": "leak", "seed": 3, "holdout": 4, "sources": [
        {"name": "leaky", "path": str(leaky), "format": "question_answer", "share": 0.3},
        {"name": "clean", "path": str(clean), "format": "question_answer", "share": 0.7}]}))
    mixed = mix(catalog, tmp_path / "mix").out
    held_in = read_shards(mixed, "holdout")
    assert "leaky" in held_in.column("source").to_pylist()
    result = decontam(mixed, tmp_path / "out", ONE.model_copy(update={"against": ["gsm8k"]}))
    names = sorted(p.name for p in (tmp_path / "out" / "data").glob("*.parquet"))
    assert names == sorted(p.name for p in (mixed / "data").glob("*.parquet"))
    assert any(n.startswith("holdout-") for n in names)
    for split in ("train", "holdout"):
        before, after = read_shards(mixed, split), read_shards(tmp_path / "out", split)
        assert "leaky" not in after.column("source").to_pylist(), split
        kept = [i for i, s in zip(before.column("id").to_pylist(), before.column("source").to_pylist()) if s != "leaky"]
        assert after.column("id").to_pylist() == kept, split
    hits = pq.read_table(tmp_path / "out" / "contaminated.parquet")
    assert set(hits.column("split").to_pylist()) == {"train", "holdout"}
    assert result.splits["holdout"] == {"rows": held_in.num_rows,
                                        "flagged": held_in.column("source").to_pylist().count("leaky")}
    assert "## Rows flagged, by split" in (tmp_path / "out" / "report.md").read_text()
    # dedup writes every split too
    dedup(mixed, tmp_path / "dedup")
    assert read_shards(tmp_path / "dedup", "holdout").num_rows == held_in.num_rows


def test_report_only_writes_nothing_and_prints_the_summary(data_root, tmp_path, monkeypatch):
    """--report-only (what --dry-run did before it meant the plan) runs every stage, prints the
    summary and writes nothing."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    gsm = read_jsonl(data_root / "gsm8k" / "test.jsonl", limit=1)[0]
    texts = {"leak": gsm["question"], "ok": "Write a haiku about autumn.", "ok2": "write a haiku about AUTUMN"}
    write_shards(rows_of(texts), tmp_path / "mix")
    runner = CliRunner()
    res = runner.invoke(app, ["decontam", str(tmp_path / "mix"), "--against", "gsm8k", "--report-only",
                              "--out", str(tmp_path / "x"), "--workers", "1"])
    assert res.exit_code == 0, res.output
    printed = " ".join(res.output.split())
    assert "decontam: 1 of 3 rows flagged" in printed and "report only: nothing written" in printed
    assert not (tmp_path / "x").exists() and not list(tmp_path.glob(".x*"))
    res = runner.invoke(app, ["decontam", str(tmp_path / "mix"), "--against", "gsm8k", "--out", str(tmp_path / "x"),
                              "--workers", "1"])
    assert res.exit_code == 0, res.output
    printed = " ".join(res.output.split())  # the page of hits is named where it was written
    assert f"see {tmp_path / 'x' / 'report.md'} and {tmp_path / 'x' / 'hits.html'}" in printed
    assert (tmp_path / "x" / "hits.html").is_file()
    res = runner.invoke(app, ["dedup", str(tmp_path / "mix"), "--report-only", "--out", str(tmp_path / "y")])
    assert res.exit_code == 0, res.output
    printed = " ".join(res.output.split())
    assert re.search(r"3 │ 2 │ 1 │ 1 │", printed), printed  # rows in, rows out, dropped, clusters
    assert "report only: nothing written" in printed
    assert not (tmp_path / "y").exists() and not list(tmp_path.glob(".y*"))


def test_training_side_boilerplate_is_ignored_but_a_leak_among_it_is_not(data_root, tmp_path):
    """120 rows open with the first 20 words of a GSM8K test item (a shared template, long enough
    to count as a leak on its own: min_matched_words is 16): those 13 n-grams match in more than
    max(min_rows_boilerplate, max_row_fraction x rows) rows, so they are ignored; the one row that
    holds the whole item is still flagged."""
    test = read_jsonl(data_root / "gsm8k" / "test.jsonl", limit=200)
    index, item = next((i, r) for i, r in enumerate(test) if len(words(r["question"])) >= 70)
    prefix = " ".join(item["question"].split(" ")[:20])
    texts = {f"tmpl{i}": f"{prefix} {f}" for i, f in enumerate(fillers(data_root, 120))}
    texts |= {f"plain{i}": f for i, f in enumerate(fillers(data_root, 100, start=200))}
    texts["leak"] = f"{fillers(data_root, 1, start=400)[0]}\n\n{item['question']}"
    write_shards(rows_of(texts), tmp_path / "mix")
    result = decontam(tmp_path / "mix", None, ONE.model_copy(update={"against": ["gsm8k"]}), report_only=True)
    flagged = {(h["row_id"], h["eval_item_id"], h["method"]) for h in result.hits.to_pylist()}
    assert flagged == {("leak", str(index), "exact")}
    assert len(result.boilerplate_train_grams) == len(words(prefix)) - 7
    assert all(g in " ".join(words(prefix)) for g in result.boilerplate_train_grams)
    # with the floor above the 121 matching rows, the template counts: every templated row is flagged
    loose = decontam(tmp_path / "mix", None, DecontamConfig(against=["gsm8k"], workers=1, min_rows_boilerplate=200), report_only=True)
    assert len(loose.flagged_rows) == 121


def write_benchmark(folder: Path, rows: list[dict], group_field: str | None = None) -> Path:
    (folder / "items.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec = {"path": str(folder / "items.jsonl"), "id_field": "id", "problem_fields": ["question"]}
    if group_field:
        spec["group_field"] = group_field
    registry = folder / "registry.yaml"
    registry.write_text(yaml.safe_dump({"benchmarks": {"mine": spec}}))
    return registry


@pytest.mark.parametrize(("sharing", "grouped", "flagged"), [(4, False, True), (6, False, False), (6, True, True)])
def test_eval_side_boilerplate_counts_item_families(data_root, tmp_path, sharing, grouped, flagged):
    """A sentence shared by more than max_items_per_gram (4) eval items is boilerplate, unless the
    items are one family (group_field: perturbations of one seed question)."""
    shared = ("Please answer the following question carefully, show every step of your work and give the final "
              "answer on its own line.")  # 20 words: more than one shared phrase (min_matched_words)
    questions = [r["question"] for r in read_jsonl(data_root / "gsm8k" / "test.jsonl", limit=sharing)]
    registry = write_benchmark(tmp_path, [{"id": f"q{i}", "seed": "one", "question": f"{shared} {q}"}
                                          for i, q in enumerate(questions)], "seed" if grouped else None)
    write_shards(rows_of({"row": f"{shared} Then tell me a joke about penguins."}), tmp_path / "mix")
    result = decontam(tmp_path / "mix", None, ONE.model_copy(update={"against": ["mine"], "benchmarks": registry}), report_only=True)
    assert bool(result.flagged_rows) == flagged
    assert (result.index_stats["boilerplate_eval_grams"] > 0) == (not flagged)
    if flagged:
        assert {h["eval_item_id"] for h in result.hits.to_pylist()} == {f"q{i}" for i in range(sharing)}


def test_gsm_plus_perturbations_are_not_boilerplate(data_root, tmp_path):
    """GSM-Plus holds 8 perturbations per seed question; counted as one family, their shared
    n-grams stay in the index, and a perturbation planted verbatim matches all of its n-grams."""
    plus = read_jsonl(data_root / "gsm_plus" / "testmini.jsonl")
    family = [(i, r) for i, r in enumerate(plus) if r["seed_question"] == plus[80]["seed_question"]]
    assert len(family) == 8
    texts = {f"plant{i}": f"{f}\n\n{r['question']}" for (i, r), f in zip(family, fillers(data_root, 8))}
    write_shards(rows_of(texts), tmp_path / "mix")
    result = decontam(tmp_path / "mix", None, ONE.model_copy(update={"against": ["gsm_plus"]}), report_only=True)
    assert result.index_stats["boilerplate_eval_grams"] < 50  # ungrouped, ~7.9k real n-grams were dropped
    own = {h["row_id"]: h for h in result.hits.to_pylist() if h["row_id"] == f"plant{h['eval_item_id']}"}
    assert set(own) == set(texts)
    assert all(h["method"] == "exact" and h["containment"] == 1.0 for h in own.values())


def test_config_files_are_validated(data_root, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    write_shards(rows_of({"a": "Write a poem about the sea.", "b": "Explain recursion to a child."}), tmp_path / "mix")
    runner = CliRunner()
    good = tmp_path / "decontam.yaml"
    good.write_text("ngram: 13\ncontainment: 0.7\nworkers: 1\nmax_items_per_gram: 9\n")
    res = runner.invoke(app, ["decontam", str(tmp_path / "mix"), "--against", "gsm8k", "--config", str(good),
                              "--ngram", "10", "--out", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    config = json.loads((tmp_path / "out" / "manifest.json").read_text())["config"]
    assert (config["ngram"], config["containment"], config["max_items_per_gram"]) == (10, 0.7, 9)  # the option wins
    bad = tmp_path / "bad.yaml"
    bad.write_text("ngram: 8\nmax_item_per_gram: 3\n")
    res = runner.invoke(app, ["decontam", str(tmp_path / "mix"), "--against", "gsm8k", "--config", str(bad),
                              "--out", str(tmp_path / "o2")])
    assert res.exit_code == 2 and "max_item_per_gram" in res.output and "max_items_per_gram" in res.output
    assert not (tmp_path / "o2").exists()
    dedup_cfg = tmp_path / "dedup.yaml"
    dedup_cfg.write_text("threshold: 0.9\nshingle: 2\n")
    res = runner.invoke(app, ["dedup", str(tmp_path / "mix"), "--config", str(dedup_cfg), "--out", str(tmp_path / "d")])
    assert res.exit_code == 0, res.output
    config = json.loads((tmp_path / "d" / "manifest.json").read_text())["config"]
    assert (config["threshold"], config["shingle"]) == (0.9, 2)
    dedup_cfg.write_text("treshold: 0.9\n")
    res = runner.invoke(app, ["dedup", str(tmp_path / "mix"), "--config", str(dedup_cfg), "--out", str(tmp_path / "d2")])
    assert res.exit_code == 2 and "treshold" in res.output and not (tmp_path / "d2").exists()


def test_answer_rules(data_root, tmp_path):
    """A short answer counts with its problem found by MinHash too; a long solution alone counts
    only when at least answer_min_share of its n-grams are quoted."""
    rng = random.Random(5)
    aime = read_jsonl(data_root / "aime24" / "test.jsonl")
    item = next(r for r in aime if len(words(r["problem"])) >= 60)
    rewritten = no_ngram_survives(item["problem"], rng)
    assert shared_ngrams(item["problem"], rewritten) == 0
    math = read_jsonl(data_root / "math500" / "test.jsonl")
    long_item = next(r for r in math if len(words(r["solution"])) >= 150 and not shared_ngrams(r["problem"], r["solution"]))
    solution = long_item["solution"].split(" ")
    texts = {"reworded": f"{rewritten}\n\nThe answer is {item['answer']}.",
             "quarter": " ".join(solution[: len(solution) // 4]),
             "most": " ".join(solution[: len(solution) * 4 // 5])}
    write_shards(rows_of(texts), tmp_path / "mix")
    hits = decontam(tmp_path / "mix", None, ONE.model_copy(update={"against": ["aime24", "math500"]}), report_only=True).hits.to_pylist()
    found = {h["row_id"]: h for h in hits}
    assert found["reworded"]["method"] == "minhash" and found["reworded"]["eval_item_id"] == str(item["id"])
    assert found["reworded"]["answer_hit"]
    assert "quarter" not in found  # a quarter of a worked solution is shared phrasing, not a leak
    assert found["most"]["eval_item_id"] == long_item["unique_id"] and found["most"]["answer_hit"]
    assert found["most"]["method"] == "exact" and found["most"]["containment"] >= 0.5


def test_registry_validates_every_field_and_mbpp_split(data_root, tmp_path):
    text = REGISTRY.read_text()
    for old, new, message in [
        ("answer_fields: [answer]\n  math500", "answer_fields: [answr]\n  math500", r"gsm8k.*answer_field 'answr'"),
        ("id_field: unique_id", "id_field: unique_idd", r"math500.*id_field 'unique_idd'"),
        ("group_field: seed_question", "group_field: seed_questio", r"gsm_plus.*group_field 'seed_questio'"),
    ]:
        bad = tmp_path / "bad.yaml"
        bad.write_text(text.replace(old, new))
        name = message.split(".")[0]
        with pytest.raises(RufusError, match=message):
            load_benchmarks([name], bad)
    mbpp = load_benchmarks(["mbpp"])
    assert mbpp.sources["mbpp"]["rows"] == len(mbpp.items) == 257  # the test split of the 427 sanitized rows
    assert all(11 <= int(i.item_id) <= 510 for i in mbpp.items)


def test_a_branch_revision_warns_when_the_hub_is_tried(tmp_path, monkeypatch):
    import datasets

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)  # no network: fail fast, after the warning
    registry = tmp_path / "registry.yaml"
    registry.write_text(yaml.safe_dump({"benchmarks": {"ifeval": {
        "hub": {"id": "google/IFEval", "split": "train", "revision": "main"}, "problem_fields": ["prompt"]}}}))
    with (pytest.warns(UserWarning, match=r"ifeval.*'main'.*branch or tag, not a commit"),
          pytest.raises(RufusError, match="ifeval.*could not be loaded")):
        load_benchmarks(["ifeval"], registry)


def test_bad_option_values_are_clean_errors(tmp_path):
    """An out-of-range option is exit 2 with the option's name, not a traceback."""
    result = CliRunner().invoke(app, ["decontam", str(tmp_path), "--against", "gsm8k", "--ngram", "0", "--report-only"])
    assert result.exit_code == 2 and "--ngram: Input should be greater than or equal to 1" in result.output
    result = CliRunner().invoke(app, ["dedup", str(tmp_path), "--threshold", "1.5", "--report-only"])
    assert result.exit_code == 2 and "--threshold" in result.output

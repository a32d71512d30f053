"""decontam on leaks and non-leaks as real data has them (issue 44): one shared phrase is not a
leak, digits alone are no evidence, a short item's common words inside a longer different problem
are not a leak, and a short item with its numbers changed is found by a second look of its own
kind. Real rows of the data root throughout."""

from __future__ import annotations

import random

import pyarrow as pa
from conftest import read_jsonl
from decontam_planting import no_ngram_survives, number_changed

from rufus_data.decontam import DecontamConfig, decontam
from rufus_data.folders.shards import write_shards

ONE = DecontamConfig(workers=1)


def rows_of(texts: dict[str, str]) -> pa.Table:
    return pa.Table.from_pylist([{"id": i, "source": "s", "label": "s", "messages": [{"role": "user", "content": t}]}
                                 for i, t in texts.items()])


def hits(tmp_path, texts: dict[str, str], config: DecontamConfig, name: str = "mix") -> set[tuple[str, str, str]]:
    write_shards(rows_of(texts), tmp_path / name)
    result = decontam(tmp_path / name, None, config, report_only=True)
    return {(h["row_id"], h["eval_item_id"], h["method"]) for h in result.hits.to_pylist()}


def test_one_shared_phrase_is_not_a_leak(data_root, tmp_path):
    """Every AIME 2024/2025 problem that ends in "m and n are relatively prime positive integers.
    Find m+n" shares that 10-word phrase (3 overlapping 8-grams) with a MATH-500 item: not a leak;
    the item itself, planted, is."""
    aime = [r["problem"] for name in ("aime24", "aime25") for r in read_jsonl(data_root / name / "test.jsonl")]
    phrase = [p for p in aime if "relatively prime positive integers" in p]
    assert len(phrase) >= 8
    item = next(r for r in read_jsonl(data_root / "math500" / "test.jsonl")
                if r["unique_id"] == "test/counting_and_probability/1003.json")
    texts = {f"aime{i}": p for i, p in enumerate(phrase)} | {"leak": f"Solve this one.\n\n{item['problem']}"}
    found = hits(tmp_path, texts, ONE.model_copy(update={"against": ["math500"]}))
    assert found == {("leak", "test/counting_and_probability/1003.json", "exact")}
    # counted as overlapping 8-grams (3 of them), as before, the phrase flags every such problem
    assert len(hits(tmp_path, texts, ONE.model_copy(update={"against": ["math500"], "min_matched_words": 10}), "again")) > 8


def test_digits_alone_are_no_evidence(data_root, tmp_path):
    """HumanEval/107's docstring lists "1, 2, 3, 4, 5, 6, 7, 8, 9, 11": a row listing those numbers
    shares its 8-grams, which are digits only and count for nothing even where one 8-gram would do;
    an 8-gram of the same docstring with words counts."""
    loose = ONE.model_copy(update={"against": ["humaneval"], "min_matched_words": 8})
    texts = {"digits": "The palindromes below twelve: 1, 2, 3, 4, 5, 6, 7, 8, 9, 11, and nothing else.",
             "words": "Count the integer palindromes that fall within the range(1, n), inclusive, please."}
    assert hits(tmp_path, texts, loose) == {("words", "HumanEval/107", "exact")}


def test_a_short_item_inside_a_longer_different_problem_is_not_a_leak(data_root, tmp_path):
    """Two GSM8K train problems hold half the shingles of a shorter GSM8K test problem (ages: "twice
    as old", "years ago", "how old will ... be in 3 years") in a longer problem of their own: not a
    leak, where the item is too little of the field; the same items reworded so that no 8-gram
    survives, as rows of their own, are found."""
    train = read_jsonl(data_root / "gsm8k" / "train.jsonl")
    test = read_jsonl(data_root / "gsm8k" / "test.jsonl")
    others = {f"train{i}": train[i]["question"] for i in (4970, 5432)}
    assert others["train4970"].startswith("5 years ago") and "fastest dogs" in others["train5432"]
    rng = random.Random(1)
    texts = others | {f"reworded{i}": no_ngram_survives(test[i]["question"], rng) for i in (595, 536)}
    found = hits(tmp_path, texts, ONE.model_copy(update={"against": ["gsm8k"]}))
    assert found == {("reworded595", "595", "minhash"), ("reworded536", "536", "minhash")}
    # with no floor on the field's share, the stage took the train problems for leaks
    loose = ONE.model_copy(update={"against": ["gsm8k"], "min_field_share": 0.0})
    assert {row for row, _, _ in hits(tmp_path, texts, loose, "again")} == set(texts)


def test_short_items_with_other_numbers_are_their_own_kind(data_root, tmp_path):
    """MATH-500 items of a few words with one number changed keep too few n-grams and shingles for
    the first two stages; their digits masked, they are found as method `numbers`, and only when
    `short_numbers` is on. The unchanged items are exact hits; longer rows holding a short item's
    masked words inside other text are found too."""
    math = {r["unique_id"]: r["problem"] for r in read_jsonl(data_root / "math500" / "test.jsonl")}
    short = ["test/prealgebra/1995.json", "test/algebra/2735.json", "test/prealgebra/1238.json", "test/number_theory/410.json"]
    rng = random.Random(2)
    texts = {f"changed{k}": number_changed(math[i], rng) for k, i in enumerate(short)}
    assert all(texts[f"changed{k}"] != math[i] for k, i in enumerate(short))
    texts |= {"inside": f"Here is my homework. {number_changed(math[short[3]], rng)} Thanks a lot!", "same": math[short[0]]}
    config = ONE.model_copy(update={"against": ["math500"]})
    expected = {(f"changed{k}", i, "numbers") for k, i in enumerate(short)}
    expected |= {("inside", short[3], "numbers"), ("same", short[0], "exact")}
    assert hits(tmp_path, texts, config) == expected
    assert hits(tmp_path, texts, config.model_copy(update={"short_numbers": False}), "off") == {("same", short[0], "exact")}

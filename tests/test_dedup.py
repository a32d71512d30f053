"""dedup on real rows: planted near duplicates go, their first copy stays, clusters are reported."""

from __future__ import annotations

import json
import random
import re

import pyarrow as pa
import pytest
from conftest import read_jsonl
from decontam_planting import recased_respaced

from rufus_data.base.errors import RufusError
from rufus_data.dedup import DedupConfig, dedup
from rufus_data.folders.shards import read_shards, write_shards


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
    result = dedup(tmp_path / "mix", tmp_path / "out", DedupConfig())
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
        dedup(tmp_path / "nowhere", tmp_path / "out")
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


def test_a_mixs_repeats_stay_and_moved_token_shares_are_reported(data_root, tmp_path):
    """After mix: an upsampled source's repeats (same origin_id) are no duplicates of each other,
    and a source that loses its near duplicates loses token share: reported before/after, warned."""
    questions = [r["question"] for r in read_jsonl(data_root / "gsm8k" / "train.jsonl", limit=40)]

    def row(rid, origin, source, text, tokens):
        return {"id": rid, "origin_id": origin, "source": source, "label": source, "num_tokens": tokens,
                "messages": [{"role": "user", "content": text}, {"role": "assistant", "content": "ok"}]}

    rows = []
    for i, q in enumerate(questions[:10]):  # upsampled x3 by the mix: each row and two repeats
        rows += [row(f"up{i}" if r == 0 else f"up{i}#rep{r}", f"up{i}", "upsampled", q, 10) for r in range(3)]
    for i, q in enumerate(questions[10:40]):  # 30 rows, 10 of them copies of another of its rows
        text = questions[10 + i % 20] if i >= 20 else q
        rows.append(row(f"dup{i}", f"dup{i}", "copies", text, 10))
    random.Random(0).shuffle(rows)  # mix shuffles: a repeat may come before its first copy
    write_shards(pa.Table.from_pylist(rows), tmp_path / "mix")
    result = dedup(tmp_path / "mix", tmp_path / "out")
    kept = set(read_shards(tmp_path / "out").column("id").to_pylist())
    assert {r["id"] for r in rows if r["source"] == "upsampled"} <= kept  # all 30: repeats left alone
    assert len(result.dropped) == 10
    assert all(len(kept & {f"dup{i}", f"dup{i + 20}"}) == 1 for i in range(10))  # one of each planted pair
    shares = {s["source"]: s for s in json.loads((tmp_path / "out" / "manifest.json").read_text())["shares"]}
    assert shares["upsampled"]["before"] == pytest.approx(0.5) and shares["upsampled"]["after"] == pytest.approx(0.6)
    assert shares["copies"]["shift_pp"] == pytest.approx(-10.0)
    assert any("'copies' from 50.0% to 40.0%" in w and "Dedup belongs before mixing" in w for w in result.warnings)
    report = (tmp_path / "out" / "report.md").read_text()
    assert "| copies | 0.5000 | 0.4000 | -10.00 |" in report and "Dedup belongs before mixing" in report


SHARED_PROMPT = ("You are a careful and patient tutor for a school. Read the request twice, think step by step, show every "
                 "intermediate step of a computation, give the final answer on its own line, never invent facts, and keep "
                 "a neutral tone that a student understands without any jargon at all.")


def test_copies_under_a_new_framing_go_and_rows_sharing_a_template_stay(data_root, tmp_path):
    """Containment of a row's own content: a copy under a preamble, a suffix, a system prompt or an
    ID goes; the same template with other numbers, the same setup asking another question (another
    answer), and short tasks sharing a long system prompt stay. clusters.parquet names the measure."""
    train = read_jsonl(data_root / "gsm8k" / "train.jsonl", limit=60)
    alpaca = [r for r in read_jsonl(data_root / "code_alpaca_2k" / "code_alpaca_2k.jsonl", limit=200) if len(r["output"].split()) < 30]

    def row(rid, user, answer, system=None):
        turns = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": user}, {"role": "assistant", "content": answer}]
        return {"id": rid, "source": "s", "label": "s", "messages": turns}

    rows, copies = [], {}
    for i, r in enumerate(train[:40]):
        q, a = r["question"], r["answer"]
        rows.append(row(f"g{i}", q, a))
        bumped = re.sub(r"\d+", lambda m: str(int(m.group()) + 3), q), re.sub(r"\d+", lambda m: str(int(m.group()) + 3), a)
        rows.append(row(f"numbers{i}", *bumped))  # same wording, other numbers: another problem
        setup = q.rsplit(".", 1)[0]
        rows.append(row(f"other_question{i}", f"{setup}. How many did they start with?", "They started with 7.\n#### 7"))
        framing = [f"tabby azure quill maple drift ember\n{q}", f"{q}\nplease answer this one carefully today", f"[ID {1000 + i}] {q}"]
        rows.append(row(f"copy{i}", framing[i % 3], a))
        rows.append(row(f"system{i}", q, a, system="Answer as a friendly math teacher would."))
        copies.update({f"copy{i}": f"g{i}", f"system{i}": f"g{i}"})
    rows += [row(f"tool{k}", r["instruction"], r["output"], SHARED_PROMPT) for k, r in enumerate(alpaca[:30])]
    write_shards(pa.Table.from_pylist(rows), tmp_path / "mix")
    result = dedup(tmp_path / "mix", None, DedupConfig(scaffold_min_rows=20), report_only=True)
    found = {c["duplicate_id"]: c for c in result.clusters.to_pylist()}
    assert {d: c["kept_id"] for d, c in found.items() if d in copies} == copies
    assert not [d for d in found if not d.startswith(("copy", "system"))]  # nothing else goes
    assert {c["measure"] for c in found.values()} == {"containment"} and all(c["value"] >= 0.8 for c in found.values())


GREEK = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa", "lambda", "mu", "nu", "xi",
         "omicron", "pi", "rho", "sigma", "tau"]


def test_numbered_copies_go_and_numbered_templates_stay(data_root, tmp_path):
    """Scraped and synthetic sets number their rows: every copy of a GSM8K problem under a number of
    its own ("[id 4521]", "Problem 12:", "7.", "(kappa alpha mu #17)" with words drawn for the row, a
    counter in a system prompt), with no unnumbered original, is one problem: all but one go. The
    same wording with other numbers and the same setup asking another question, numbered the same
    ways, stay. (A counter among words that every copy shares, "(alpha kappa mu #17)" each time,
    reads as content: docs/decontam.md.)"""
    train = read_jsonl(data_root / "gsm8k" / "train.jsonl", limit=80)
    rng = random.Random(5)

    def numbered(rid: str, question: str, answer: str) -> dict:
        n, kind = rng.randrange(1, 10_000), rng.randrange(5)
        system = f"You are a helpful assistant. This is conversation {n} of the tutoring log." if kind == 4 else None
        user = [f"[id {n}] {question}", f"Problem {n}: {question}", f"{n % 500 + 1}. {question}",
                f"({' '.join(rng.sample(GREEK, 3))} #{n}) {question}", question][kind]
        turns = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": user}, {"role": "assistant", "content": answer}]
        return {"id": rid, "source": "s", "label": "s", "messages": turns}

    rows, group = [], {}
    for i, r in enumerate(train[:60]):
        q, a = r["question"], r["answer"]
        bumped = re.sub(r"\d+", lambda m: str(int(m.group()) + 3), q), re.sub(r"\d+", lambda m: str(int(m.group()) + 3), a)
        setup = q.rsplit(".", 1)[0]
        for rid, text in [*((f"copy{i}_{c}", (q, a)) for c in range(3)), (f"numbers{i}", bumped),
                          (f"other_question{i}", (f"{setup}. How many did they start with?", "They started with 7.\n#### 7"))]:
            rows.append(numbered(rid, *text))
            group[rid] = f"g{i}" if rid.startswith("copy") else rid
    rng.shuffle(rows)
    write_shards(pa.Table.from_pylist(rows), tmp_path / "mix")
    result = dedup(tmp_path / "mix", None, DedupConfig(), report_only=True)
    dropped = {c["duplicate_id"]: c["kept_id"] for c in result.clusters.to_pylist()}
    assert all(group[d] == group[k] for d, k in dropped.items())  # no distinct problem goes
    kept_copies = {group[r["id"]] for r in rows if r["id"].startswith("copy") and r["id"] not in dropped}
    assert len(dropped) == 120 and len(kept_copies) == 60  # one copy of each problem stays

"""The final rules that turn candidates into hits; they need the whole corpus, so they run in the
parent once every batch is scanned. Boilerplate never counts: an n-gram matched in many
training rows is a phrase of the corpus, not a leak; a few shared n-grams of a long problem or
of a worked solution are a phrase too."""

from __future__ import annotations

from collections import defaultdict

import pyarrow as pa

from rufus_data.decontam.candidates import Candidate
from rufus_data.decontam.index import EvalIndex

EVIDENCE_TYPE = pa.struct([
    ("quantities_kept", pa.int64()), ("quantities_total", pa.int64()), ("quantity_share", pa.float64()),
    ("word_share", pa.float64()),
    ("entities_kept", pa.int64()), ("entities_total", pa.int64()), ("shared_words", pa.list_(pa.string())),
])
HIT_SCHEMA = pa.schema([
    ("row_id", pa.string()), ("row", pa.int64()), ("source", pa.string()), ("benchmark", pa.string()),
    ("eval_item_id", pa.string()), ("method", pa.string()), ("fields", pa.list_(pa.string())),
    ("matched_ngrams", pa.list_(pa.string())), ("n_matched", pa.int64()), ("containment", pa.float64()),
    ("answer_hit", pa.bool_()),
    # the semantic stage's view of the pair (null where it did not run or found nothing)
    ("similarity", pa.float64()), ("evidence", EVIDENCE_TYPE), ("judge", pa.string()),
])


def matched_words(places) -> int:
    """How many words of the item the matched grams cover, each word once: overlapping grams of one
    shared phrase count as the phrase's words, not as so many grams."""
    covered: set[int] = set()
    for place, length in places:
        covered.update(range(place, place + length))
    return len(covered)


def problem_evidence(c: Candidate, problem: dict, index: EvalIndex) -> bool:
    """Whether the item's problem grams matched in the row are a leak and not a shared phrase: they
    cover `min_matched_words` of its words (all of a shorter item's)."""
    need = min(index.config.min_matched_words, max(1, int(index.exact.item_words[c.item])))
    return matched_words(c.problem_places[g] for g in problem) >= need


def may_count(c: Candidate, index: EvalIndex) -> bool:
    """Whether a candidate can pass `finalise` (which only ever removes grams): the rest need
    not travel back from the worker."""
    cfg, exact = index.config, index.exact
    if c.containment >= cfg.containment:
        return True
    if c.problem_grams and problem_evidence(c, c.problem_grams, index):
        return True
    if c.evidence is not None or c.numbers_hit:  # the semantic stage keeps only pairs that passed, or that a judge will read
        return True
    answers = int(exact.answer_grams[c.item])
    return len(c.answer_grams) >= min(max(cfg.min_matched_grams, cfg.answer_min_share * answers), max(1, answers))


def semantic_verdict(c: Candidate) -> bool:
    """The judge's verdict where it gave one, else the evidence rule's."""
    return c.judge == "yes" if c.judge in ("yes", "no") else c.semantic_passed


def finalise(cands: list[Candidate], index: EvalIndex, rows_in: int) -> tuple[pa.Table, list[str]]:
    """Apply the rules that need the whole corpus: training-side boilerplate and the answer rule.
    Returns the hits (HIT_SCHEMA) and the n-grams ignored as training-side boilerplate."""
    cfg, exact = index.config, index.exact
    rows_per_gram: dict[int, set[int]] = defaultdict(set)
    gram_text: dict[int, str] = {}
    for c in cands:
        for g, text in (*c.problem_grams.items(), *c.answer_grams.items()):
            rows_per_gram[g].add(c.row)
            gram_text[g] = text
    limit = max(cfg.min_rows_boilerplate, int(cfg.max_row_fraction * rows_in))
    boiler = {g for g, rows in rows_per_gram.items() if len(rows) > limit}
    out = []
    for c in sorted(cands, key=lambda c: (c.row, c.item)):
        item = index.items[c.item]
        item_grams, answer_grams = int(exact.item_grams[c.item]), int(exact.answer_grams[c.item])
        problem = {g: t for g, t in c.problem_grams.items() if g not in boiler}
        answer = {g: t for g, t in c.answer_grams.items() if g not in boiler}
        if problem and not problem_evidence(c, problem, index):
            problem = {}  # one shared phrase ("m and n are relatively prime positive integers. find m+n") is not a leak
        need = max(cfg.min_matched_grams, cfg.answer_min_share * answer_grams)
        if answer and not problem and len(answer) < min(need, max(1, answer_grams)):
            answer = {}  # a few shared phrases of a worked solution are not a leak of it
        if problem or answer:
            method = "exact"
            matched = sorted(set(problem.values()) | set(answer.values()))
            score = (min(1.0, len(problem) / max(1, item_grams)) if problem
                     else min(1.0, len(answer) / max(1, answer_grams)))
            score = max(score, c.containment)
        elif c.containment >= cfg.containment:
            method, matched, score = "minhash", [], c.containment
        elif c.numbers_hit and cfg.short_numbers:
            method, matched, score = "numbers", [], 1.0
        elif c.evidence is not None and semantic_verdict(c):
            method, matched, score = "semantic", list(c.evidence.shared_words), c.containment
        else:
            continue
        fields = c.fields | ({c.semantic_field} if method == "semantic" else set())
        out.append({"row_id": c.row_id, "row": c.row, "source": c.source, "benchmark": item.benchmark,
                    "eval_item_id": item.item_id, "method": method, "fields": sorted(fields),
                    "matched_ngrams": matched[:20], "n_matched": len(problem) + len(answer), "containment": round(score, 4),
                    "answer_hit": bool(answer) or c.short_answer_hit, **_semantic_columns(c)})
    return pa.Table.from_pylist(out, schema=HIT_SCHEMA), sorted(gram_text[g] for g in boiler)


def _semantic_columns(c: Candidate) -> dict:
    if c.evidence is None:
        return {"similarity": None, "evidence": None, "judge": None}
    e = c.evidence
    return {"similarity": c.similarity, "judge": c.judge or None,
            "evidence": {"quantities_kept": e.quantities_kept, "quantities_total": e.quantities_total,
                         "quantity_share": e.quantity_share, "word_share": e.word_share, "entities_kept": e.entities_kept,
                         "entities_total": e.entities_total, "shared_words": list(e.shared_words)}}

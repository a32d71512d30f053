"""What a stage reports: a `Candidate` per (training row, eval item) with the evidence each stage
found. Workers send candidates back; the final rules (rules.py) decide which become hits."""

from __future__ import annotations

from dataclasses import dataclass, field

from rufus_data.similarity.semantic_evidence import Evidence


@dataclass
class Candidate:
    """One (training row, eval item) pair found by a worker, before the parent's final rules."""

    row: int  # global row number in the input
    row_id: str
    source: str
    item: int
    fields: set[str] = field(default_factory=set)
    problem_grams: dict[int, str] = field(default_factory=dict)  # exact stage: gram hash -> matched text
    answer_grams: dict[int, str] = field(default_factory=dict)
    problem_places: dict[int, tuple[int, int]] = field(default_factory=dict)  # problem gram -> (place in the item, length)
    containment: float = 0.0  # MinHash stage, exact on shingle sets
    short_answer_hit: bool = False
    numbers_hit: bool = False  # numbers stage: a field holds the whole short item with its digits masked
    # semantic stage: the best matching field (or window) of the row for this item
    similarity: float = 0.0  # cosine of the embeddings
    evidence: Evidence | None = None  # what of the item the text keeps
    semantic_passed: bool = False  # the evidence rule's verdict
    semantic_text: str = ""  # the matching field or window (normalised words), for the judge
    semantic_field: str = ""
    judge: str = ""  # the LLM judge's verdict: "yes", "no", "failed" ("" = not asked)


class Candidates:
    """The candidates of one batch of rows, one per (row in the batch, eval item), made on first use."""

    def __init__(self, first_row: int, row_ids: list, sources: list):
        self.first_row, self.row_ids, self.sources = first_row, row_ids, sources
        self.found: dict[tuple[int, int], Candidate] = {}

    def at(self, row: int, item: int) -> Candidate:
        key = (row, item)
        got = self.found.get(key)
        if got is None:
            got = self.found[key] = Candidate(self.first_row + row, str(self.row_ids[row]),
                                              str(self.sources[row] or ""), item)
        return got

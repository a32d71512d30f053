"""`rufus-data decontam`: find training rows that contain benchmark items, say which item and why,
and write the clean shards. Every split of the shard folder (train, holdout, ...) is scanned and
written. See docs/decontam.md.

The package is a pipeline of small steps, one job per module:

    config.py         DecontamConfig, every knob, and DecontamCommand, the command's own settings
    run.py            decontam(shards, out, settings): the whole run, stage by stage
    plan.py           --dry-run: what a run would read and check, nothing scanned
    texts.py          the tokenised eval texts and training fields every stage sees
    exact_stage.py    stage 1: exact word n-grams (n=8) of problems and distinctive answers
    minhash_stage.py  stage 2: near duplicates, MinHash + LSH, re-checked by exact containment
    numbers_stage.py  a second look at short items with their numbers changed (digits masked)
    semantic_stage.py stage 3 (--semantic): embedding retrieval, decided by the evidence a paraphrase keeps
                      (rufus_data/similarity/: the embedder, the search, that evidence)
    semantic_judge.py the optional LLM judge of stage 3, run in the parent
    index.py          the eval side: one index per stage, kept in $RUFUS_CACHE and in the process
    candidates.py     what a stage reports: (training row, eval item) candidates and their evidence
    scan.py           one batch of rows through every stage
    engines.py        tasks over a shard folder, run in-process, in a process pool or on Ray
    rules.py          the final rules that need the whole corpus (training-side boilerplate)
    report.py         the result, the summary table and report.md
    hits_page.py      hits.html: every hit beside its benchmark item, shared words marked

A stage is a module with a `build_*_index(texts, config)` for the eval side and a
`scan_*(batch, its index, ..., candidates)` for a batch of rows; it joins the pipeline with a
field of `EvalIndex`, a line in `scan_table`, and its method in `rules.finalise`.

The names below are imported when first used (lazy_exports.py): `rufus-data` reads config.py at
start, and this file must not load arrow or numpy for it."""

from __future__ import annotations

from rufus_data.base.lazy_exports import lazy_exports

__all__ = [
    "HIT_SCHEMA", "Candidate", "DecontamCommand", "DecontamConfig", "DecontamResult", "EvalIndex", "build_eval_index",
    "decontam", "decontam_plan", "finalise", "scan_table", "source_benchmark_counts", "summary_table",
]

__getattr__ = lazy_exports(__name__, {
    "HIT_SCHEMA": "rules", "finalise": "rules", "Candidate": "candidates", "DecontamCommand": "config",
    "DecontamConfig": "config", "DecontamResult": "report", "source_benchmark_counts": "report",
    "summary_table": "report", "EvalIndex": "index", "build_eval_index": "index", "scan_table": "scan",
    "decontam": "run", "decontam_plan": "plan",
})

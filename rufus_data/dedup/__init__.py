"""`rufus-data dedup`: the MinHash machinery of decontam turned inward. Near-duplicate rows
inside one mix skew token shares as surely as a bad catalog, so each cluster of near
duplicates keeps only its first row (input order: shard by shard, row by row) and the report
lists the clusters. See docs/decontam.md ("dedup").

Every split of the folder is read, train first: a holdout row that duplicates a train row is
dropped from the holdout (it would measure memorisation, not generalisation).

A mix's own repeats (an upsampled source's copies of one row, which share an `origin_id`) are no
duplicates: every copy follows its first one, kept or dropped, and is never compared. Dedup
still moves token shares when the near duplicates sit unevenly in the sources, so the report
and manifest give each source's share of the train tokens before and after and warn when one
moves more than a percentage point: dedup belongs before mixing (dedup each source, then mix;
docs/data.md), and on a mix it is a check that says how far the shares moved.

It is done the way large-scale dedup is done, so memory stays flat however many rows come in
and the work spreads over processes or a Ray cluster; the package is a pipeline of small steps:

    config.py      DedupConfig, every knob, and DedupCommand, the command's own settings
    run.py         dedup(shards, out, settings): the whole run, stage by stage
    plan.py        --dry-run: what a run would read and check, nothing hashed
    signatures.py  stage 1, per batch of rows: shingle sets, MinHash signatures, band keys
    shuffle.py     keys written out by partition and read back one partition at a time
    candidates.py  stage 2: keys grouped by sorting: repeats, exact copies, candidate pairs
    verify.py      stage 3: each candidate pair's exact Jaccard, from a spill of the rows' shingles
    clusters.py    stage 4: union-find over the verified pairs; the first row of each cluster stays
    pipeline.py    stages 1-4 as tasks over the shared engines (rufus_data/base/engines.py)
    work.py        the work folder every stage writes to, so a killed run resumes
    semantic.py    the optional second stage (--semantic): rows that restate an earlier row
    rows.py        reading some rows again (ids, texts) by row number
    report.py      the result, the share report, the summary table and report.md

With `semantic: true` (`--semantic`) a second stage looks among the rows MinHash kept for rows
that say the same thing in other words; clusters.parquet and the report say which stage
dropped each row.

The names below are imported when first used (lazy_exports.py): `rufus-data` reads config.py at
start, and this file must not load arrow or numpy for it."""

from __future__ import annotations

from rufus_data.base.lazy_exports import lazy_exports

__all__ = ["CLUSTER_SCHEMA", "SHARE_SHIFT_PP", "DedupCommand", "DedupConfig", "DedupResult", "dedup", "dedup_plan",
           "share_shifts"]

__getattr__ = lazy_exports(__name__, {
    "CLUSTER_SCHEMA": "report", "SHARE_SHIFT_PP": "report", "DedupResult": "report", "share_shifts": "report",
    "DedupCommand": "config", "DedupConfig": "config", "dedup": "run", "dedup_plan": "plan",
})

"""folders/: the folders Rufus writes and reads, and how one is written. Builds on base/ and
similarity/ only.

- shards.py: the shard folder, the one contract between the three packages.
- run_folder.py: the run folder rufus-train writes and rufus-eval reads: every file's name.
- output_lock.py: one writer per output folder or run folder.
- output_step.py: how a data step writes its shard folder (temporary folder, manifest, card) and
  what it returns (StepResult).
- dataset_card.py: the README.md that makes `datasets.load_dataset(OUT)` load what the step means.
- lineage.py: the folders a run's data was made from, and whether it was checked for leaks.
- hub_push.py: a data folder or run folder pushed to the Hub.
- review_page.py: self-contained HTML pages to review rows (decontam's hits, the vibe test)."""

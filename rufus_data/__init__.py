"""rufus_data: the data steps of post-training, and the floors that rufus_eval and rufus_train
share with them. It imports neither rufus_eval nor rufus_train.

The data steps, each a folder, each writing a shard folder (cli.py runs them as `rufus-data`):
- mix/: a catalog's sources, canonicalised and mixed by token share.
- decontam/: rows that contain benchmark items, found and dropped.
- dedup/: near-duplicate rows (MinHash; rewordings with --semantic), dropped.
- rollouts/: `filter` (prompts bucketed by k scored rollouts) and `pairs` (preference pairs).

The floors below them (none imports a data step: tests/test_layering.py):
- generate/: the generation engine (hf, vllm, any OpenAI-compatible server), one interface.
- rewards/: the reward functions and verifiers, as TRL calls them; group outcomes for GRPO.
- similarity/: normalisation, n-gram hashes, MinHash + LSH, embeddings, vector search.
- benchmarks/: the benchmark registry, suite schema, rows and their conversion.
- sources: dataset_source.py (where rows come from), catalog.py, sources.py and source_formats.py
  (canonical rows from a catalog source), builders.py, tokens.py and chat_render.py (counting).
- shard folders: shards.py (the contract), output_step.py (how a step writes one), shard_inspect.py,
  dataset_card.py (the README.md that makes `datasets.load_dataset(OUT)` load what the step means);
  output_lock.py (one writer per output folder or run folder, for all three packages); inputs.py
  (what a command reads: a shard folder, or a catalog mixed into one first); lineage.py (the
  folders a run's data was made from, and whether it was checked against a benchmark).
- run folders: run_folder.py (the contract rufus-train writes and rufus-eval reads: every name of
  a run folder and a checkpoint), devices.py (the GPU roles of a run: trainer, vLLM server,
  checkpoint evaluation).
- pages to review rows in a browser: review_page.py (decontam's hits.html, rufus-eval vibe's page).
- models: models.py, hub.py, merged_model.py, openai_api.py (talking to a server), hub_push.py
  (a data folder or a run folder pushed to the Hub).
- the command lines: cli_options.py, console.py, errors.py, yaml_config.py, cpu_threads.py,
  paths.py, cache.py (the cache's bound, `cache info` / `cache clean`), report.py, jsonl.py, engines.py,
  lazy_exports.py (a data step's package names its entry points without loading them)
  (tasks over a shard folder), perturb.py.
- the installed package: catalog_files.py (where catalogs are: the user's own, then the shipped
  ones), version.py (the version every output records), env_report.py (`rufus-data env`)."""


def __getattr__(name: str):
    if name == "__version__":  # one source: version.py (the checkout's commit, or the installed version)
        from rufus_data.version import rufus_version

        return rufus_version()
    raise AttributeError(f"module 'rufus_data' has no attribute {name!r}")

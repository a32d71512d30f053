"""rufus_data: the data steps of post-training, and the floors that rufus_eval and rufus_train
share with them. It imports neither rufus_eval nor rufus_train.

The data steps, each a folder, each writing a shard folder (cli.py runs them as `rufus-data`):
- mix/: a catalog's sources, canonicalised and mixed by token share.
- decontam/: rows that contain benchmark items, found and dropped.
- dedup/: near-duplicate rows (MinHash; rewordings with --semantic), dropped.
- rollouts/: `filter` (prompts bucketed by k scored rollouts) and `pairs` (preference pairs).

The floors below them, lowest first; each imports only itself and the floors below it, and none
imports a data step (tests/test_layering.py). Each folder's own docstring maps its modules.
- base/: what every command stands on: errors, console, CLI options, strict YAML, paths, the
  cache, the version, where catalogs are, the environment report, task engines, small reports.
- similarity/: normalisation, n-gram hashes, MinHash + LSH, embeddings, vector search.
- folders/: the folders the steps write and read: shard folders, run folders, the output lock
  and how a step writes, lineage, dataset cards, pushing to the Hub, review pages.
- models/: reaching a model: built-ins, merged LoRA runs, the Hub, an OpenAI-compatible server,
  the GPU roles of a run, the chat template Rufus ships.
- rewards/: the reward functions and verifiers, as TRL calls them; group outcomes for GRPO.
- generate/: the generation engine (hf, vllm, any OpenAI-compatible server), one interface.
- sources/: catalogs, where rows come from, canonical rows, builders, token counts.
- benchmarks/: the benchmark registry, suite schema, rows and their conversion.

At this root only the commands: cli.py (`rufus-data`) and shard_inspect.py (`rufus-data
inspect`)."""


def __getattr__(name: str):
    if name == "__version__":  # one source: base/version.py (the checkout's commit, or the installed version)
        from rufus_data.base.version import rufus_version

        return rufus_version()
    raise AttributeError(f"module 'rufus_data' has no attribute {name!r}")

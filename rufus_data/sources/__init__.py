"""sources/: where training rows come from and what they count. Builds on base/, folders/,
models/ and rewards/.

- catalog.py: mixture catalogs (sources, canonical shape, token share), validated strictly.
- dataset_source.py: where a dataset's rows come from (local copy, data root, the Hub).
- source_formats.py: how a raw row of each format reads (conversation, answer, preference).
- canonical.py: a catalog source opened and turned into canonical rows.
- builders.py: training rows built from real rows by a small step a catalog names.
- perturb.py: a wrong final answer that keeps the reasoning (Tulu 3's rejected answers).
- tokens.py: token counts of canonical rows as the trainer sees them; chat_render.py: chat
  templates rendered many conversations per call.
- inputs.py: what a command reads: a shard folder, or a catalog mixed into one first."""

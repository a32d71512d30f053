"""models/: reaching a model. Builds on base/ and folders/.

- builtin.py: the built-in models (smollm2-135m, tiny-random), converted once and cached.
- reference.py: a model reference resolved once (ModelRef): built-in, hub id, folder, adapter, run, checkpoint.
- chat_template.py: a `chat_template:` setting read (shipped name, file, inline) and a template named.
- check.py: `models check`: template source, mask route, end tokens, thinking switch, vocabulary.
- embeddings.py: embedding rows added for a tokenizer longer than them (before training, before an adapter loads).
- loss_mask.py: which tokens of a conversation carry loss (markers, TRL's training template, prefixes).
- thinking.py: a hybrid reasoning template's thinking switch (`enable_thinking`, /think flags) and a mode applied.
- end_tokens.py: where a model's answer ends (generation_config's end tokens and the tokenizer's eos).
- merged_model.py: a LoRA adapter or run as a plain model folder (`RUN/merged/`).
- hub.py: hub revisions, offline mode, whether the hub answers.
- openai_api.py: the one client of an OpenAI-compatible server (URLs, keys, retries).
- devices.py: the GPU roles of a run (trainer, vLLM server, checkpoint evaluation).
- templates/: the chat template Rufus ships (ChatML with generation markers)."""

"""Where a model's answer ends: the end tokens of its `generation_config` (a list for Llama 3:
`<|end_of_text|>`, `<|eom_id|>`, `<|eot_id|>`; Qwen's `<|im_end|>` and `<|endoftext|>`) with
the tokenizer's eos. The chat template ends a turn with one of them, which is often not the
tokenizer's eos, so every backend stops on all of them: the hf backend's `eos_token_id`, a vLLM
server's `stop_token_ids`, lm-eval's `until` strings and its models' stop ids."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class EndTokens:
    """A model's end tokens: their ids (sorted) and their text (the strings a stop list matches)."""

    ids: tuple[int, ...]
    strings: tuple[str, ...]

    def record(self) -> dict:
        return {"ids": list(self.ids), "strings": list(self.strings)}


def end_tokens(tokenizer, generation_config=None) -> EndTokens:
    """The end tokens of a model: `generation_config.eos_token_id` (an id or a list; a
    GenerationConfig, or the dict of generation_config.json) and the tokenizer's eos."""
    if isinstance(generation_config, dict):
        configured = generation_config.get("eos_token_id")
    else:
        configured = getattr(generation_config, "eos_token_id", None)
    found = set(configured if isinstance(configured, list) else [configured])
    found.add(tokenizer.eos_token_id)
    found.discard(None)
    ids = tuple(sorted(int(i) for i in found))
    return EndTokens(ids, tuple(tokenizer.decode([i]) for i in ids))  # text, not the vocabulary's byte spelling


def folder_end_tokens(folder: str | Path, tokenizer=None) -> EndTokens:
    """The end tokens of a model folder (generation_config.json, when there is one, with its
    tokenizer's eos); `tokenizer`: already loaded."""
    if tokenizer is None:
        from transformers import AutoTokenizer  # heavy: only where a folder is read

        tokenizer = AutoTokenizer.from_pretrained(folder)
    path = Path(folder) / "generation_config.json"
    return end_tokens(tokenizer, json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None)

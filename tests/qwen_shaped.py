"""A model folder shaped like Qwen2.5-0.5B-Instruct, from tiny-random's weights: TRL's qwen2_5 chat
template (no {% generation %} markers), Qwen's special tokens added to the vocabulary as Qwen's
tokenizer adds them, `<|im_end|>` as the tokenizer's end token and generation_config's end tokens
[<|im_end|>, <|endoftext|>]. With `rows_for_added`, the embeddings hold a row for every token and
are padded past them (as Qwen's 151,936 rows are past its 151,665 tokens); without, the added
tokens have no rows (a tokenizer grown after the weights were saved)."""

from __future__ import annotations

import shutil
from pathlib import Path

from rufus_data.models.chat_template import shipped_templates

END_TOKENS = ["<|im_end|>", "<|endoftext|>"]  # Qwen2.5-Instruct's generation_config eos_token_id, in order
# Qwen2.5's added special tokens that smollm2's vocabulary lacks (it has <|endoftext|>, <|im_start|>, <|im_end|>)
QWEN_SPECIAL = ["<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>", "<|box_end|>", "<|quad_start|>",
                "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>",
                "<|video_pad|>"]
QWEN_ADDED = ["<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
              "<|repo_name|>", "<|file_sep|>"]  # added, not special (Qwen's tokenizer_config.json)


def write_qwen2_5_shaped(tiny_model: str, out: Path, rows_for_added: bool = True) -> Path:
    """The folder at `out` (see the module's docstring), made from the tiny-random folder."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    shutil.copytree(tiny_model, out, ignore=shutil.ignore_patterns("*chat_template*", "rufus-model.json",
                                                                   "generation_config.json"))
    tokenizer = AutoTokenizer.from_pretrained(out)
    tokenizer.add_special_tokens({"additional_special_tokens": QWEN_SPECIAL})
    tokenizer.add_tokens(QWEN_ADDED)
    tokenizer.eos_token, tokenizer.pad_token = "<|im_end|>", "<|endoftext|>"
    tokenizer.chat_template = shipped_templates()["qwen2_5"]
    tokenizer.save_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out)
    if rows_for_added:
        model.resize_token_embeddings(len(tokenizer), pad_to_multiple_of=64, mean_resizing=False)
    ids = tokenizer.convert_tokens_to_ids(END_TOKENS)
    model.config.eos_token_id, model.config.bos_token_id = ids[1], ids[1]  # Qwen's config.json: <|endoftext|>
    model.generation_config = GenerationConfig(eos_token_id=ids, pad_token_id=ids[1], bos_token_id=ids[1])
    model.save_pretrained(out)
    return out

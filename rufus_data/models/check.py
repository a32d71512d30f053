"""`rufus-data models check MODEL`: what Rufus will make of a model before a run trains it, read
from its small files (config, generation config, tokenizer; no weights): where its chat template
comes from, which route finds its loss tokens (loss_mask.py), where its generation stops, whether
its template has a thinking switch, and whether every token has an embedding row. The same table
heads `rufus-train stage --dry_run` and `pipeline --dry_run`."""

from __future__ import annotations

import re
from pathlib import Path

from rufus_data.base.errors import RufusError
from rufus_data.folders.run_folder import MODEL_CONFIG, TOKENIZER_CONFIG
from rufus_data.models.builtin import BUILTINS, is_cached
from rufus_data.models.chat_template import read_chat_template, template_name
from rufus_data.models.loss_mask import ROUTE_WORDS, NoLossMask, decide_loss_mask
from rufus_data.models.reference import ModelRef, require_loadable

GENERATION_CONFIG = "generation_config.json"
COLUMNS = ["check", "finding"]
# how a template lets a caller switch reasoning on and off, by the variable or flag it reads
THINKING_SWITCHES = [
    (re.compile(r"\benable_thinking\b"), "enable_thinking (Qwen3-style: a template variable)"),
    (re.compile(r"/no_think\b"), "/think and /no_think system flags (SmolLM3-style)"),
    (re.compile(r"\breasoning_effort\b"), "reasoning_effort (gpt-oss-style: a template variable)"),
]


def files_folder(ref: ModelRef, name: str) -> str:
    """Where `name` (config.json, tokenizer_config.json) of `ref` is: its own folder, else (an
    adapter keeps only some) its base's; a hub id is handed on as it is."""
    folder = ref.folder()
    if ref.kind == "hub" or (Path(folder) / name).exists() or ref.base is None:
        return folder
    return files_folder(ref.base, name)


def is_local(ref: ModelRef) -> bool:
    """The model's files are here without converting or downloading anything (for --dry_run)."""
    if ref.kind == "builtin":
        return is_cached(ref.portable)
    return ref.kind != "hub" and (ref.base is None or is_local(ref.base))


def end_tokens(source: str, tokenizer) -> str:
    """The ids generation stops at (generation_config.json's eos_token_id, else config.json's), with their text."""
    from transformers import AutoConfig, GenerationConfig

    try:
        ids, where = GenerationConfig.from_pretrained(source).eos_token_id, GENERATION_CONFIG
    except OSError:  # no generation_config.json: the model config's
        ids, where = AutoConfig.from_pretrained(source).eos_token_id, MODEL_CONFIG
    if ids is None:
        return f"none set in {GENERATION_CONFIG} or {MODEL_CONFIG}: generation stops only at max tokens"
    ids = [ids] if isinstance(ids, int) else list(ids)
    return ", ".join(f"{tokenizer.convert_ids_to_tokens(i)} ({i})" for i in ids) + f" from {where}"


def thinking_switch(template: str | None) -> str:
    if not template:
        return "none (no chat template)"
    found = [words for pattern, words in THINKING_SWITCHES if pattern.search(template)]
    return "; ".join(found) or "none"


def vocabulary(source: str, tokenizer) -> str:
    """len(tokenizer) against the embedding rows config.json declares (vocab_size)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(source)
    rows = getattr(config.get_text_config(), "vocab_size", None)
    tokens = len(tokenizer)
    if rows is None:
        return f"{tokens} tokens; {MODEL_CONFIG} declares no vocab_size"
    if tokens > rows:
        return (f"{tokens} tokens, {rows} embedding rows: {tokens - rows} tokens without a row (added special "
                f"tokens); training resizes the embeddings to {tokens} rows first")
    return f"{tokens} tokens, {rows} embedding rows" + (f" ({rows - tokens} spare)" if rows > tokens else "")


def template_source(tokenizer, chat_template: str | None) -> tuple[str | None, str]:
    """(the template a run renders with, where it comes from in words)."""
    if chat_template:
        text = read_chat_template(chat_template, Path.cwd(), "chat_template")
        return text, f"`chat_template: {chat_template}` ({template_name(text)})"
    own = tokenizer.chat_template
    own = own.get("default") if isinstance(own, dict) else own
    if own:
        return own, f"the model's own ({template_name(own)})"
    return None, "none: a base model; set `chat_template:` (a shipped name such as rufus_chatml or qwen2_5, or a file)"


def mask_route(tokenizer, owner: str) -> str:
    try:
        loss = decide_loss_mask(tokenizer, owner)
    except NoLossMask as refused:
        return f"refused: {refused.reason} (assistant_only_loss: false trains on every token)"
    return f"{loss.route}: {ROUTE_WORDS[loss.route]}"


def check_model(model: str | ModelRef, chat_template: str | None = None) -> list[tuple[str, str]]:
    """The check table's rows for `model` (with a stage's `chat_template:` setting, if any)."""
    from transformers import AutoTokenizer  # heavy: only when a check runs

    ref = require_loadable(model)
    tokenizer_source = files_folder(ref, TOKENIZER_CONFIG)
    config_source = files_folder(ref, MODEL_CONFIG)
    try:
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_source)
    except (OSError, ValueError) as err:
        raise RufusError(f"model {ref.text}: its tokenizer cannot be read from {tokenizer_source} ({err}): give a "
                         "model folder with its tokenizer files, a run folder, a built-in or a hub id") from None
    template, source = template_source(tokenizer, chat_template)
    tokenizer.chat_template = template
    return [
        ("model", ref.describe()),
        ("chat template", source),
        ("loss mask route", mask_route(tokenizer, f"model {ref.text}")),
        ("end tokens", end_tokens(config_source, tokenizer)),
        ("thinking switch", thinking_switch(template)),
        ("vocabulary", vocabulary(config_source, tokenizer)),
    ]


def dry_run_check(model: str, chat_template: str | None) -> list[tuple[str, str]] | None:
    """The table for a dry run, when the model's files are here (a built-in not yet converted, a
    hub id or a run folder a pipeline has still to write: None, nothing is fetched)."""
    if model not in BUILTINS and not Path(model).expanduser().is_dir():
        return None
    ref = ModelRef.of(model)
    return check_model(ref, chat_template) if is_local(ref) else None

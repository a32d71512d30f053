"""Token counts and loss masks of canonical rows, as the trainer will see them.

Rows are rendered with the template the loss mask decided (rufus_data/models/loss_mask.py: the
chat template's own, or TRL's training version of it), then tokenized in batches by the fast
(Rust) tokenizer. A token is trainable when it overlaps an assistant span ({% generation %}
blocks, or the prefix spans): the same rule transformers applies for
`return_assistant_tokens_mask`, so the counts equal TRL's `assistant_masks`."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Literal

from rufus_data.base.errors import RufusError
from rufus_data.folders.shards import Kind
from rufus_data.models.loss_mask import LossMask, NoLossMask, decide_loss_mask, overlap_mask, prefix_spans
from rufus_data.models.reference import ModelRef
from rufus_data.sources.chat_render import ChatRenderer

FIRST_TRAINABLE_BATCH = 1024
MaskNeed = Literal["required", "if_any", "none"]


@dataclass
class Counts:
    total: list[int]
    trainable: list[int]


def _load_tokenizer(tokenizer_ref: str):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(ModelRef.of(tokenizer_ref).folder())
    except RufusError:
        raise
    except Exception as err:  # noqa: BLE001 - any load failure becomes one clear message
        raise RufusError(
            f"could not load tokenizer {tokenizer_ref!r} ({type(err).__name__}: {str(err)[:200]}); "
            "give a local model folder, a reachable hub id, or the built-in 'smollm2-135m'"
        ) from None


def _name(tokenizer_ref) -> str:
    return tokenizer_ref if isinstance(tokenizer_ref, str) else getattr(tokenizer_ref, "name_or_path", "") or "given"


class TokenCounter:
    """Counts total and trainable tokens of canonical rows of one kind, and gives their loss masks."""

    def __init__(self, tokenizer_ref, chat_template: str | None = None, *, loss: LossMask | None = None,
                 masks: MaskNeed = "required"):
        """`tokenizer_ref`: a model reference (loaded here) or an already loaded tokenizer (a trainer's).
        `loss`: the decided loss mask, else decided here as `masks` says: `required` (a template no
        route serves is refused), `if_any` (it counts total tokens; `no_mask_reason` says why none
        are trainable) or `none` (prompts only: nothing is trainable, nothing decided)."""
        self.tokenizer = tokenizer_ref if not isinstance(tokenizer_ref, str) else _load_tokenizer(tokenizer_ref)
        if chat_template is not None:
            self.tokenizer.chat_template = chat_template
        self.template = self.tokenizer.chat_template
        if not self.template:
            raise RufusError(f"tokenizer {tokenizer_ref!r} has no chat template: set `chat_template:` in the catalog "
                             "(a shipped name such as rufus_chatml or qwen2_5, or a .jinja file)")
        self.loss, self.no_mask_reason = loss, None
        if self.loss is None and masks != "none":
            try:
                self.loss = decide_loss_mask(self.tokenizer, f"tokenizer {_name(tokenizer_ref)!r}")
            except NoLossMask as err:
                if masks == "required":
                    raise
                self.no_mask_reason = str(err)
        self.backend = self.tokenizer.backend_tokenizer
        self.template_kwargs = dict(self.tokenizer.special_tokens_map)
        rendered = self.loss.template if self.loss else self.template
        self.renderer = ChatRenderer(rendered, self.loss is not None and self.loss.tracked)
        # special tokens a batch's shared prefix may end at (_shared_prefix), and whether cutting there
        # was checked to count what the whole texts count (None: not yet)
        self.cut_tokens = [t.content for t in self.tokenizer.added_tokens_decoder.values()
                           if t.special and not t.rstrip and not t.normalized and t.content]
        self.prefix_checked: bool | None = None

    def render(self, conversations: list[list[dict]], add_generation_prompt: bool = False, tools: list | None = None):
        """(rendered texts, assistant spans of each) of conversations that share the tool schemas
        `tools`, as transformers renders them (many per template call: rufus_data/sources/chat_render.py);
        the spans by the loss mask's route (none with the generation prompt, or without a route)."""
        texts, spans = self.renderer.render(conversations, add_generation_prompt=add_generation_prompt, tools=tools,
                                            **self.template_kwargs)
        if self.loss is not None and not self.loss.tracked and not add_generation_prompt:
            def render_chats(chats, prompt):
                return self.renderer.render(chats, add_generation_prompt=prompt, tools=tools, **self.template_kwargs)[0]

            spans = prefix_spans(conversations, texts, render_chats, f"chat template {self.loss.name}")
        return texts, spans

    def count_conversations(self, conversations: list[list[dict]], add_generation_prompt: bool = False) -> Counts:
        return self._encode(*self.render(conversations, add_generation_prompt))

    def count_batches(self, batches: Iterable[list[dict]], kind: Kind) -> Iterator[tuple[list[dict], Counts]]:
        """Counts of each batch of canonical rows on the kind's basis (sft whole chats; rl prompts
        with the generation prompt, no trainable tokens; preference prompt + chosen, trainable =
        the chosen reply). Pipelined: while the Rust tokenizer encodes one batch (on every core,
        without the GIL), this thread reads and renders the next one."""
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="rufus-tokenize") as pool:
            pending = None
            for rows in batches:
                future = pool.submit(self._encode, *self._render_rows(rows, kind))
                if pending is not None:
                    yield pending[0], pending[1].result()
                pending = (rows, future)
            if pending is not None:
                yield pending[0], pending[1].result()

    def _render_rows(self, rows: list[dict], kind: Kind):
        if kind == "sft":
            return self.render([r["messages"] for r in rows])
        if kind == "rl":  # prompts carry no trainable span
            return self.render([r["prompt"] for r in rows], add_generation_prompt=True)[0], None
        return self.render([list(r["prompt"]) + list(r["chosen"]) for r in rows])

    def first_trainable(self, conversations: list[list[dict]], tools: list | None = None) -> list[int | None]:
        """Per conversation, the position of its first trainable token (None: it has none): the
        first 1 of its loss mask (`token_masks`), found without building the masks."""
        if self.loss is None:
            return [None] * len(conversations)
        first: list[int | None] = [None] * len(conversations)
        for i, encoding, spans in self._encoded(conversations, tools):
            first[i] = _first_overlapping_token(encoding, spans)
        return first

    def token_masks(self, conversations: list[list[dict]], tools: list | None = None) -> list[tuple[list[int], list[int]]]:
        """Per conversation, (token ids, loss mask): what TRL trains with (routes 1 and 2: its
        `assistant_masks`; route 3: what the SFT stage hands it). `tools` as in `first_trainable`."""
        masks: list = [None] * len(conversations)
        for i, encoding, spans in self._encoded(conversations, tools):
            masks[i] = (list(encoding.ids), overlap_mask(encoding.offsets, spans) if self.loss else [0] * len(encoding.ids))
        return masks

    def _encoded(self, conversations: list[list[dict]], tools: list | None):
        """(index, encoding, spans) of each conversation, rendered and encoded in batches of rows that
        share tool schemas. `tools`: per conversation, its tool schemas (a list, its JSON, or None),
        rendered into the system turn as SFTTrainer renders them."""
        groups: dict[str, list[int]] = {}
        for i, schemas in enumerate(tools or [None] * len(conversations)):
            groups.setdefault(schemas if isinstance(schemas, str) else json.dumps(schemas), []).append(i)
        for schemas, rows in groups.items():
            for lo in range(0, len(rows), FIRST_TRAINABLE_BATCH):
                part = rows[lo : lo + FIRST_TRAINABLE_BATCH]
                rendered, spans = self.render([conversations[i] for i in part], tools=json.loads(schemas) or None)
                encodings = self.backend.encode_batch(rendered, add_special_tokens=False)
                yield from zip(part, encodings, spans, strict=True)

    def _encode(self, rendered: list[str], spans) -> Counts:
        cut = self._shared_prefix(rendered, spans)
        if cut and self.prefix_checked is None:  # checked once, not assumed: the whole texts must count the same
            self.prefix_checked = self._encode_from(rendered, spans, cut) == self._encode_from(rendered, spans, 0)
        return self._encode_from(rendered, spans, cut if self.prefix_checked else 0)

    def _encode_from(self, rendered: list[str], spans, cut: int) -> Counts:
        """Counts of the texts, the first `cut` characters (shared by all) tokenized once."""
        shared = len(self.backend.encode(rendered[0][:cut], add_special_tokens=False)) if cut else 0
        texts = [text[cut:] for text in rendered] if cut else rendered
        if spans is None or not any(spans):
            encodings = self.backend.encode_batch_fast(texts, add_special_tokens=False)
            return Counts([shared + len(e) for e in encodings], [0] * len(encodings))
        encodings = self.backend.encode_batch(texts, add_special_tokens=False)
        total = [shared + len(e) for e in encodings]
        trainable = [_overlapping_tokens(e, [(a - cut, b - cut) for a, b in s]) for e, s in zip(encodings, spans, strict=True)]
        return Counts(total, trainable)

    def _shared_prefix(self, rendered: list[str], spans) -> int:
        """How many leading characters every text shares up to the end of a special token, before
        any trainable span (a default system turn, say): 0 when none. The tokenizer splits its
        input at special tokens before anything else, so the pieces on either side tokenize as
        they would in the whole text; a token that strips the whitespace after it is not a cut."""
        if len(rendered) < 2 or not self.cut_tokens:
            return 0
        prefix = os.path.commonprefix(rendered)
        starts = [row[0][0] for row in spans or () if row]
        if starts:
            prefix = prefix[: min(starts)]
        return max((prefix.rfind(token) + len(token) for token in self.cut_tokens if token in prefix), default=0)


def _overlapping_tokens(encoding, spans: list[tuple[int, int]]) -> int:
    """Tokens whose character range overlaps any span: from the token holding the span's first
    character to the token holding its last (byte-level tokenizers cover every character), a
    token two spans share counted once. Falls back to scanning the offsets when a character maps
    to no token."""
    count, counted_to = 0, -1  # the last token counted
    for span_start, span_end in spans:
        if span_end <= span_start:
            continue
        first = encoding.char_to_token(span_start)
        last = encoding.char_to_token(span_end - 1)
        if first is None or last is None:
            return sum(overlap_mask(encoding.offsets, spans))
        count += max(0, last - max(first, counted_to + 1) + 1)
        counted_to = max(counted_to, last)
    return count


def _first_overlapping_token(encoding, spans: list[tuple[int, int]]) -> int | None:
    """The first token overlapping a span (spans are in order): the token holding the first
    character of the first non-empty span, or from the offsets when that character has none."""
    spans = [(start, end) for start, end in spans if end > start]
    if not spans:
        return None
    first = encoding.char_to_token(spans[0][0])
    if first is not None:
        return first
    for position, (token_start, token_end) in enumerate(encoding.offsets):
        if any(token_start < end and token_end > start for start, end in spans):
            return position
    return None

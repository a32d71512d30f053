"""Token counts of canonical rows, as the trainer will see them.

Rows are rendered with the tokenizer's chat template (the Rufus template carries
{% generation %} markers), then tokenized in batches by the fast (Rust) tokenizer. A token is
trainable when it overlaps an assistant span: the same rule transformers applies for
`return_assistant_tokens_mask`, so the counts equal TRL's `assistant_masks`."""

from __future__ import annotations

import re
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from rufus_data.chat_render import ChatRenderer
from rufus_data.errors import RufusError
from rufus_data.models import resolve_model
from rufus_data.shards import Kind

GENERATION_MARKER = re.compile(r"\{%-?\s*generation\s*-?%\}")


@dataclass
class Counts:
    total: list[int]
    trainable: list[int]


class TokenCounter:
    """Counts total and trainable tokens of canonical rows of one kind."""

    def __init__(self, tokenizer_ref: str, chat_template: str | None = None):
        from transformers import AutoTokenizer

        try:
            self.tokenizer = AutoTokenizer.from_pretrained(resolve_model(tokenizer_ref))
        except RufusError:
            raise
        except Exception as err:  # noqa: BLE001 - any load failure becomes one clear message
            raise RufusError(
                f"could not load tokenizer {tokenizer_ref!r} ({type(err).__name__}: {str(err)[:200]}); "
                "give a local model folder, a reachable hub id, or the built-in 'smollm2-135m'"
            ) from None
        if chat_template is not None:
            self.tokenizer.chat_template = chat_template
        self.template = self.tokenizer.chat_template
        if not self.template:
            raise RufusError(f"tokenizer {tokenizer_ref!r} has no chat template: set `chat_template:` in the catalog")
        # `{% generation %}` blocks, not the word "generation" (every template reads add_generation_prompt)
        self.has_generation_markers = GENERATION_MARKER.search(self.template) is not None
        self.backend = self.tokenizer.backend_tokenizer
        self.template_kwargs = dict(self.tokenizer.special_tokens_map)
        self.renderer = ChatRenderer(self.template, self.has_generation_markers)

    def render(self, conversations: list[list[dict]], add_generation_prompt: bool = False):
        """(rendered texts, assistant spans of each), as transformers renders them (many conversations
        per template call: rufus_data/chat_render.py)."""
        return self.renderer.render(conversations, add_generation_prompt=add_generation_prompt, **self.template_kwargs)

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

    def _encode(self, rendered: list[str], spans) -> Counts:
        if spans is None or not any(spans):
            encodings = self.backend.encode_batch_fast(rendered, add_special_tokens=False)
            return Counts([len(e) for e in encodings], [0] * len(encodings))
        encodings = self.backend.encode_batch(rendered, add_special_tokens=False)
        total = [len(e) for e in encodings]
        trainable = [_overlapping_tokens(e, s) for e, s in zip(encodings, spans, strict=True)]
        return Counts(total, trainable)


def _overlapping_tokens(encoding, spans: list[tuple[int, int]]) -> int:
    """Tokens whose character range overlaps any span: from the token holding the span's first
    character to the token holding its last (byte-level tokenizers cover every character).
    Falls back to scanning the offsets when a character maps to no token."""
    count = 0
    for span_start, span_end in spans:
        if span_end <= span_start:
            continue
        first = encoding.char_to_token(span_start)
        last = encoding.char_to_token(span_end - 1)
        if first is None or last is None:
            return _overlapping_by_offsets(encoding.offsets, spans)
        count += last - first + 1
    return count


def _overlapping_by_offsets(offsets: list[tuple[int, int]], spans: list[tuple[int, int]]) -> int:
    starts = [o[0] for o in offsets]
    ends = [o[1] for o in offsets]
    count = 0
    for span_start, span_end in spans:
        first = bisect_right(ends, span_start)  # first token ending after the span starts
        last = bisect_left(starts, span_end)  # first token starting at or after the span end
        count += max(0, last - first)
    return count

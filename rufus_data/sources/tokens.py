"""Token counts of canonical rows, as the trainer will see them.

Rows are rendered with the tokenizer's chat template (the Rufus template carries
{% generation %} markers), then tokenized in batches by the fast (Rust) tokenizer. A token is
trainable when it overlaps an assistant span: the same rule transformers applies for
`return_assistant_tokens_mask`, so the counts equal TRL's `assistant_masks`."""

from __future__ import annotations

import json
import os
import re
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from rufus_data.base.errors import RufusError
from rufus_data.folders.shards import Kind
from rufus_data.models.reference import ModelRef
from rufus_data.sources.chat_render import ChatRenderer

FIRST_TRAINABLE_BATCH = 1024
GENERATION_MARKER = re.compile(r"\{%-?\s*generation\s*-?%\}")


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


class TokenCounter:
    """Counts total and trainable tokens of canonical rows of one kind."""

    def __init__(self, tokenizer_ref, chat_template: str | None = None):
        """`tokenizer_ref`: a model reference (loaded here) or an already loaded tokenizer (a trainer's)."""
        self.tokenizer = tokenizer_ref if not isinstance(tokenizer_ref, str) else _load_tokenizer(tokenizer_ref)
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
        # special tokens a batch's shared prefix may end at (_shared_prefix), and whether cutting there
        # was checked to count what the whole texts count (None: not yet)
        self.cut_tokens = [t.content for t in self.tokenizer.added_tokens_decoder.values()
                           if t.special and not t.rstrip and not t.normalized and t.content]
        self.prefix_checked: bool | None = None

    def render(self, conversations: list[list[dict]], add_generation_prompt: bool = False, tools: list | None = None):
        """(rendered texts, assistant spans of each) of conversations that share the tool schemas
        `tools`, as transformers renders them (many per template call: rufus_data/sources/chat_render.py)."""
        return self.renderer.render(conversations, add_generation_prompt=add_generation_prompt, tools=tools,
                                    **self.template_kwargs)

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
        """Per conversation, the position of its first trainable token (None: it has none), in batches:
        a token is trainable by the rule of the counts, so it is the first 1 of TRL's
        `assistant_masks`. `tools`: per conversation, its tool schemas (a list, its JSON, or None),
        rendered into the system turn as SFTTrainer renders them; rows are rendered in groups of
        the same schemas."""
        if not self.has_generation_markers:  # no {% generation %} blocks: TRL's masks are all 0
            return [None] * len(conversations)
        groups: dict[str, list[int]] = {}
        for i, schemas in enumerate(tools or [None] * len(conversations)):
            groups.setdefault(schemas if isinstance(schemas, str) else json.dumps(schemas), []).append(i)
        first: list[int | None] = [None] * len(conversations)
        for schemas, rows in groups.items():
            for lo in range(0, len(rows), FIRST_TRAINABLE_BATCH):
                part = rows[lo : lo + FIRST_TRAINABLE_BATCH]
                rendered, spans = self.render([conversations[i] for i in part], tools=json.loads(schemas) or None)
                encodings = self.backend.encode_batch(rendered, add_special_tokens=False)
                for i, encoding, row_spans in zip(part, encodings, spans, strict=True):
                    first[i] = _first_overlapping_token(encoding, row_spans)
        return first

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


def _overlapping_by_offsets(offsets: list[tuple[int, int]], spans: list[tuple[int, int]]) -> int:
    starts = [o[0] for o in offsets]
    ends = [o[1] for o in offsets]
    count = 0
    for span_start, span_end in spans:
        first = bisect_right(ends, span_start)  # first token ending after the span starts
        last = bisect_left(starts, span_end)  # first token starting at or after the span end
        count += max(0, last - first)
    return count

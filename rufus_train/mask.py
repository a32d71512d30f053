"""`--show-mask N`: which tokens carry loss, before a GPU hour is spent on it.

The mask is the one the SFT stage trains with, from the one place that decides it
(rufus_data/models/loss_mask.py: the template's {% generation %} markers, TRL's training template
for it, or its rendered prefixes), then truncated to `max_length` keeping the start; a test checks
it against TRL's SFTTrainer token for token."""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text

from rufus_data.models.loss_mask import LossMask, decide_loss_mask
from rufus_data.sources.tokens import TokenCounter

LOSS_STYLE = "bold black on green"
CONTEXT_STYLE = "dim"


@dataclass
class MaskedExample:
    input_ids: list[int]
    loss_mask: list[int]  # 1 = the token carries loss

    @property
    def trained_tokens(self) -> int:
        return sum(self.loss_mask)


def loss_masks(tokenizer, conversations: list[list[dict]], loss: LossMask | None, max_length: int | None,
               tools: list | None = None) -> list[MaskedExample]:
    """Each conversation's tokens and loss mask; `loss` None: every token carries loss. `tools`:
    per conversation its tool schemas, rendered into the system turn as SFTTrainer renders them."""
    counter = TokenCounter(tokenizer, loss=loss, masks="none")
    found = counter.token_masks(conversations, tools)
    examples = [MaskedExample(ids, mask if loss is not None else [1] * len(ids)) for ids, mask in found]
    if max_length is not None:
        examples = [MaskedExample(e.input_ids[:max_length], e.loss_mask[:max_length]) for e in examples]
    return examples


def loss_mask(tokenizer, messages: list[dict], assistant_only: bool, max_length: int | None,
              tools: list | None = None) -> MaskedExample:
    """One conversation's tokens and loss mask (assistant turns only, or every token)."""
    loss = decide_loss_mask(tokenizer, "this tokenizer") if assistant_only else None
    return loss_masks(tokenizer, [messages], loss, max_length, [tools] if tools else None)[0]


def render(tokenizer, example: MaskedExample) -> Text:
    """Tokens decoded one by one: loss-carrying ones highlighted, context dimmed."""
    text = Text()
    for token_id, bit in zip(example.input_ids, example.loss_mask, strict=True):
        text.append(tokenizer.decode([token_id]), style=LOSS_STYLE if bit else CONTEXT_STYLE)
    return text

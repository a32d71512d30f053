"""`--show-mask N`: which tokens carry loss, before a GPU hour is spent on it.

The mask is computed the way TRL's SFTTrainer computes it (the chat template's
{% generation %} markers through `apply_chat_template(..., return_assistant_tokens_mask=True)`,
then truncation to `max_length` keeping the start), so what is printed is what trains; a test
checks the two agree token for token."""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text

LOSS_STYLE = "bold black on green"
CONTEXT_STYLE = "dim"


@dataclass
class MaskedExample:
    input_ids: list[int]
    loss_mask: list[int]  # 1 = the token carries loss

    @property
    def trained_tokens(self) -> int:
        return sum(self.loss_mask)


def loss_mask(
    tokenizer, messages: list[dict], assistant_only: bool, max_length: int | None, tools: list | None = None
) -> MaskedExample:
    """`tools`: the row's tool schemas, rendered into the system turn as SFTTrainer renders them."""
    out = tokenizer.apply_chat_template(
        messages, tools=tools or None, tokenize=True, return_dict=True, return_assistant_tokens_mask=assistant_only
    )
    ids = list(out["input_ids"])
    mask = list(out["assistant_masks"]) if assistant_only else [1] * len(ids)
    if max_length is not None:
        ids, mask = ids[:max_length], mask[:max_length]
    return MaskedExample(ids, mask)


def render(tokenizer, example: MaskedExample) -> Text:
    """Tokens decoded one by one: loss-carrying ones highlighted, context dimmed."""
    text = Text()
    for token_id, bit in zip(example.input_ids, example.loss_mask, strict=True):
        text.append(tokenizer.decode([token_id]), style=LOSS_STYLE if bit else CONTEXT_STYLE)
    return text

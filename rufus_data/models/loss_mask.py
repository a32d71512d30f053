"""Which tokens of a conversation carry loss: decided once per chat template, here, for mix's
trainable counts, the SFT row filter and training data, `--show_mask` and every stage that masks.

The routes, in order:
1. `markers`: the template's own `{% generation %}` blocks (transformers tracks their spans).
2. `trl_training_template`: TRL recognises the template (byte for byte) and ships a training
   version of it with markers: the swap SFTTrainer makes (`get_training_chat_template`), made here
   before anything is counted or filtered, so what `mix` counts is what TRL trains. Several of
   these families (Qwen3, Phi-3, gpt-oss, DeepSeek) rewrite earlier turns, so no other route works.
3. `prefixes`: a template TRL does not know: an assistant turn's span runs from the end of the
   rendering of the messages before it (with the generation prompt) to the end of the rendering
   through it, as Open Instruct masks turn by turn. Used only after a probe conversation shows the
   template renders prefixes as prefixes, and checked again on every row. TRL cannot swap such a
   template, so the SFT stage hands TRL these masks with the token ids.
Else the template is refused, by name, with what to set. A token carries loss when its characters
overlap a span: transformers' rule for `assistant_masks`, so counts equal TRL's masks.

Stages that train on a prompt and its completions (dpo, orpo, kto, grpo) mask no conversation
themselves (TRL splits prompt from completion), but render the prompt alone with the generation
prompt: `check_prompt_render` refuses, with docs/train.md's reasons, a template that cannot."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from rufus_data.base.errors import RufusError
from rufus_data.models.chat_template import template_name, template_sha256

Route = Literal["markers", "trl_training_template", "prefixes"]
GENERATION_MARKER = re.compile(r"\{%-?\s*generation\s*-?%\}")  # the blocks, not the word (add_generation_prompt)
PROBE = [{"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": "2 + 2 = 4."},
         {"role": "user", "content": "And 3 + 3?"}, {"role": "assistant", "content": "3 + 3 = 6."}]
FIX = ("set `chat_template:` to a template with {% generation %} ... {% endgeneration %} around each assistant reply "
       "(the shipped `rufus_chatml` for ChatML models), or train on every token (`assistant_only_loss: false`; a mix: "
       "`basis: total`)")
PROMPT_FIX = ("set `chat_template:` to a text chat template (the shipped `rufus_chatml` for ChatML models, or the "
              "text template of the model's family)")
ROUTE_WORDS = {"markers": "its own {% generation %} markers",
               "trl_training_template": "TRL's training template for it (the swap SFTTrainer makes)",
               "prefixes": "rendering each conversation's prefixes (the template renders prefixes as prefixes)"}


class NoLossMask(RufusError):
    """No route finds the assistant tokens of this template; `reason`: why, in a few words (docs/train.md's table)."""

    def __init__(self, message: str, reason: str):
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class LossMask:
    """How one chat template's assistant tokens are found."""

    route: Route
    template: str  # what is rendered to count and to train: route 2's is TRL's training version
    name: str  # the tokenizer's own template, as named for people (chat_template.template_name)

    @property
    def tracked(self) -> bool:
        """Spans come from {% generation %} blocks (routes 1 and 2), not from prefixes."""
        return self.route != "prefixes"

    def describe(self) -> str:
        return f"loss mask of chat template {self.name}: {ROUTE_WORDS[self.route]}"

    def record(self) -> dict:
        """What the manifest and run.json record."""
        return {"route": self.route, "chat_template": self.name, "rendered_sha256": template_sha256(self.template)}


def decide_loss_mask(tokenizer, owner: str) -> LossMask:
    """The route for `tokenizer`'s chat template (`owner` names the tokenizer in errors); a
    template no route serves is refused (NoLossMask), as is one that cannot render a plain chat."""
    template = tokenizer.chat_template
    if isinstance(template, dict):  # named variants: `default` is the one a chat renders with
        template = template.get("default")
    if not template:
        raise NoLossMask(f"{owner} has no chat template (a base model ships none): set `chat_template:` to a shipped "
                         "name (rufus_chatml, or a TRL family such as qwen2_5) or a .jinja file", "no chat template")
    name = template_name(template)
    if GENERATION_MARKER.search(template):
        found = LossMask("markers", template, name)
    elif (training := trl_training_template(tokenizer)) is not None:
        found = LossMask("trl_training_template", training, name)
    else:
        reason = prefix_probe(tokenizer, template)
        if reason:
            raise NoLossMask(f"the chat template {name} of {owner} has no {{% generation %}} markers, TRL has no training "
                             f"template for it, and it does not render prefixes as prefixes ({reason}), so which tokens "
                             f"are the assistant's cannot be told: {FIX}",
                             "no markers, unknown to TRL, and prefixes do not render as prefixes")
        found = LossMask("prefixes", template, name)
    _check_probe_masked(tokenizer, found, owner)
    return found


def trl_training_template(tokenizer) -> str | None:
    """TRL's training template for this tokenizer's chat template (None: TRL does not know it, or
    TRL is not installed: `mix` without the train extra)."""
    try:  # heavy (seconds): only for a template without markers
        from trl.chat_template_utils import get_training_chat_template
    except ImportError:
        return None
    try:
        return get_training_chat_template(tokenizer)
    except ValueError:  # "patching is not supported for this template"
        return None


def render(tokenizer, template: str, conversations: list[list[dict]], add_generation_prompt: bool = False,
           tracked: bool = False) -> tuple[list[str], list]:
    """transformers' rendering of conversations, one template call each, with the tokenizer's
    special tokens as variables (what apply_chat_template passes)."""
    from transformers.utils.chat_template_utils import render_jinja_template

    return render_jinja_template(conversations=conversations, chat_template=template,
                                 add_generation_prompt=add_generation_prompt,
                                 return_assistant_tokens_mask=tracked, **tokenizer.special_tokens_map)


def prefix_probe(tokenizer, template: str) -> str | None:
    """None when the probe chat renders prefixes as prefixes and each reply inside its span; else why not."""
    try:
        spans = prefix_spans([PROBE], render(tokenizer, template, [PROBE])[0],
                             lambda chats, prompt: render(tokenizer, template, chats, prompt)[0], "the probe")
    except NoLossMask:
        return "rendering a probe chat's first turns is not the start of rendering the whole chat"
    except Exception as err:  # noqa: BLE001 - the template's own error is the reason
        return f"the template raises {type(err).__name__}: {str(err)[:160]}"
    return None if spans else "no assistant turn"


def prefix_spans(conversations: list[list[dict]], texts: list[str], render_chats: Callable, owner: str) -> list:
    """Route 3: per conversation, [(start, end)] of each assistant turn in its rendered text.
    `render_chats(chats, add_generation_prompt)` renders as `texts` were rendered."""
    cuts = [(row, turn) for row, chat in enumerate(conversations)
            for turn, message in enumerate(chat) if message.get("role") == "assistant"]
    before = render_chats([conversations[row][:turn] for row, turn in cuts], True) if cuts else []
    through = render_chats([conversations[row][: turn + 1] for row, turn in cuts], False) if cuts else []
    spans: list[list[tuple[int, int]]] = [[] for _ in conversations]
    for (row, turn), start, end in zip(cuts, before, through, strict=True):
        text = texts[row]
        if not (end.startswith(start) and text.startswith(end)):
            part = "the messages before it with the generation prompt" if not text.startswith(start) else "the messages through it"
            raise NoLossMask(f"{owner}, conversation {row}: for its message {turn} (an assistant turn), the rendering of "
                             f"{part} is not the start of the whole conversation's rendering (the template renders that "
                             f"turn differently once later turns follow: it drops its reasoning, say), so its assistant "
                             f"tokens cannot be found from prefixes: {FIX}", "a row's prefixes do not render as prefixes")
        spans[row].append((len(start), len(end)))
    return spans


def check_prompt_render(tokenizer, owner: str) -> None:
    """A probe prompt renders, with the user's text, ending after it in the generation prompt and
    holding none of the reply: else refused (NoLossMask, with the reason docs/train.md names)."""
    template = tokenizer.chat_template
    template = template.get("default") if isinstance(template, dict) else template
    name = template_name(template)
    prompt, reply = PROBE[:1], PROBE[1]["content"]
    try:
        [text], _ = render(tokenizer, template, [prompt], add_generation_prompt=True)
        [bare], _ = render(tokenizer, template, [prompt])
        render(tokenizer, template, [PROBE[:2]])  # a DPO stage renders the prompt with each reply too
    except Exception as err:  # noqa: BLE001 - the template's own error, said with its name
        raise NoLossMask(f"the chat template {name} of {owner} cannot render a plain text prompt (it raises "
                         f"{type(err).__name__}: {str(err)[:200]}): {PROMPT_FIX}",
                         f"cannot render a plain-text chat ({type(err).__name__}: {str(err)[:80]})") from None
    user = prompt[0]["content"]
    if user not in text:
        raise NoLossMask(f"the chat template {name} of {owner} drops the text of plain-text messages (it reads "
                         f"`content` only as a list of typed blocks, as vision-language templates do), so every prompt "
                         f"would render empty: {PROMPT_FIX}", "renders plain-text messages empty (reads content only as typed blocks)")
    if reply in text or text == bare:
        raise NoLossMask(f"the chat template {name} of {owner} does not end a prompt in an open assistant turn "
                         f"(add_generation_prompt adds nothing, or the prompt holds the reply): {PROMPT_FIX}",
                         "no generation prompt")


def _check_probe_masked(tokenizer, found: LossMask, owner: str) -> None:
    """The probe chat renders and each reply falls in a span: a template that renders only lists of
    content blocks (a vision template) or puts its markers elsewhere is refused here."""
    try:
        texts, spans = render(tokenizer, found.template, [PROBE], tracked=found.tracked)
        if not found.tracked:
            spans = prefix_spans([PROBE], texts, lambda chats, p: render(tokenizer, found.template, chats, p)[0], owner)
    except NoLossMask:
        raise
    except Exception as err:  # noqa: BLE001 - the template's own error, said with its name
        raise NoLossMask(f"the chat template {found.name} of {owner} cannot render a plain text chat (it raises "
                         f"{type(err).__name__}: {str(err)[:200]}): {FIX}",
                         f"cannot render a plain-text chat ({type(err).__name__}: {str(err)[:80]})") from None
    replies = [m["content"] for m in PROBE if m["role"] == "assistant"]
    if not all(reply in texts[0] for reply in replies):
        raise NoLossMask(f"the chat template {found.name} of {owner} drops the text of plain-text messages (it reads "
                         "`content` only as a list of typed blocks, as vision-language templates do), so it would "
                         f"train on empty turns: {FIX}", "renders plain-text messages empty (reads content only as typed blocks)")
    masked = "".join(texts[0][start:end] for start, end in spans[0])
    missing = [reply for reply in replies if reply not in masked]
    if missing:
        raise NoLossMask(f"the chat template {found.name} of {owner} ({found.route}) leaves the assistant reply "
                         f"{missing[0]!r} of a probe chat outside its assistant spans: {FIX}",
                         "an assistant reply falls outside its spans")


def overlap_mask(offsets: list[tuple[int, int]], spans: list[tuple[int, int]]) -> list[int]:
    """1 for each token whose characters overlap a span (spans in order): transformers' rule."""
    mask = [0] * len(offsets)
    at = 0
    for position, (token_start, token_end) in enumerate(offsets):
        while at < len(spans) and token_start >= spans[at][1]:
            at += 1
        if at == len(spans):
            break
        if token_end > spans[at][0]:
            mask[position] = 1
    return mask

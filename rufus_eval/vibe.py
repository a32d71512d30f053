"""`rufus-eval vibe --ckpt A --ckpt B prompts.yaml`: your own handful of prompts and conversations,
answered side by side.

The "vibe test" is how SmolLM3's team found two bugs their numbers did not show: a system prompt
lost from the data, and reasoning (`/think`) switched on only in a conversation's first turn. So a
prompt here is a conversation: a string (one user turn), a mapping with `user` and an optional
`system`, or a mapping with `turns` (the user turns, in order) and an optional `system`. Each
checkpoint answers turn by turn, its own replies kept in the conversation, and every turn's reply
is shown with the reasoning mode in force at that turn: the last `/think` or `/no_think` flag of
the system prompt and the user turns so far (SmolLM3's rule). prompts.yaml may hold the list under
a `prompts:` key; catalogs/vibe_prompts.yaml is an example. The answers table goes to stdout, and
a side-by-side page (vibe_page.py) beside --out (OUT.html; vibe.html without --out)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pydantic import Field, ValidationError, model_validator
from rich.markup import escape
from rich.table import Table

from rufus_data.base.catalog_files import resolve_entry
from rufus_data.base.console import print_result
from rufus_data.base.errors import RufusError
from rufus_data.base.yaml_config import StrictModel, read_yaml
from rufus_data.models.end_tokens import end_tokens
from rufus_data.models.merged_model import plain_folder
from rufus_data.models.reference import ModelRef
from rufus_data.models.thinking import Thinking, model_thinking
from rufus_eval.vibe_page import write_vibe_page

MODE_FLAGS = ("/think", "/no_think")


class VibeConversation(StrictModel):
    system: str | None = None
    user: str | None = Field(None, description="one user turn (or `turns`)")
    turns: list[str] | None = Field(None, min_length=1, description="the user turns, in order")

    @model_validator(mode="after")
    def _one_way(self) -> VibeConversation:
        if (self.user is None) == (self.turns is None):
            raise ValueError("give `user` (one turn) or `turns` (a list of user turns), not both")
        return self

    @property
    def user_turns(self) -> list[str]:
        return self.turns if self.turns is not None else [self.user]


@dataclass
class TurnReply:
    mode: str  # the reasoning flag in force at this turn, or "-"
    prompt: str  # what the model was given: the conversation so far, rendered by its chat template
    reply: str


def load_prompts(path: Path) -> list[VibeConversation]:
    data, _ = read_yaml(path)
    items = data.get("prompts") if isinstance(data, dict) else data
    if not isinstance(items, list) or not items:
        raise RufusError(f"{path}: expected a list of prompts (strings, {{system, user}} or {{system, turns}}), "
                         "or a `prompts:` key holding one")
    prompts = []
    for index, item in enumerate(items):
        if isinstance(item, str):
            prompts.append(VibeConversation(user=item))
        elif isinstance(item, dict):
            try:
                prompts.append(VibeConversation(**item))
            except ValidationError as err:
                why = "; ".join(".".join(map(str, e["loc"])) + ": " + e["msg"] if e["loc"] else e["msg"]
                                for e in err.errors())
                raise RufusError(f"{path}: prompt {index}: {why.removeprefix('Value error, ')}") from None
        else:
            raise RufusError(f"{path}: prompt {index} must be a string or a mapping with `user` or `turns`")
    return prompts


def mode_at(messages: list[dict]) -> str:
    """The reasoning flag in force: the last /think or /no_think word of the system and user turns."""
    mode = "-"
    for message in messages:
        if message["role"] in ("system", "user"):
            for word in (message["content"] or "").split():
                if word in MODE_FLAGS:
                    mode = word
    return mode


def converse(conversation: VibeConversation, tokenizer, generate, thinking: Thinking = Thinking()) -> list[TurnReply]:
    """Each user turn in order, the model's reply (`generate(prompt_text) -> str`) kept in the
    conversation; the system prompt heads every turn's prompt, which renders in `thinking`'s mode."""
    messages = [{"role": "system", "content": conversation.system}] if conversation.system else []
    replies = []
    for user in conversation.user_turns:
        messages.append({"role": "user", "content": user})
        shown = thinking.messages(messages)
        prompt = tokenizer.apply_chat_template(shown, add_generation_prompt=True, tokenize=False,
                                               **thinking.template_kwargs())
        reply = generate(prompt)
        replies.append(TurnReply(mode_at(shown), prompt, reply))
        messages.append({"role": "assistant", "content": reply})
    return replies


def answer_all(ckpt: str, prompts: list[VibeConversation], max_tokens: int, temperature: float,
               thinking: str = "default") -> list[list[TurnReply]]:
    """Each model's replies, stopping at its end tokens (models/end_tokens.py), in the `thinking` mode."""
    import torch  # heavy: only when a model answers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = plain_folder(ModelRef.of(ckpt))
    mode = model_thinking(path, thinking)  # a mode its template cannot take: refused before the weights load
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ends = list(end_tokens(tokenizer, model.generation_config).ids)
    torch.manual_seed(0)

    def generate(prompt: str) -> str:
        ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)
        with torch.no_grad():
            out = model.generate(
                **ids, max_new_tokens=max_tokens, do_sample=temperature > 0, eos_token_id=ends,
                **({"temperature": temperature} if temperature > 0 else {}),
            )
        return tokenizer.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True).strip()

    return [converse(conversation, tokenizer, generate, mode) for conversation in prompts]


def run_vibe(prompts_file: Path, ckpts: list[str], max_tokens: int = 256, temperature: float = 0.0,
             out: Path | None = None, thinking: str = "default") -> dict[str, list[list[TurnReply]]]:
    prompts = load_prompts(resolve_entry(prompts_file))  # `catalogs/vibe_prompts.yaml` installed: the shipped one
    for ckpt in ckpts:  # every model's mode, before the first one loads: a later refusal would waste the earlier runs
        model_thinking(ckpt, thinking)
    answers = {ckpt: answer_all(ckpt, prompts, max_tokens, temperature, thinking) for ckpt in ckpts}
    table = Table(title="vibe test", show_lines=True)
    for col in ("prompt", "turn", "mode"):
        table.add_column(col)
    for ckpt in ckpts:
        table.add_column(ckpt)
    lines = ["# vibe test", ""]
    for i, conversation in enumerate(prompts):
        turns = conversation.user_turns
        if len(turns) > 1 or conversation.system:
            lines += [f"## conversation {i + 1}" + (f" (system: {conversation.system})" if conversation.system else ""), ""]
        for t, user in enumerate(turns):
            mode = answers[ckpts[0]][i][t].mode
            shown = f"[system: {conversation.system}]\n{user}" if conversation.system and t == 0 else user
            cells = [shown, f"{t + 1}/{len(turns)}", mode, *[answers[c][i][t].reply for c in ckpts]]
            table.add_row(*map(escape, cells))  # text, never markup: `[system: ...]`, a reply's brackets
            lines += [f"### turn {t + 1} ({mode}): {user}", ""]
            lines += [f"**{c}**:\n\n{answers[c][i][t].reply}\n" for c in ckpts]
    print_result(table)
    if out is not None:
        Path(out).write_text("\n".join(lines))
    shown = [f"{user} (turn {t + 1}/{len(c.user_turns)}, {answers[ckpts[0]][i][t].mode})"
             for i, c in enumerate(prompts) for t, user in enumerate(c.user_turns)]  # one card per turn
    systems = [c.system for c in prompts for _ in c.user_turns]
    replies = {ckpt: [turn.reply for conversation in answers[ckpt] for turn in conversation] for ckpt in ckpts}
    write_vibe_page(Path(out or "vibe.md").with_suffix(".html"), shown, replies, systems)
    return answers

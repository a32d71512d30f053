"""Parse a completion into reasoning, content and tool calls (the Rufus ChatML + `<tool_call>` format).

Two faces of one format: `parse_response` (ours: never raises, reports malformed tool calls) for
rewards, filters and metrics, and `add_response_schema(tokenizer)`, which gives a tokenizer using the
Rufus template the `response_template` that transformers' `tokenizer.parse_response` and TRL's tool
loop read (TRL's own `add_response_schema` only knows a fixed list of chat templates and raises on ours).
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field

from rufus_data.rewards.extract import completion_text, split_reasoning

_END_TOKENS = ("<|im_end|>", "<|endoftext|>")
_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


@dataclass
class ParsedResponse:
    reasoning: str | None
    content: str
    tool_calls: list[dict] = field(default_factory=list)  # {"name":..., "arguments": {...}}
    errors: list[str] = field(default_factory=list)  # malformed tool calls, an unclosed <think>
    reasoning_closed: bool = True

    def to_dict(self) -> dict:
        return asdict(self)


def parse_response(completion) -> ParsedResponse:
    """Never raises on model output: problems go into `errors`."""
    text = completion_text(completion)
    reasoning, rest, closed = split_reasoning(text)
    errors = [] if closed else ["unclosed <think> block"]
    tool_calls = []
    for index, match in enumerate(_TOOL_CALL.finditer(rest)):
        try:
            call = json.loads(match.group(1))
        except json.JSONDecodeError as error:
            errors.append(f"tool_call {index}: invalid JSON ({error.msg} at char {error.pos})")
            continue
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            errors.append(f"tool_call {index}: expected an object with a string 'name'")
            continue
        arguments = call.get("arguments", {})
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                errors.append(f"tool_call {index}: 'arguments' is a string that is not JSON")
                continue
        tool_calls.append({"name": call["name"], "arguments": arguments})
    if "<tool_call>" in _TOOL_CALL.sub("", rest):
        errors.append("a <tool_call> block is not closed")
    content = _TOOL_CALL.sub("", rest).strip()
    for end in _END_TOKENS:  # completions decoded with special tokens keep the end-of-turn marker
        content = content.removesuffix(end).rstrip()
    return ParsedResponse(reasoning=reasoning, content=content, tool_calls=tool_calls, errors=errors, reasoning_closed=closed)


# transformers >= 5.13 response template for rufus_data/models/templates/rufus_chatml.jinja (the same shape as the
# ChatML/Qwen3 template TRL ships): optional <think> block, content, then <tool_call>{json}</tool_call> blocks.
RUFUS_RESPONSE_TEMPLATE = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {
        "reasoning_content": {"open": "<think>", "close_pattern": r"</think>\s*", "content": "text"},
        "tool_calls": {
            "open": "<tool_call>",
            "close_pattern": r"</tool_call>\s*",
            "repeats": True,
            "content": "json",
            "transform": {"type": "function", "function": "{content}"},
        },
        "content": {"close_pattern": r"<\|im_end\|>\s*", "content": "text"},
    },
}


def add_response_schema(tokenizer):
    """Set the Rufus response template on a tokenizer (or a processor's tokenizer) and return it."""
    target = getattr(tokenizer, "tokenizer", tokenizer)
    target.response_template = RUFUS_RESPONSE_TEMPLATE
    return tokenizer


def add_response_fields(row: dict, completion_key: str = "completion") -> dict:
    """Return a copy of `row` with `reasoning`, `content`, `tool_calls`, `parse_errors` from its completion."""
    parsed = parse_response(row.get(completion_key))
    out = dict(row)
    out.update(reasoning=parsed.reasoning, content=parsed.content, tool_calls=parsed.tool_calls, parse_errors=parsed.errors)
    return out

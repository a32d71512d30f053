"""mix renders many conversations per template call (rufus_data/chat_render.py): the texts and
the `{% generation %}` spans must be transformers' own, one call per conversation, for every
kind of row; where the loop would change the output it renders one conversation at a time."""

from __future__ import annotations

import json

import pytest
from jinja2.exceptions import TemplateError

from rufus_data.chat_render import ROWS_PER_CALL, SEPARATOR, ChatRenderer, render_each
from rufus_data.tokens import TokenCounter


def rows(data_root) -> list[list[dict]]:
    """GSM8K chats with one of each other kind in the second group (system turn, reasoning, tool
    call and tool turn, empty assistant turn, no assistant turn); a separator inside a message
    in the last group, which is then rendered one conversation at a time."""
    with open(data_root / "gsm8k" / "train.jsonl") as fh:
        gsm8k = [json.loads(line) for line, _ in zip(fh, range(3 * ROWS_PER_CALL))]
    chats = [[{"role": "user", "content": r["question"]}, {"role": "assistant", "content": r["answer"]}] for r in gsm8k]
    call = {"type": "function", "function": {"name": "calculator", "arguments": '{"expression": "2 * 3"}'}}
    return [*chats[:ROWS_PER_CALL + 3],
            [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "2 + 2?"},
             {"role": "assistant", "content": "4", "reasoning_content": "\nTwo and two.\n"}],
            [{"role": "user", "content": "2 * 3?"}, {"role": "assistant", "content": "", "tool_calls": [call]},
             {"role": "tool", "content": "6"}, {"role": "assistant", "content": "6"}],
            [{"role": "user", "content": "Say nothing."}, {"role": "assistant", "content": ""}],
            [{"role": "user", "content": "Only a prompt."}],
            *chats[ROWS_PER_CALL + 3:],
            [{"role": "user", "content": f"a{SEPARATOR}b"}, {"role": "assistant", "content": "c"}]]  # a group of its own


def each(counter: TokenCounter, conversations: list[list[dict]], template: str | None = None, **kwargs):
    texts, spans = render_each(conversations, template or counter.template, True, **kwargs, **counter.template_kwargs)
    return texts, [[tuple(s) for s in row] for row in spans]


@pytest.fixture(scope="module")
def counter(tiny_model) -> TokenCounter:
    return TokenCounter(tiny_model)


# a template that also reads `thinking`, the name transformers copies `reasoning_content` to
READS_THINKING = "{% for m in messages %}{{ m['thinking'] if m['thinking'] is defined else '' }}{% endfor %}"


@pytest.mark.parametrize("prefix", ["", READS_THINKING], ids=["rufus_chatml", "reads_thinking"])
def test_batched_rendering_is_transformers_per_conversation(counter, data_root, prefix):
    conversations = rows(data_root)
    template = prefix + counter.template
    for add_generation_prompt in (False, True):
        renderer = ChatRenderer(template, True)
        got = renderer.render(conversations, add_generation_prompt=add_generation_prompt, **counter.template_kwargs)
        assert renderer.batched  # the loop renders this template as one call per conversation does
        assert got == each(counter, conversations, template, add_generation_prompt=add_generation_prompt)
    assert any(spans for spans in got[1]) and not got[1][ROWS_PER_CALL + 6]  # a prompt alone has no span
    assert ("Two and two." in got[0][ROWS_PER_CALL + 3].split("<|im_start|>")[0]) == bool(prefix)
    tools = [{"type": "function", "function": {"name": "calculator", "parameters": {"type": "object"}}}]
    renderer = ChatRenderer(template, True)
    assert renderer.render(conversations, tools=tools, **counter.template_kwargs) == each(counter, conversations,
                                                                                        template, tools=tools)


def test_a_template_the_loop_would_change_is_rendered_one_at_a_time(counter, data_root):
    """A template that reads `loop` at its top level sees the renderer's loop: the first group's
    check catches it and every row is then rendered alone, as transformers renders it."""
    template = "{{ 'outer loop' if loop is defined else 'no loop' }}\n" + counter.template
    conversations = rows(data_root)
    renderer = ChatRenderer(template, True)
    got = renderer.render(conversations, **counter.template_kwargs)
    assert renderer.batched is False and got == each(counter, conversations, template)
    assert got[0][0].startswith("no loop")


def test_a_template_error_names_the_row_at_fault(counter, data_root):
    template = "{% if messages[0]['content'] == 'Only a prompt.' %}{{ raise_exception('no answer') }}{% endif %}" + counter.template
    renderer = ChatRenderer(template, True)
    with pytest.raises(TemplateError, match="no answer"):
        renderer.render(rows(data_root), **counter.template_kwargs)
    assert renderer.batched  # the first group rendered in the loop; the failing group alone

"""mix renders many conversations per template call (rufus_data/sources/chat_render.py): the texts and
the `{% generation %}` spans must be transformers' own, one call per conversation, for every
kind of row; where the loop would change the output it renders one conversation at a time."""

from __future__ import annotations

import json

import pytest
from jinja2.exceptions import TemplateError

from rufus_data.sources.chat_render import ROWS_PER_CALL, SEPARATOR, ChatRenderer, is_plain, render_each
from rufus_data.sources.tokens import TokenCounter


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


def test_values_that_are_not_plain_go_through_transformers_copy(counter, data_root):
    """Rows of exactly the built-in JSON types render without transformers' copy into plain types;
    a value of another type (a numpy string, a tuple) sends its group through that copy, and
    both render what one call per conversation renders."""
    np = pytest.importorskip("numpy")
    conversations = rows(data_root)[:ROWS_PER_CALL]
    assert is_plain(conversations) and is_plain(counter.template_kwargs)
    odd = [[{**m, "content": np.str_(m["content"])} for m in chat] for chat in conversations]
    odd[1] = tuple(odd[1])
    assert not is_plain(odd) and not is_plain({"content": (1, 2)}) and is_plain({"a": [1, 2.5, None, True]})
    for chats in (conversations, odd):
        renderer = ChatRenderer(counter.template, True)
        assert renderer.render(chats, **counter.template_kwargs) == each(counter, conversations)
        assert renderer.batched


def test_a_shared_prefix_is_tokenized_once_and_counts_the_same(counter, data_root):
    """Every GSM8K chat opens with the template's default system turn: the counter tokenizes it once
    per batch (cut after a special token), checked on first use against the whole texts."""
    conversations = rows(data_root)[:ROWS_PER_CALL]
    rendered, spans = counter.render(conversations)
    cut = counter._shared_prefix(rendered, spans)
    assert rendered[0][:cut].endswith("<|im_start|>") and "You are a helpful AI assistant" in rendered[0][:cut]
    whole = counter._encode_from(rendered, spans, 0)
    assert counter.count_conversations(conversations) == whole and counter.prefix_checked is True
    assert counter._encode_from(rendered, spans, cut) == whole
    encodings = counter.backend.encode_batch(rendered, add_special_tokens=False)
    assert whole.total == [len(e) for e in encodings]
    assert counter._shared_prefix(rendered[:1], spans[:1]) == 0  # one text shares nothing with another


def test_without_transformers_private_helper_rows_render_one_at_a_time(counter, data_root, monkeypatch):
    """The loop uses a private transformers function (`_alias_reasoning_fields`); where a release
    renames or drops it (its import fails: simulated here for that name, transformers' own rendering
    untouched), mix still renders, one conversation at a time, instead of failing."""
    import builtins

    real_import = builtins.__import__

    def renamed_upstream(name, globals=None, locals=None, fromlist=(), level=0):
        if "_alias_reasoning_fields" in (fromlist or ()):
            raise ImportError(f"cannot import name '_alias_reasoning_fields' from '{name}'")
        return real_import(name, globals, locals, fromlist, level)

    monkeypatch.setattr(builtins, "__import__", renamed_upstream)
    conversations = rows(data_root)[:ROWS_PER_CALL + 4]
    renderer = ChatRenderer(counter.template, True)
    got = renderer.render(conversations, **counter.template_kwargs)
    assert renderer.batched is False
    assert got == each(counter, conversations)

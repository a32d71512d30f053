"""Hybrid reasoning can be probed: the system prompt and the reasoning-mode flag (/think,
/no_think) reach the rendered prompt of every turn, in `rufus-eval vibe`'s multi-turn
conversations and in `rufus-eval suite` (its `system_prompt`, on every document). Mechanics on
tiny-random: its tokenizer carries the real chat template."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import AutoTokenizer
from typer.testing import CliRunner

from rufus_data.base.errors import RufusError
from rufus_eval.cli import app
from rufus_eval.request import EvalRequest
from rufus_eval.runner import run_suite
from rufus_eval.vibe import VibeConversation, converse, load_prompts, mode_at

SYSTEM = "You are a careful assistant. /think"
PROBE = f"""prompts:
  - What is 2 + 2?
  - system: "{SYSTEM}"
    turns:
      - What is 12 * 3?
      - And 12 * 4?
      - Now 12 * 5, quickly. /no_think
"""


def test_every_turn_of_a_conversation_carries_the_system_prompt_and_its_mode(tiny_model):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    conversation = VibeConversation(system=SYSTEM, turns=["What is 12 * 3?", "And 12 * 4?", "Now 12 * 5. /no_think"])
    seen = []
    turns = converse(conversation, tokenizer, lambda prompt: seen.append(prompt) or f"reply {len(seen)}")
    assert [t.mode for t in turns] == ["/think", "/think", "/no_think"]  # the last flag so far wins
    for n, turn in enumerate(turns, start=1):
        assert turn.prompt == seen[n - 1]
        assert turn.prompt.startswith(f"<|im_start|>system\n{SYSTEM}<|im_end|>\n")  # the system prompt, every turn
        assert turn.prompt.count("/think") == 1 and turn.prompt.endswith("<|im_start|>assistant\n")
        # the model's own earlier replies are in the conversation it answers
        assert all(f"<|im_start|>assistant\nreply {k}<|im_end|>" in turn.prompt for k in range(1, n))
    assert "/no_think" in turns[2].prompt and "/no_think" not in turns[1].prompt
    assert mode_at([{"role": "user", "content": "hi"}]) == "-"


def test_vibe_shows_each_turns_reply_and_mode_per_checkpoint(tiny_model, tmp_path):
    prompts = tmp_path / "probe.yaml"
    prompts.write_text(PROBE)
    out = tmp_path / "vibe.md"
    result = CliRunner().invoke(app, ["vibe", str(prompts), "--ckpt", tiny_model, "--max-tokens", "4", "--out", str(out)])
    assert result.exit_code == 0, result.output
    text = out.read_text()
    for n, (mode, user) in enumerate([("/think", "What is 12 * 3?"), ("/think", "And 12 * 4?"),
                                      ("/no_think", "Now 12 * 5, quickly. /no_think")], start=1):
        assert f"### turn {n} ({mode}): {user}" in text
    assert "### turn 1 (-): What is 2 + 2?" in text and text.count(f"**{tiny_model}**") == 4
    for cell in ("1/3", "2/3", "3/3", "/no_think", f"[system: {SYSTEM}]"):  # shown as text, not read as markup
        assert cell in result.output


def test_vibe_refuses_a_prompt_with_both_user_and_turns(tmp_path):
    prompts = tmp_path / "bad.yaml"
    prompts.write_text("- {user: hi, turns: [hello]}\n")
    with pytest.raises(RufusError, match=r"bad.yaml: prompt 0: give `user` \(one turn\) or `turns` \(a list of user turns\), not both$"):
        load_prompts(prompts)
    assert len(load_prompts(Path(__file__).parents[1] / "catalogs" / "vibe_prompts.yaml")) >= 5


def test_suite_system_prompt_and_mode_reach_every_documents_prompt(tiny_model, tmp_path):
    data = tmp_path / "qs.jsonl"
    data.write_text("".join(json.dumps({"question": q, "answer": f"#### {a}"}) + "\n"
                            for q, a in (("What is 1 + 1?", 2), ("What is 2 + 3?", 5))))
    suite = tmp_path / "modes.yaml"
    suite.write_text(f"""name: modes
repeats: 1
sampling: {{temperature: 0.0, max_tokens: 4}}
system_prompt: "{SYSTEM}"
tasks:
  - name: sums
    kind: rufus
    role: validation
    data: {{path: {data}}}
    prompt: "{{question}}"
    gold_fields: [answer]
    scorer: {{name: string_match, extractor: last_number, gold_extractor: gsm8k, answer_column: answer}}
    metric: avg@k
""")
    record = run_suite(EvalRequest(suite=str(suite), checkpoint=tiny_model, backend="hf", out=tmp_path / "run"))
    assert record["system_prompt"] == SYSTEM
    samples = [json.loads(line) for line in Path(record["tasks"]["sums"]["samples_file"]).read_text().splitlines()]
    assert len(samples) == 2
    for sample in samples:
        rendered = sample["arguments"][0][0]  # the context lm-eval generated from: the chat template applied
        assert rendered.startswith(f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{sample['doc']['prompt']}")


def test_the_vibe_page_shows_each_cards_system_prompt_and_marks_an_empty_reply():
    from rufus_eval.vibe_page import EMPTY_REPLY, vibe_page

    page = vibe_page(["Say hello.", "And bye."], {"a": ["Ahoy!", "  "], "b": ["", "Bye."]},
                     ["You are a pirate. /no_think", None])
    assert "system: <i>You are a pirate. /no_think</i>" in page and "system: <i>(none)</i>" in page
    assert page.count(EMPTY_REPLY) == 2 and "Ahoy!" in page

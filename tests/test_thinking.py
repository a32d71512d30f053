"""Thinking modes reach each family's template the way it reads them (rufus_data/models/thinking.py):
Qwen3's `enable_thinking` keyword (TRL's qwen3.jinja) and SmolLM3's /think and /no_think system
flags, through the hf generator, a server request, eval's model classes and vibe; a mode asked of a
template with no switch is refused. The installed TRL ships no SmolLM3 template: SMOLLM3 below is
written here after how SmolLM3's template reads its flags (from the system message, stripped, the
mode in its metadata; an empty think block prefilled for /no_think)."""

from __future__ import annotations

import shutil

import pytest
from conftest import REPO

from rufus_data.base.errors import RufusError
from rufus_data.models.chat_template import trl_templates_folder
from rufus_data.models.thinking import Thinking, decide_thinking, thinking_switch

SMOLLM3 = """{%- set ns = namespace(mode="/think", system="") -%}
{%- if messages[0].role == "system" -%}
  {%- set ns.system = messages[0].content -%}
  {%- if "/no_think" in ns.system -%}{%- set ns.mode = "/no_think" -%}{%- endif -%}
  {%- set ns.system = ns.system.replace("/no_think", "").replace("/think", "").rstrip() -%}
{%- endif -%}
{{- "<|im_start|>system\\n## Metadata\\n\\nReasoning Mode: " + ns.mode + "\\n\\n## Custom Instructions\\n\\n" + ns.system + "<|im_end|>\\n" -}}
{%- for message in messages -%}
  {%- if message.role == "user" -%}{{- "<|im_start|>user\\n" + message.content + "<|im_end|>\\n" -}}
  {%- elif message.role == "assistant" -%}{{- "<|im_start|>assistant\\n" + message.content + "<|im_end|>\\n" -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
  {{- "<|im_start|>assistant\\n" -}}{%- if ns.mode == "/no_think" -%}{{- "<think>\\n\\n</think>\\n" -}}{%- endif -%}
{%- endif -%}"""
QUESTION = [{"role": "system", "content": "Be brief. /think"}, {"role": "user", "content": "What is 2 + 2?"}]
EMPTY_THINK = {"qwen3": "<think>\n\n</think>\n\n", "smollm3": "<think>\n\n</think>\n"}


def family_template(family: str) -> str:
    return SMOLLM3 if family == "smollm3" else (trl_templates_folder() / f"{family}.jinja").read_text(encoding="utf-8")


@pytest.fixture
def family_folder(tiny_model, tmp_path):
    """A copy of tiny-random whose tokenizer ships one family's chat template (a model of that family)."""
    from transformers import AutoTokenizer

    def make(family: str) -> str:
        folder = tmp_path / family
        shutil.copytree(tiny_model, folder)
        tokenizer = AutoTokenizer.from_pretrained(folder)
        tokenizer.chat_template = family_template(family)
        tokenizer.save_pretrained(folder)
        return str(folder)

    return make


def rendered(tokenizer, thinking: Thinking, messages=QUESTION) -> str:
    return tokenizer.apply_chat_template(thinking.messages(messages), tokenize=False, add_generation_prompt=True,
                                         **thinking.template_kwargs())


@pytest.mark.parametrize(("family", "switch"), [("qwen3", "enable_thinking"), ("smollm3", "system_flag"),
                                                ("glm4moe", "enable_thinking"), ("llama3", None), ("qwen2_5", None)])
def test_the_switch_is_read_from_the_template_text(family, switch):
    assert thinking_switch(family_template(family)) == switch


def test_vibe_refuses_a_mode_of_any_model_before_the_first_loads(family_folder, monkeypatch):
    """`rufus-eval vibe --ckpt A --ckpt B --thinking off`: B's template has no switch, so nothing
    answers, not even A."""
    from rufus_eval import vibe

    monkeypatch.setattr(vibe, "answer_all", lambda *a, **k: pytest.fail("a model answered"))
    with pytest.raises(RufusError, match=r"\(llama3\) has no thinking switch"):
        vibe.run_vibe(REPO / "catalogs/vibe_prompts.yaml", [family_folder("qwen3"), family_folder("llama3")],
                      thinking="off")


@pytest.mark.parametrize("family", ["qwen3", "smollm3"])
def test_each_mode_reaches_the_rendered_prompt(family, tiny_model):
    """off: the family's empty think block follows the generation prompt; on and default: it does not.
    SmolLM3's flag replaces the one the system message held, and is stripped from the instructions."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    tokenizer.chat_template = family_template(family)
    prompts = {mode: rendered(tokenizer, decide_thinking(tokenizer.chat_template, mode, family))
               for mode in ("on", "off", "default")}
    assert prompts["off"].endswith("<|im_start|>assistant\n" + EMPTY_THINK[family])
    assert prompts["on"].endswith("<|im_start|>assistant\n") and prompts["default"].endswith("<|im_start|>assistant\n")
    if family == "smollm3":
        assert "Reasoning Mode: /no_think" in prompts["off"] and "Reasoning Mode: /think" in prompts["on"]
        assert "Custom Instructions\n\nBe brief.<|im_end|>" in prompts["off"]
        without_system = rendered(tokenizer, Thinking("off", "system_flag"), QUESTION[1:])
        assert "Reasoning Mode: /no_think" in without_system
    else:
        assert "Be brief. /think" in prompts["off"]  # Qwen3's switch is the keyword: the messages are left alone


def test_a_mode_is_refused_where_the_template_has_no_switch(tiny_model, family_folder):
    from rufus_data.models.thinking import model_thinking

    folder = family_folder("llama3")
    with pytest.raises(RufusError, match=r"thinking: off.*\(llama3\) has no thinking switch.*thinking: default"):
        model_thinking(folder, "off")
    assert model_thinking(folder, "default") == Thinking()
    with pytest.raises(RufusError, match="thinking 'maybe' is not a mode"):
        decide_thinking(family_template("qwen3"), "maybe", "model x")


def test_filter_refuses_a_mode_before_generating(family_folder, tmp_path, monkeypatch):
    """`rufus-data filter --thinking off` with a model whose template has no switch stops before
    any generator opens."""
    from rufus_data.generate import backends
    from rufus_data.rollouts import filter as filter_step
    from rufus_data.rollouts.options import FilterConfig

    monkeypatch.setattr(backends, "HFGenerator", lambda *a, **k: pytest.fail("a generator opened"))
    monkeypatch.setattr(filter_step, "input_folders", lambda *a, **k: pytest.fail("the inputs were read"))
    config = FilterConfig(policy=family_folder("llama3"), backend="hf", reward=["string_match:gsm8k"], thinking="off")
    with pytest.raises(RufusError, match="has no thinking switch"):
        filter_step.filter_prompts([str(tmp_path)], tmp_path / "out", config)
    assert FilterConfig(policy="x", backend="hf", thinking="off").rollout_hash([]) != \
        FilterConfig(policy="x", backend="hf").rollout_hash([])


@pytest.mark.parametrize("family", ["qwen3", "smollm3"])
def test_generators_render_the_mode(family, family_folder):
    """The hf backend's prompt tokens, and a server request (vLLM's chat_template_kwargs, or the flag
    in the system message), carry the switch."""
    from transformers import AutoTokenizer

    from rufus_data.generate.backend_config import ModelAccess
    from rufus_data.generate.backends import generator_thinking
    from rufus_data.generate.base import Prompt
    from rufus_data.generate.hf import HFGenerator
    from rufus_data.generate.sampling import SamplingParams
    from rufus_data.generate.server import ServerConfig, ServerGenerator
    from rufus_data.models.reference import ModelRef

    folder = family_folder(family)
    thinking = generator_thinking(ModelRef.of(folder), ModelAccess(backend="hf"), "off")
    generator = HFGenerator(ModelRef.of(folder), thinking=thinking)
    text = AutoTokenizer.from_pretrained(folder).decode(generator.prompt_ids(Prompt("p", QUESTION)))
    assert text.endswith(EMPTY_THINK[family])
    server = ServerGenerator(ServerConfig(base_urls=["http://127.0.0.1:9"], model="m", thinking=thinking))
    body = server.request_body(Prompt("p", QUESTION), SamplingParams())
    if family == "qwen3":
        assert body["chat_template_kwargs"] == {"enable_thinking": False} and body["messages"] == QUESTION
    else:
        assert "chat_template_kwargs" not in body and body["messages"][0]["content"] == "Be brief. /no_think"


def test_a_suites_mode_is_refused_in_its_dry_run(family_folder, tmp_path, monkeypatch):
    """`rufus-eval suite` with `thinking: off` and a model whose template has no switch: exit 2 in
    --dry-run, before a run folder exists."""
    from typer.testing import CliRunner

    from rufus_eval.cli import app

    monkeypatch.chdir(tmp_path)
    suite = tmp_path / "quiet.yaml"
    suite.write_text((REPO / "catalogs/suites/quick.yaml").read_text().replace("system_prompt: null",
                                                                             "system_prompt: null\nthinking: off"))
    args = ["suite", str(suite), "--ckpt", family_folder("llama3"), "--backend", "hf"]
    result = CliRunner().invoke(app, [*args, "--dry-run"])
    assert result.exit_code == 2 and "has no thinking switch" in " ".join(result.output.split()), result.output
    assert not (tmp_path / "outputs").exists()
    assert CliRunner().invoke(app, ["suite", str(suite), "--ckpt", family_folder("qwen3"), "--backend", "hf",
                                    "--dry-run"]).exit_code == 0


@pytest.mark.parametrize("family", ["qwen3", "smollm3"])
def test_eval_and_vibe_render_the_mode(family, family_folder):
    """An eval suite's `thinking: off` (eval's model classes get the keywords, the system prompt
    its flag) and vibe's converse render the family's switch."""
    from transformers import AutoTokenizer

    from rufus_data.benchmarks.suite import Suite
    from rufus_data.generate.backend_config import ModelAccess
    from rufus_eval.lm_eval_models import SeededCompletionsAPI, model_chat
    from rufus_eval.vibe import VibeConversation, converse

    folder = family_folder(family)
    suite = Suite(name="s", thinking="off", system_prompt="Be brief.", tasks=[])
    thinking, ends = model_chat(folder, ModelAccess(backend="hf"), suite.thinking)
    system = thinking.system_instruction(suite.system_prompt)
    assert "<|im_end|>" in ends.strings  # the end tokens eval stops at: tiny-random's eos
    assert system == ("Be brief." if family == "qwen3" else "Be brief. /no_think")
    api = SeededCompletionsAPI.__new__(SeededCompletionsAPI)  # only its chat rendering, no server
    api.tokenizer, api.tokenizer_backend, api.tokenized_requests = AutoTokenizer.from_pretrained(folder), "huggingface", True
    api.chat_template_args = thinking.template_kwargs()
    prompt = api.apply_chat_template([{"role": "system", "content": system}, QUESTION[1]])
    assert prompt.endswith(EMPTY_THINK[family])
    [reply] = converse(VibeConversation(system="Be brief.", user="Hi"), api.tokenizer, lambda text: "ok", thinking)
    assert reply.prompt.endswith(EMPTY_THINK[family])
    assert reply.mode == ("-" if family == "qwen3" else "/no_think")


REASONING = [
    [{"role": "user", "content": "What is 2 + 2?"},
     {"role": "assistant", "content": "<think>\nTwo plus two makes four.\n</think>\n\n4"}],
    [{"role": "system", "content": "Be brief. /think"}, {"role": "user", "content": "Hi"},
     {"role": "assistant", "content": "<think>\nA greeting.\n</think>\n\nHello"},
     {"role": "user", "content": "Bye"}, {"role": "assistant", "content": "<think>\nA farewell.\n</think>\n\nGoodbye"}],
]


@pytest.mark.parametrize(("family", "route"), [("qwen3", "trl_training_template"), ("smollm3", "prefixes")])
def test_the_mask_of_a_reasoning_trace_is_what_the_family_trains(family, route, tiny_model):
    """A reasoning trace (<think>...</think> in the assistant turn): Qwen3's mask, token for token,
    the one TRL's SFTTrainer trains with (its qwen3 training template, which keeps only the last
    query's reasoning); SmolLM3's (a template TRL does not know, so SFTTrainer cannot mask it) Open
    Instruct's turn-by-turn mask. The last turn's trace carries loss in both."""
    from test_chat_templates import trl_trains, turn_by_turn
    from transformers import AutoTokenizer

    from rufus_data.sources.tokens import TokenCounter

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    tokenizer.chat_template = family_template(family)
    counter = TokenCounter(tokenizer)
    assert counter.loss.route == route
    masks = counter.token_masks(REASONING)
    expected = [(trl_trains if route != "prefixes" else turn_by_turn)(tokenizer, chat) for chat in REASONING]
    assert [(list(ids), list(mask)) for ids, mask in masks] == [(list(ids), list(mask)) for ids, mask in expected]
    for (ids, mask), trace in zip(masks, ["Two plus two makes four.", "A farewell."], strict=True):
        trained = tokenizer.decode([token for token, bit in zip(ids, mask, strict=True) if bit])
        assert f"<think>\n{trace}\n</think>" in trained

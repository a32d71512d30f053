"""Generation stops where the family stops (rufus_data/models/end_tokens.py): a model folder whose
generation_config.json lists an end token beside the tokenizer's eos (as Llama 3 lists
`<|eot_id|>`; here, on tiny-random with TRL's llama3 template, a token the model is known to
generate greedily) stops there in the hf backend and lm-eval's hf model, and the token goes to a
vLLM server as `stop_token_ids` and to lm-eval's requests as `until` and `stop_token_ids`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from rufus_data.generate.base import Prompt
from rufus_data.generate.sampling import SamplingParams
from rufus_data.models.chat_template import trl_templates_folder
from rufus_data.models.end_tokens import end_tokens, folder_end_tokens
from rufus_data.models.reference import ModelRef

QUESTION = Prompt("q", [{"role": "user", "content": "Count to ten."}])
SAMPLED = SamplingParams(n=1, temperature=1.0, max_tokens=10, seed=0)  # tiny-random's greedy answer repeats one token


def with_end_token(plain: Path, token_id: int, name: str) -> Path:
    """A copy of `plain` whose generation_config.json lists `token_id` beside the tokenizer's eos."""
    from transformers import AutoTokenizer

    listed = plain.parent / name
    shutil.copytree(plain, listed)
    config_path = listed / "generation_config.json"
    config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    config["eos_token_id"] = [AutoTokenizer.from_pretrained(plain).eos_token_id, token_id]
    config_path.write_text(json.dumps(config))
    return listed


@pytest.fixture(scope="module")
def llama3_like(tiny_model, tmp_path_factory):
    """(folder without an end-token list, folder with one, the sampled tokens of the first, where the second stops)."""
    from transformers import AutoTokenizer

    from rufus_data.generate.hf import HFGenerator

    plain = tmp_path_factory.mktemp("llama3") / "plain"
    shutil.copytree(tiny_model, plain)
    tokenizer = AutoTokenizer.from_pretrained(plain)
    tokenizer.chat_template = (trl_templates_folder() / "llama3.jinja").read_text(encoding="utf-8")
    tokenizer.save_pretrained(plain)
    [result] = HFGenerator(ModelRef.of(str(plain))).generate([QUESTION], SAMPLED)
    tokens = result.completions[0].token_ids
    assert len(tokens) == SAMPLED.max_tokens, "the plain folder must run to max_tokens for the test to mean anything"
    stop = next(i for i in range(2, len(tokens)) if tokens[i] not in tokens[:i])
    return plain, with_end_token(plain, tokens[stop], "listed"), tokens, stop


def test_end_tokens_are_the_config_list_and_the_tokenizer_eos(llama3_like):
    from transformers import AutoTokenizer, GenerationConfig

    plain, listed, tokens, stop = llama3_like
    tokenizer = AutoTokenizer.from_pretrained(listed)
    ends = folder_end_tokens(listed)
    assert ends.ids == tuple(sorted({tokenizer.eos_token_id, tokens[stop]}))
    assert ends.strings == tuple(tokenizer.decode([i]) for i in ends.ids) and tokenizer.eos_token in ends.strings
    assert folder_end_tokens(plain).ids == (tokenizer.eos_token_id,)
    assert end_tokens(tokenizer, GenerationConfig(eos_token_id=7)).ids == tuple(sorted({7, tokenizer.eos_token_id}))


def test_hf_backend_stops_at_a_listed_end_token(llama3_like):
    from rufus_data.generate.hf import HFGenerator

    _, listed, tokens, stop = llama3_like
    [result] = HFGenerator(ModelRef.of(str(listed))).generate([QUESTION], SAMPLED)
    completion = result.completions[0]
    assert completion.token_ids == tokens[:stop] and completion.finish_reason == "stop"


def test_lm_eval_hf_model_stops_at_a_listed_end_token(llama3_like):
    """rufus-hf, made with open_backend's arguments from model_chat, stops at the end token (here
    the first token of its greedy answer: nothing is answered); without it the answer runs on."""
    from lm_eval.api.instance import Instance
    from transformers import AutoTokenizer

    from rufus_data.generate.backend_config import ModelAccess
    from rufus_eval.lm_eval_models import SeededHFLM, model_chat, open_backend

    plain = llama3_like[0]
    tokenizer = AutoTokenizer.from_pretrained(plain)
    context = tokenizer.apply_chat_template(QUESTION.messages, tokenize=False, add_generation_prompt=True)
    ids = tokenizer(context, return_tensors="pt", add_special_tokens=False)

    def answer(folder: Path) -> str:
        access = ModelAccess(backend="hf")
        thinking, ends = model_chat(str(folder), access, "default")
        with open_backend(str(folder), access, batch_size=1, thinking=thinking, ends=ends) as (_, args, _facts):
            lm = SeededHFLM(**args)
        request = Instance("generate_until", {}, (context, {"until": [], "do_sample": False, "max_gen_toks": 10}), 0,
                           metadata=("t", 0, 1))
        return lm.generate_until([request])[0], lm

    runs_on, lm = answer(plain)
    first = int(lm.model.generate(**ids, max_new_tokens=1, do_sample=False)[0, -1])
    assert runs_on  # tiny-random greedily answers newlines
    assert answer(with_end_token(plain, first, "greedy_listed"))[0] == ""


def test_server_requests_carry_the_end_tokens(llama3_like, monkeypatch):
    """vLLM's sampling fields: the generate package's request body, and lm-eval's completions model
    (its task's own stop strings kept)."""
    from lm_eval.api.instance import Instance
    from lm_eval.models.openai_completions import LocalCompletionsAPI

    from rufus_data.generate.server import ServerConfig, ServerGenerator
    from rufus_eval.lm_eval_models import SeededCompletionsAPI

    listed = llama3_like[1]
    ends = folder_end_tokens(listed)
    server = ServerGenerator(ServerConfig(base_urls=["http://127.0.0.1:9"], model="m", stop_token_ids=ends.ids))
    assert server.request_body(QUESTION, SAMPLED)["stop_token_ids"] == list(ends.ids)
    sent = []
    monkeypatch.setattr(LocalCompletionsAPI, "generate_until", lambda self, requests, disable_tqdm=False: sent.extend(requests))
    api = SeededCompletionsAPI.__new__(SeededCompletionsAPI)  # only its request rewriting, no server
    api._seed, api.end_strings, api.stop_token_ids = 0, list(ends.strings), list(ends.ids)
    api.generate_until([Instance("generate_until", {}, ("Q:", {"until": ["\n\n"]}), 0, metadata=("t", 0, 1))])
    [request] = sent
    assert request.args[1]["until"] == ["\n\n", *ends.strings] and request.args[1]["stop_token_ids"] == list(ends.ids)


def test_vllm_backend_sends_the_folder_end_tokens(llama3_like, monkeypatch):
    """The vllm backend (a server Rufus starts for a folder) asks for the folder's end tokens."""
    import contextlib
    import types

    from rufus_data.generate import backends
    from rufus_data.generate.backend_config import ModelAccess

    listed = llama3_like[1]
    started = types.SimpleNamespace(base_url="http://127.0.0.1:9", model="m")
    monkeypatch.setattr(backends, "launch", lambda *a, **k: contextlib.nullcontext(started))
    with backends.open_generator(ModelRef.of(str(listed)), ModelAccess(backend="vllm")) as generator:
        body = generator.request_body(QUESTION, SAMPLED)
    assert body["stop_token_ids"] == list(folder_end_tokens(listed).ids) and len(body["stop_token_ids"]) == 2

"""Async GRPO drops nothing: TRL's AsyncGRPOConfig is built (on CPU: it needs no CUDA) from every
GRPO stage's YAML with overrides and compared field by field with what the YAML and the overrides
say; the reward weights reach the rollout worker's sum; what the async trainer has no field for is
refused by name; `token_budget` must hold the longest tokenized prompt plus the completion."""

from __future__ import annotations

import asyncio
import dataclasses
import pickle
import threading
import time

import pyarrow as pa
import pytest
from trl.experimental.async_grpo import AsyncGRPOConfig

from rufus_data.base.errors import RufusError
from rufus_data.base.ports import free_port
from rufus_train import guards, modeling
from rufus_train.config_loading import load_stage_config
from rufus_train.grpo import async_checks, length_checks
from rufus_train.grpo.async_config import async_config, weighted_rewards
from rufus_train.stages import all_stages, get_stage

GRPO_STAGES = sorted(name for name, stage in all_stages().items() if hasattr(stage.config_class, "server_url"))
# What a user sets, top-level keys and `trainer:` keys, each away from both TRL's and Rufus's defaults.
OVERRIDES = {
    "learning_rate": 2e-5, "max_steps": 7, "per_device_train_batch_size": 4, "gradient_accumulation_steps": 2,
    "seed": 3, "save_steps": 5, "logging_steps": 2, "gradient_checkpointing": False, "num_train_epochs": 2.0,
    "num_generations": 4, "max_completion_length": 96, "temperature": 0.7, "epsilon": 0.1, "epsilon_high": 0.28,
    "max_tool_calling_iterations": 3, "vllm_server": "http://127.0.0.1:8123",
    "token_budget": 4096, "max_staleness": 2, "weight_sync_steps": 3, "max_inflight_tasks": 16, "queue_maxsize": 64,
    "request_timeout": 90, "weight_sync_timeout": 100, "heartbeat_stale_after_s": 50.0, "fork_threshold_tokens": 256,
    "trainer.top_p": 0.9, "trainer.top_k": 20, "trainer.min_p": 0.05, "trainer.repetition_penalty": 1.1,
    "trainer.warmup_steps": 2, "trainer.log_completions": True, "trainer.vllm_server_timeout": 30.0,
}
# what a stage's YAML leaves for the user to give
REQUIRED = {"search_agent": {"search_corpus": "corpus.jsonl"}}
# the YAML key -> the AsyncGRPOConfig field it must reach, where the names differ
RENAMED = {"vllm_server": "vllm_server_base_url", "gradient_checkpointing": "activation_checkpointing"}


def async_stage(name: str, **overrides):
    return load_stage_config(name, get_stage(name).config_class,
                             overrides={"grpo_execution": "async", **OVERRIDES, **REQUIRED.get(name, {}), **overrides})


@pytest.mark.parametrize("name", GRPO_STAGES)
def test_async_config_matches_the_yaml_field_by_field(name, tmp_path):
    config = async_stage(name, output_dir=str(tmp_path / name))
    args = async_config(config)
    assert isinstance(args, AsyncGRPOConfig)
    fields = {f.name for f in dataclasses.fields(AsyncGRPOConfig)}
    compared = {}
    for key, value in OVERRIDES.items():
        field = RENAMED.get(key, key.removeprefix("trainer."))
        assert field in fields, f"{key} has no AsyncGRPOConfig field {field}"
        compared[field] = (getattr(args, field), value)
    # and what the stage YAML itself says (not overridden above)
    compared["output_dir"] = (args.output_dir, str(tmp_path / name))
    compared["report_to"] = (args.report_to, [])  # report_to: [none]
    compared["dtype"] = (args.dtype, "float32")  # fp32 weights on CPU (Rufus's precision), TRL's default too
    compared["bf16"] = (args.bf16, False)
    wrong = {field: pair for field, pair in compared.items() if pair[0] != pair[1]}
    assert not wrong, f"{name}: AsyncGRPOConfig differs from the YAML (got, want): {wrong}"
    assert len(compared) == len(OVERRIDES) + 4


def test_async_full_fine_tuning_keeps_fp32_masters_on_a_bf16_gpu(monkeypatch, tmp_path):
    """`dtype: auto` on a native-bf16 GPU (the capability check forced, as tests/test_train_precision.py
    does): full fine-tuning loads fp32 weights under bf16 autocast, as every other stage trains; LoRA
    keeps its frozen base in bf16; pure bf16 only by name, with the playbook's warning."""
    monkeypatch.setattr(modeling, "gpu_kind", lambda: "bf16")
    out = {"output_dir": str(tmp_path)}
    full = async_stage("reasoning_rl", **out, **{"lora.enabled": False})
    args = async_config(full)
    assert (full.dtype, args.dtype, args.bf16, args.fp16) == ("auto", "float32", True, False)
    lora = async_config(async_stage("reasoning_rl", **out, **{"lora.enabled": True}))
    assert (lora.dtype, lora.bf16) == ("bfloat16", True)
    pure = async_stage("reasoning_rl", dtype="bfloat16", **out, **{"lora.enabled": False})
    assert (async_config(pure).dtype, async_config(pure).bf16) == ("bfloat16", True)
    with pytest.warns(UserWarning, match="pure bf16"):
        guards.check_precision(pure)


def test_every_async_stage_key_and_sync_only_setting_is_accounted_for():
    """The stage keys Rufus passes to TRL, run through the async path, either reach a field or are
    refused: a stage setting that is neither would be dropped silently."""
    config = async_stage("reasoning_rl", beta=0.04, num_iterations=2, adv_norm="centered", kl_estimator="k2",
                         **{"trainer.loss_type": "dapo", "trainer.mask_truncated_completions": True})
    problems = async_checks.async_problems(config, environ={})
    for setting in ("beta: 0.04", "num_iterations: 2", "adv_norm: 'centered'", "kl_estimator: 'k2'",
                    "trainer.loss_type: 'dapo'", "trainer.mask_truncated_completions: True"):
        assert sum(p.startswith(f"(trl) {setting}:") for p in problems) == 1, (setting, problems)
    quiet = async_checks.async_problems(async_stage("reasoning_rl"), environ={})
    assert not any("AsyncGRPOConfig has no such field" in p for p in quiet)  # defaults (beta 0, ...) are not refused
    with pytest.raises(RufusError, match=r"beta: 0\.04: TRL's AsyncGRPOConfig has no such field and it has no KL term"):
        async_checks.validate_async_args(config, environ={})


def test_reward_weights_reach_the_async_sum(tiny_tokenizer):
    config = async_stage("reasoning_rl", rewards=[
        {"name": "string_match", "extractor": "last_number", "answer_column": "expected_output", "weight": 0.5},
    ])
    plain = get_stage("reasoning_rl").reward_funcs(config)
    funcs = weighted_rewards(plain, config.reward_weights())
    assert config.reward_weights() == [0.5, 1.0]  # and the overlong penalty the stage adds, weight 1
    completions = [[{"role": "assistant", "content": "The answer is 4"}], [{"role": "assistant", "content": "5"}]]
    kwargs = {"prompts": [[{"role": "user", "content": "2+2?"}]] * 2, "completions": completions,
              "completion_ids": [[1, 2], [3]], "expected_output": ["4", "4"]}
    assert plain[0](**kwargs) == [1.0, 0.0] and funcs[0](**kwargs) == [0.5, 0.0]  # times its weight
    assert funcs[0].__name__ == getattr(plain[0], "__name__", type(plain[0]).__name__)  # TRL logs it by name
    assert funcs[1] is plain[1]  # weight 1: the function itself
    assert pickle.loads(pickle.dumps(funcs[0]))(**kwargs) == [0.5, 0.0]  # the rollout worker is spawned

    async def judge(**kwargs):
        return [1.0, None]

    (weighted,) = weighted_rewards([judge], [2.0])
    assert asyncio.run(weighted(**kwargs)) == [2.0, None]  # async stays async; None stays None


def test_reward_model_weight_without_a_reward_model_is_refused():
    with pytest.raises(RufusError, match=r"reward_model_weight \(0\.5\) is set but no reward_model is"):
        async_stage("rlhf", reward_model_weight=0.5)


def test_token_budget_must_hold_the_longest_prompt_plus_the_completion(openai_stub, tiny_tokenizer, tmp_path):
    server = openai_stub(models=["tiny"], max_model_len=4096).base_url
    rows = pa.table({"prompt": ["What is 2 + 2? " * 20, "Hi"], "expected_output": ["4", "0"]})
    config = async_stage("reasoning_rl", vllm_server=server, token_budget=100, max_completion_length=64,
                         output_dir=str(tmp_path))
    with pytest.raises(RufusError, match=r"token_budget \(100\) is below the longest prompt \(\d+ tokens\) plus "
                                         r"max_completion_length \(64\)"):
        get_stage("reasoning_rl").build_dataset(config, rows, tiny_tokenizer)
    fits = async_stage("reasoning_rl", vllm_server=server, token_budget=2048, max_completion_length=64,
                       output_dir=str(tmp_path))
    assert len(get_stage("reasoning_rl").build_dataset(fits, rows, tiny_tokenizer)) == 2


# ------------------------------------------------------------------ the server, before async GRPO starts


def test_async_grpo_waits_for_its_server_then_runs_both_length_checks(openai_stub, tiny_tokenizer, tmp_path):
    """A server still starting (it comes up 5 s after the check begins) is waited for, within
    trainer.vllm_server_timeout; then max_completion_length is checked against its max_model_len
    before anything loads, and the longest tokenized prompt plus max_completion_length after."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    late = threading.Timer(5.0, lambda: openai_stub(models=["tiny"], max_model_len=256, port=port))
    late.start()
    config = async_stage("reasoning_rl", vllm_server=url, max_completion_length=200, output_dir=str(tmp_path),
                         **{"trainer.vllm_server_timeout": 30.0})
    started = time.monotonic()
    limit, where = length_checks.context_limit(config, check=True)
    late.join()
    assert (limit, where) == (256, f"the vLLM server's max_model_len at {url}") and time.monotonic() - started >= 4.5
    with pytest.raises(RufusError, match=r"max_completion_length \(256\) >= the server's max_model_len \(256\)"):
        length_checks.context_limit(config.model_copy(update={"max_completion_length": 256}), check=True)
    rows = pa.table({"prompt": ["What is 2 + 2? " * 20, "Hi"], "expected_output": ["4", "0"]})
    with pytest.raises(RufusError, match=r"the longest prompt \(\d+ tokens\) plus max_completion_length \(200\) is "
                                         rf"\d+ tokens, more than the vLLM server's max_model_len at {url} \(256\)"):
        get_stage("reasoning_rl").build_dataset(config, rows, tiny_tokenizer)


def test_async_grpo_stops_when_its_server_never_answers(openai_stub, tiny_tokenizer, tmp_path):
    """No server within the wait: the run stops, naming the URL and the checks that could not run,
    instead of starting blind; a server without max_model_len (not vLLM) is refused the same way."""
    url = f"http://127.0.0.1:{free_port()}"
    config = async_stage("reasoning_rl", vllm_server=url, output_dir=str(tmp_path),
                         **{"trainer.vllm_server_timeout": 2.0})
    started = time.monotonic()
    with pytest.raises(RufusError) as refused:
        length_checks.context_limit(config, check=True)
    assert time.monotonic() - started < 10  # bounded by the wait
    message = str(refused.value)
    assert f"the vLLM server at {url} did not answer GET {url}/v1/models within 2 s" in message
    assert "these checks could not run: max_completion_length against the server's max_model_len" in message
    assert "the longest prompt plus max_completion_length" in message and "trainer.vllm_server_timeout" in message
    rows = pa.table({"prompt": ["Hi"], "expected_output": ["0"]})
    with pytest.raises(RufusError, match=r"these checks could not run: the longest prompt plus max_completion_length"):
        get_stage("reasoning_rl").build_dataset(config, rows, tiny_tokenizer)
    not_vllm = openai_stub(models=["tiny"]).base_url  # answers, reports no max_model_len
    with pytest.raises(RufusError, match=r"answered GET .*/v1/models without a max_model_len \(not a vLLM server\?\)"):
        length_checks.context_limit(config.model_copy(update={"vllm_server": not_vllm}), check=True)


# ------------------------------------------------------------------ the server's context-length 400, mid-run


def test_the_rollout_workers_death_on_a_context_length_400_names_the_numbers(openai_stub, tiny_tokenizer,
                                                                            monkeypatch):
    """TRL's own rollout loop (in this process; TRL spawns it) against a stand-in vLLM on loopback that
    answers every completion with vLLM's context-length 400: the loop retries and dies, TRL's health
    check raises "Rollout worker child has failed", and what the user sees instead names the longest
    prompt, max_completion_length and the server's max_model_len."""
    import multiprocessing
    import queue

    from accelerate.state import PartialState
    from datasets import Dataset
    from openai_stub import Reply
    from trl.experimental.async_grpo.async_rollout_worker import AsyncRolloutWorker, _AsyncRolloutLoop

    from rufus_train.grpo.rollout_failures import context_length_explained, explain_context_400
    from rufus_train.grpo.tools import enable_tool_parsing

    too_long = ("This model's maximum context length is 256 tokens. However, you requested 300 tokens (100 in the "
                "messages, 200 in the completion). Please reduce the length of the messages or completion.")
    server = openai_stub(lambda request: Reply(status=400, error=too_long), models=["tiny"], max_model_len=256)
    real_sleep = asyncio.sleep
    monkeypatch.setattr(asyncio, "sleep", lambda seconds, *a: real_sleep(0))  # TRL's backoff, minutes of it
    failed, info = threading.Event(), queue.Queue(maxsize=1)
    PartialState()  # as TRL's child process starts
    loop = _AsyncRolloutLoop(
        model_name="tiny", dataset=Dataset.from_dict({"prompt": [[{"role": "user", "content": "What is 2 + 2?"}]]}),
        reward_funcs=[lambda completions, **kw: [1.0] * len(completions)],
        processing_class=enable_tool_parsing(tiny_tokenizer) or tiny_tokenizer,
        eos_token_ids=[tiny_tokenizer.eos_token_id], rollout_buffer=queue.Queue(),
        model_version_value=multiprocessing.Value("i", 0), heartbeat_value=multiprocessing.Value("d", 0.0),
        failed_event=failed, exception_info_queue=info, metrics_queue=queue.Queue(), num_generations=2,
        max_inflight_tasks=1, vllm_server_url=server.base_url, max_tokens=200, request_timeout=10,
    )
    with pytest.raises(Exception, match="400"):
        loop.run()
    assert failed.is_set() and len(server.requests) == 90  # 30 attempts of 3 posts, as TRL 1.16 retries
    worker = object.__new__(AsyncRolloutWorker)  # the trainer's side: its health check reads what the loop left
    worker._failed_event, worker._exception_info_queue = failed, info
    with pytest.raises(RufusError) as explained, context_length_explained(server.base_url, lambda: 100, 200, 2):
        worker.check_health(stale_after_s=300)
    message = str(explained.value)
    assert isinstance(explained.value.__cause__, RuntimeError)
    assert "Rollout worker child has failed" in str(explained.value.__cause__)  # what TRL said
    assert f"HTTP 400 ({server.base_url}/v1/completions)" in message
    assert ("the longest prompt of the data is 100 tokens, max_completion_length is 200 (300 in all), and the "
            "server's max_model_len is 256") in message
    assert "restarted with a smaller --max-model-len" in message and "rufus-train serve --max-model-len N" in message
    grew = explain_context_400(f"{server.base_url}/v1/completions", server.base_url, 20, 200, 2)
    assert "20 tokens" in str(grew) and "a later turn's prompt grew past it" in str(grew)
    assert "(up to max_tool_calling_iterations: 2)" in str(grew)
    # any other failure passes as it is
    with pytest.raises(RuntimeError, match="heartbeat stale"), context_length_explained(server.base_url, lambda: 100,
                                                                                      200, 2):
        raise RuntimeError("Rollout worker heartbeat stale: 400s > 300s; child is hung.")

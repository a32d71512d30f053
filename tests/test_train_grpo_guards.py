"""Every GRPO guard message, the async path up to the CUDA boundary, the serve command, the
tools and the dynamic-sampling building blocks. Nothing here loads the model."""

from __future__ import annotations

import contextlib
import json
import pickle
import warnings
from typing import get_args

import duckdb
import pyarrow as pa
import pytest
import torch
from conftest import REPO
from trl import GRPOConfig
from typer.testing import CliRunner

from rufus_data.base.errors import RufusError
from rufus_data.models.devices import DeviceRoles
from rufus_data.rewards import AGGREGATIONS, build_rewards, combine_rewards, teaches_nothing
from rufus_data.rollouts.filter import FilterConfig, bucket_prompts
from rufus_train import serve
from rufus_train.cli import app
from rufus_train.config_loading import load_stage_config
from rufus_train.grpo import async_checks, length_checks, rollout_state
from rufus_train.grpo.async_config import async_config
from rufus_train.grpo.dynamic_sampling import (
    ResampleStream,
    dead_groups,
    dynamic_sampling_problems,
    mask_warnings,
)
from rufus_train.grpo.search_index import SearchIndex, build_index
from rufus_train.grpo.stage import check_reward_model
from rufus_train.grpo.tools import (
    TOOLS,
    CodingEnvironment,
    SearchEnvironment,
    calculator,
    enable_tool_parsing,
    run_python,
    search_environment_factory,
)
from rufus_train.stages import get_stage


def grpo_config(stage="reasoning_rl", **overrides):
    return load_stage_config(stage, get_stage(stage).config_class, overrides=overrides)


# ------------------------------------------------------------------ async GRPO


def test_async_refuses_everything_it_cannot_run_one_message_each(tmp_path):
    accelerate = tmp_path / "ds.yaml"
    accelerate.write_text("distributed_type: DEEPSPEED\nnum_processes: 2\n")
    config = grpo_config(
        grpo_execution="async", dynamic_sampling="resample", accelerate_config=str(accelerate),
        reward_model="smollm2-135m", trainer={"eval_strategy": "steps", "use_liger_kernel": True},
    )
    problems = async_checks.async_problems(config, environ={})
    text = "\n".join(problems)
    assert not torch.cuda.is_available()
    for needle in ("no CUDA GPU", "vllm is not importable", "`kernels` package", "DeepSpeed", "evaluation during training",
                   "dynamic_sampling: resample", "use_liger_kernel", "reward_model smollm2-135m"):
        assert sum(needle in p for p in problems) == 1, (needle, text)
    assert all(p.startswith(("(trl)", "(rufus)")) for p in problems)  # each says where its rule comes from
    with pytest.raises(RufusError, match=r"grpo_execution: async cannot run this reasoning_rl config \(\d+ problems\)"):
        async_checks.validate_async_args(config, environ={})


def test_a_token_budget_under_two_completions_warns_with_the_measured_throughput():
    """The seed measured it: token_budget 4096 with 2048-token completions trained 7 groups in 12
    steps, null (16384) 11. A warning at config check, before the refusals; null or room for two
    completions a row says nothing."""
    config = grpo_config(grpo_execution="async", token_budget=4096, max_completion_length=2048)
    with pytest.warns(UserWarning, match=r"token_budget 4096 holds one completion of max_completion_length 2048 .*"
                      r"throughput, not correctness.*7 groups in 12 steps.*16384 and token_budget null.*trained 11.*"
                      r"above 4096 \(two completions a row\)") as caught, contextlib.suppress(RufusError):
        async_checks.validate_async_args(config, environ={})  # warned first; without a GPU the refusal follows
    assert len([w for w in caught if "holds one completion" in str(w.message)]) == 1
    for budget, length in ((None, 2048), (4096, 1024), (16384, 4096), (0, 2048)):
        quiet = grpo_config(grpo_execution="async", token_budget=budget, max_completion_length=length)
        assert async_checks.token_budget_warning(quiet) is None, (budget, length)


def test_prefetch_names_what_it_needs_before_fetching(monkeypatch):
    """`rufus-train prefetch` fetches async GRPO's attention kernel for offline GPU machines; without
    the `kernels` package (as here) it says how to install it (the gpu extra, brackets shown), and it
    refuses to run offline, naming the variable."""
    import importlib.util

    result = CliRunner().invoke(app, ["prefetch"])
    if importlib.util.find_spec("kernels") is None:
        assert result.exit_code == 2
        assert ('the `kernels` package is not installed: pip install -c constraints.txt -e ".[gpu]"'
                in " ".join(result.output.split()))
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "kernels" else None)
    offline = CliRunner().invoke(app, ["prefetch"])
    assert offline.exit_code == 2 and "but TRANSFORMERS_OFFLINE is set: unset it" in " ".join(offline.output.split())


def test_async_dead_groups_refusal_says_filter_first_and_the_table_agrees():
    """Async GRPO refuses dynamic sampling, so the refusal and the failure table send the user to
    `rufus-data filter` instead of offering `resample` there."""
    for mode in ("mask", "resample"):
        problem = next(p for p in async_checks.async_problems(grpo_config(grpo_execution="async", dynamic_sampling=mode),
                                                              environ={}) if "dynamic_sampling" in p)
        assert f"dynamic_sampling: {mode} is a synchronous-GRPO feature" in problem
        assert "no other remedy for dead groups" in problem and "Filter the prompts first, `rufus-data filter" in problem
    table = [line for line in (REPO / "docs" / "train_rl.md").read_text().splitlines()
             if line.startswith("| `frac_reward_zero_std`")]
    async_rows = [row for row in table if "(async)" in row]
    assert async_rows and all("rufus-data filter" in row and "resample" not in row for row in async_rows)
    assert any("(sync)" in row and "resample" in row and "not reproducible" in row for row in table)


def test_async_allows_fsdp2_lora_and_several_processes_but_not_fsdp1(tmp_path):
    fsdp2 = tmp_path / "fsdp2.yaml"
    fsdp2.write_text("distributed_type: FSDP\nnum_processes: 4\nfsdp_config:\n  fsdp_version: 2\n")
    config = grpo_config(grpo_execution="async", accelerate_config=str(fsdp2))
    problems = async_checks.async_problems(config, environ={})
    assert not any("FSDP" in p or "DeepSpeed" in p or "lora" in p.lower() for p in problems), problems
    assert async_checks.accelerate_settings(str(fsdp2), {})["num_processes"] == 4
    launched_fsdp1 = {"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "1"}
    assert any("FSDP version 1" in p for p in async_checks.async_problems(config.model_copy(update={"accelerate_config": None}), launched_fsdp1))


def test_async_refuses_quantized_models_and_head_adapters(tmp_path):
    model = tmp_path / "quantized"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"quantization_config": {"quant_method": "bitsandbytes"}}))
    config = grpo_config(grpo_execution="async", model=str(model))
    assert any("bitsandbytes" in p for p in async_checks.async_problems(config, environ={}))
    head = grpo_config(grpo_execution="async").model_copy()
    head.lora.target_modules = ["q_proj", "lm_head"]  # the common LoRA guard refuses this before; async says why too
    assert any("lora.target_modules ['lm_head']" in p for p in async_checks.async_problems(head, environ={}))


def test_cli_override_grpo_execution_wins_and_check_refuses(tmp_path, builtin_model):
    config = load_stage_config("reasoning_rl", get_stage("reasoning_rl").config_class,
                               overrides=[("grpo_execution", "async"), ("data", str(tmp_path))])
    assert config.grpo_execution == "async" and config.server_url == "http://localhost:8000"
    with pytest.raises(RufusError, match="no CUDA GPU"):
        get_stage("reasoning_rl").check(config)


def test_async_config_and_rollout_worker_inputs_up_to_the_cuda_boundary(tiny_tokenizer, tmp_path):
    config = grpo_config(grpo_execution="async", output_dir=str(tmp_path / "run"), max_steps=3, token_budget=None)
    args = async_config(config)
    assert args.vllm_server_base_url == "http://localhost:8000" and args.token_budget is None  # null: server's max_model_len
    assert args.max_completion_length == config.max_completion_length and args.max_steps == 3
    # what TRL pickles into the spawned rollout worker: rewards, tools, environments, the tokenizer (with its parser)
    rewards, _ = build_rewards(config.rewards)
    index = build_index([{"id": "d", "text": "Paris is in France."}], tmp_path / "idx.duckdb")
    async_checks.check_picklable(rewards, list(TOOLS.values()), search_environment_factory(index))
    tokenizer = pickle.loads(pickle.dumps(enable_tool_parsing(tiny_tokenizer)))
    assert tokenizer.response_template is not None
    with pytest.raises(RufusError, match="must\\s+pickle.*<lambda>"):
        async_checks.check_picklable([lambda prompts, completions, **kw: [0.0]])


def test_rollout_state_low_water_mark(tmp_path):
    with pytest.warns(UserWarning, match="restarts from prompt 0"):
        assert rollout_state.read_rollout_state(tmp_path, 10) is None
    (tmp_path / "rollout_state.json").write_text(json.dumps({"prompt_index": 23, "model_version": 5}))
    state = rollout_state.read_rollout_state(tmp_path, 10)
    assert (state.prompt_index, state.model_version, state.start_row) == (23, 5, 3)  # TRL restarts at index % len
    (tmp_path / "rollout_state.json").write_text("{}")
    with pytest.raises(RufusError, match="not a TRL rollout state"):
        rollout_state.read_rollout_state(tmp_path, 10)


def test_serve_command_matches_what_trl_needs():
    env, argv = serve.serve_command(serve.ServeConfig(model="smollm2-135m", devices="1,2", max_model_len=2048))
    assert env == {"VLLM_SERVER_DEV_MODE": "1", "CUDA_VISIBLE_DEVICES": "1,2"}
    flags = " ".join(argv)
    for flag in ('--weight-transfer-config {"backend": "nccl"}', "--logprobs-mode processed_logprobs",
                 "--max-logprobs -1", "--dtype bfloat16", "--max-model-len 2048", "--tensor-parallel-size 2"):
        assert flag in flags
    result = CliRunner().invoke(app, ["serve", "smollm2-135m", "--devices", "1", "--dry_run", "--lora_rank", "4"])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("VLLM_SERVER_DEV_MODE=1 CUDA_VISIBLE_DEVICES=1 VLLM_ALLOW_RUNTIME_LORA_UPDATING=1 ")
    assert "--enable-lora --max-lora-rank 8 --max-loras 6" in result.stdout  # rank rounded up; max_staleness + 2
    bad = CliRunner().invoke(app, ["serve", "smollm2-135m", "--devices", "", "--dry_run"])
    assert bad.exit_code == 2 and "--devices must name at least one GPU" in bad.output


# ------------------------------------------------------------------ completion length vs server


@pytest.fixture
def models_server(openai_stub):
    """A real HTTP server on 127.0.0.1 answering GET /v1/models like vLLM (max_model_len 64)."""
    return openai_stub(models=["tiny"], max_model_len=64).base_url


def test_completion_length_vs_server(models_server):
    with pytest.raises(RufusError, match=r"max_completion_length \(64\) >= the server's max_model_len \(64\)"):
        length_checks.check_completion_budget(models_server, 64)
    with pytest.warns(UserWarning, match=r"token_budget \(32\) is below the server's max_model_len \(64\)"):
        assert length_checks.check_completion_budget(models_server, 16, token_budget=32) == 64
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert length_checks.check_completion_budget(models_server, 16, token_budget=None) == 64
    assert length_checks.check_completion_budget("http://127.0.0.1:9", 16, retries=2, delay_s=0.01) is None  # skipped
    with pytest.raises(RufusError, match=r"longest prompt \(50 tokens\) plus max_completion_length \(16\) is 66"):
        length_checks.check_prompt_fits(50, 16, 64, "the server")


def test_stage_check_reads_server_before_loading(models_server, tmp_path):
    config = grpo_config(vllm_server=models_server, max_completion_length=100, data=[str(tmp_path)])
    with pytest.raises(RufusError, match="max_model_len"):
        get_stage("reasoning_rl").check(config)
    # no server: the model's own context (max_position_embeddings of the built-in: 8192)
    with pytest.raises(RufusError, match="max_position_embeddings"):
        get_stage("reasoning_rl").check(grpo_config(max_completion_length=9000))


def test_gpu_roles():
    with pytest.raises(RufusError, match="GPU 1 is both a trainer device"):
        DeviceRoles(trainer="0,1", server="1").check()
    with pytest.warns(UserWarning, match="evaluation devices \\(2\\) overlap the vLLM server's"):
        DeviceRoles(trainer="0", server="1,2", eval="2").check()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        DeviceRoles(trainer="0", server="1", eval="2").check()


# ------------------------------------------------------------------ stage configs


def test_stage_config_guards():
    config = grpo_config(max_completion_length=64)
    # DAPO, on by default, at the playbook's proportion (512 of 3072: a sixth of the limit)
    assert config.rewards[-1] == {"name": "overlong_penalty", "max_length": 64, "cache": 10}
    assert config.trl_kwargs()["reward_weights"] == [1.0, 1.0]
    with pytest.raises(RufusError, match="penalty must end where generation is cut"):
        grpo_config(rewards=[{"name": "overlong_penalty", "max_length": 32, "cache": 8}], max_completion_length=64)
    with pytest.raises(RufusError, match=r"\(6\) must be a multiple of num_generations \(4\)"):
        get_stage("reasoning_rl").check(grpo_config(per_device_train_batch_size=6, num_generations=4))
    with pytest.raises(RufusError, match="environment: search needs search_index"):
        grpo_config("search_agent", search_corpus=None)  # the stage YAML names a default corpus
    with pytest.raises(RufusError, match="no rewards"):
        get_stage("rlhf").check(grpo_config("rlhf", rewards=[]))
    # max_length does nothing in GRPO or distill: refused, naming the key that does its job there
    for stage in ("reasoning_rl", "coding_agent", "distill"):
        with pytest.raises(RufusError, match=r"max_length \(256\) is not used by .*set max_completion_length"):
            grpo_config(stage, max_length=256)
    with pytest.raises(RufusError, match="use the top-level key 'rewards'"):
        grpo_config(trainer={"reward_weights": [1.0]})
    # the `trainer:` block of every GRPO stage is checked against RufusGRPOConfig
    for stage in ("reasoning_rl", "rlhf", "general_agent"):
        with pytest.raises(RufusError, match=r"unknown key 'trainer.epsilon_hi' for RufusGRPOConfig; did you mean 'epsilon_high'"):
            grpo_config(stage, trainer={"epsilon_hi": 0.28}, search_corpus="c.jsonl")


def test_reward_model_must_be_sequence_classification(tiny_model):
    with pytest.raises(RufusError, match="LlamaForCausalLM, not a sequence-classification checkpoint"):
        check_reward_model(tiny_model)
    with pytest.raises(RufusError, match="does not exist"):
        check_reward_model("/no/such/reward-model")


# ------------------------------------------------------------------ dynamic sampling building blocks


def test_dead_groups_are_decided_per_group():
    rewards = torch.tensor([[1.0], [0.0], [0.5], [0.5], [1.0], [1.0]])  # groups of 2
    assert dead_groups(rewards, torch.ones(1), 2).tolist() == [False, True, True]
    rows_at_mean = torch.tensor([[0.0], [0.5], [1.0]])  # a row at its group's mean, in an informative group
    assert dead_groups(rows_at_mean, torch.ones(1), 3).tolist() == [False]
    two = torch.tensor([[1.0, 0.0], [0.0, 1.0]])  # sums equal, each function varies
    assert dead_groups(two, torch.ones(2), 2).tolist() == [True]
    # normalised one by one, the two rewards cancel: every row gets the same advantage
    assert dead_groups(two, torch.ones(2), 2, "normalize_then_sum").tolist() == [True]
    assert dead_groups(two, torch.tensor([1.0, 2.0]), 2, "normalize_then_sum").tolist() == [False]
    unscored = torch.tensor([[float("nan")], [float("nan")]])
    assert dead_groups(unscored, torch.ones(1), 2).tolist() == [True]


NAN = float("nan")
# one group of 4 completions each: (per-function rewards, weights), and whether it teaches nothing
# under (sum_then_normalize, normalize_then_sum)
GROUPS = {
    "varies": ([[1.0, 0.0, 1.0, 0.0]], [1.0], (False, False)),
    "flat": ([[1.0, 1.0, 1.0, 1.0]], [1.0], (True, True)),
    "cancel out": ([[1.0, 0.0, 1.0, 0.0], [0.0, 1.0, 0.0, 1.0]], [1.0, 1.0], (True, True)),
    # the sum varies; normalised, the flat reward is 0 and one scored once adds nothing
    "flat only after normalize_then_sum": ([[1.0, 1.0, 1.0, 1.0], [None, 5.0, None, None]], [1.0, 1.0], (False, True)),
    # the weighted sum is equal; normalised, the rewards differ by their weights
    "flat only in the sum": ([[1.0, 0.0, 1.0, 0.0], [0.0, 0.5, 0.0, 0.5]], [1.0, 2.0], (True, False)),
    "None left out, not 0.0": ([[None, 1.0, 1.0, None]], [1.0], (True, True)),
    "unscored": ([[None] * 4], [1.0], (True, True)),
}


@pytest.mark.parametrize("aggregation", ["sum_then_normalize", "normalize_then_sum"])
@pytest.mark.parametrize("name", list(GROUPS))
def test_filter_and_dynamic_sampling_agree_on_what_teaches_nothing(name, aggregation):
    """filter's learnable/ bucket and dynamic sampling's live groups are one predicate, under either
    aggregation: the bucket comes from the stored rollouts, the verdict from the trainer's tensor."""
    per_function, weights, expected = GROUPS[name]
    names = [f"r{i}" for i in range(len(per_function))]
    rollouts = pa.table({
        "prompt_id": ["p"] * 4,
        "reward": combine_rewards(per_function, weights),
        "rewards": [json.dumps({n: f[j] for n, f in zip(names, per_function)}) for j in range(4)],
    })
    bucket, _ = bucket_prompts(rollouts, 4, "0<=p", aggregation, dict(zip(names, weights)))["p"]
    tensor = torch.tensor([[NAN if f[j] is None else f[j] for f in per_function] for j in range(4)])
    dead = dead_groups(tensor, torch.tensor(weights), 4, aggregation).tolist()
    teaches_nothing_now = expected[aggregation == "normalize_then_sum"]
    assert dead == [teaches_nothing_now]
    assert (bucket != "learnable") == teaches_nothing_now
    if name == "None left out, not 0.0":
        assert bucket == "all_pass" and not teaches_nothing([[0.0, 1.0, 1.0, 0.0]])


def test_filter_offers_the_aggregations_trl_has():
    assert get_args(FilterConfig.model_fields["aggregation"].annotation) == AGGREGATIONS
    trl_help = GRPOConfig.__dataclass_fields__["multi_objective_aggregation"].metadata["help"]
    assert all(f"'{aggregation}'" in trl_help for aggregation in AGGREGATIONS)


def test_resample_stream_restores_from_its_cursor():
    stream = ResampleStream(list(range(5)), num_generations=2, seed=8)
    first = stream.draw(3)
    assert first[0] == first[1] and len(first) == 6
    rest = stream.draw(6)  # crosses into the next epoch
    restored = ResampleStream(list(range(5)), num_generations=2, seed=8, groups_drawn=3)
    assert restored.draw(6) == rest and restored.state() == {"seed": 8, "groups_drawn": 9}


def test_dynamic_sampling_refusals_and_warnings():
    from datasets import Dataset

    data = Dataset.from_dict({"prompt": ["a", "b"]})
    common = {"max_rounds": 2, "processing_class": None, "num_generations": 2}
    assert dynamic_sampling_problems(mode="resample", train_dataset=data, local_generation_batch=4, **common) == []
    problems = dynamic_sampling_problems(mode="resample", train_dataset=data.to_iterable_dataset(),
                                         local_generation_batch=3, **common)
    assert any("streaming dataset" in p for p in problems) and any("multiple of num_generations" in p for p in problems)
    assert dynamic_sampling_problems(mode="mask", train_dataset=data.to_iterable_dataset(), local_generation_batch=3,
                                     **common) == []  # mask works on streams
    assert "image columns" in dynamic_sampling_problems(
        mode="mask", train_dataset=data.add_column("images", [[], []]), local_generation_batch=4, **common)[0]
    assert "must be null, 'mask' or 'resample'" in dynamic_sampling_problems(
        mode="drop", train_dataset=data, local_generation_batch=4, **common)[0]
    messages = mask_warnings(beta=0.1, entropy_bonus=True, router_aux_loss=True)
    assert len(messages) == 3 and mask_warnings(0.0, False, False) == []


# ------------------------------------------------------------------ tools


def test_tools_calculator_sandbox_and_coding_environment():
    assert calculator("(12 + 3) * 4") == "60" and calculator("7 / 2") == "3.5"
    assert calculator("1/0") == "error: division by zero"
    assert calculator("__import__('os').system('true')").startswith("error: unsupported syntax")
    assert run_python("print(6 * 7)").strip() == "42"
    assert "ZeroDivisionError" in run_python("1/0")
    env = CodingEnvironment()
    env.reset(prompt="p", test_list=["assert add(1, 2) == 3"], test=None)
    assert env.run_tests("def add(a, b):\n    return a + b") == "all tests passed"
    assert env.run_tests("def add(a, b):\n    return a - b") == "some tests failed"


def test_search_index_bm25_offline(tmp_path):
    with pytest.raises(duckdb.Error):  # the fts extension is not loadable offline with this duckdb
        duckdb.connect().execute("LOAD fts")
    docs = [{"id": "paris", "text": "Paris is the capital of France."},
            {"id": "box", "text": "Box 17 holds the secret code 4821."},
            {"id": "hilton", "text": "Paris Hilton visited Rome, then Paris again."}]
    index = SearchIndex(build_index(docs, tmp_path / "index.duckdb"))
    assert [hit["id"] for hit in index.search("capital of France")] == ["paris"]
    assert index.search("secret code")[0]["id"] == "box"
    assert next(hit["id"] for hit in index.search("Paris")) == "hilton"  # two occurrences beat one (BM25 tf)
    assert index.search("the of") == []  # stopwords only
    env = SearchEnvironment(str(tmp_path / "index.duckdb"))
    assert env.search("secret code").startswith("[box] Box 17")
    with pytest.raises(RufusError, match="corpus is empty"):
        build_index([], tmp_path / "empty.duckdb")


def test_rufus_chatml_tool_calls_parse_back(tiny_tokenizer):
    from trl.chat_template_utils import parse_response

    tokenizer = enable_tool_parsing(tiny_tokenizer)
    prefix = tokenizer.apply_chat_template([{"role": "user", "content": "2+2?"}], tools=[calculator],
                                           add_generation_prompt=True, tokenize=True, return_dict=False)
    text = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+2"}}\n</tool_call><|im_end|>'
    parsed = parse_response(tokenizer, tokenizer(text, add_special_tokens=False)["input_ids"], prefix=prefix,
                            tools=[calculator])
    assert parsed["tool_calls"][0]["function"] == {"name": "calculator", "arguments": {"expression": "2+2"}}
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "", "tool_calls": parsed["tool_calls"]}],
        tools=[calculator], tokenize=False,
    )
    assert text.removesuffix("<|im_end|>") in rendered  # the template writes what the parser reads

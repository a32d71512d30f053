"""Recipe configs beside the stages (catalogs/stages/*.yaml naming their stage with `stage:`),
as their seeds write them: the playbook's Big-Math `/no_think` GRPO with DAPO's overlong penalty
(001), and the Rufus-Air minimal async GRPO reproduction (000). Each file opens with the command
lines that run it; the tests run those lines (dry runs), so the header cannot drift from the file."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import torch
from conftest import REPO
from typer.testing import CliRunner

from rufus_data.base.errors import RufusError
from rufus_data.sources.canonical import Canonicaliser, open_source
from rufus_data.sources.catalog import load_catalog
from rufus_data.sources.source_formats import detect_format, resolve_columns
from rufus_train import serve
from rufus_train.cli import app
from rufus_train.config_loading import load_stage_config
from rufus_train.stages import get_stage

BIG_MATH = "catalogs/stages/big_math_no_think.yaml"
ASYNC_QWEN3 = "catalogs/stages/async_grpo_qwen3.yaml"


def header_commands(path: str) -> dict[str, list[str]]:
    """The `rufus-train ...` lines of a file's opening comment, by subcommand: their arguments."""
    commands = {}
    for line in (REPO / path).read_text().splitlines():
        if not line.startswith("#"):
            break
        text = line.lstrip("# ").removeprefix("Run: ")
        if text.startswith("rufus-train "):
            words = shlex.split(text.split(" [")[0])
            commands[words[1]] = words[2:]
    return commands


def recipe(path: str, **overrides):
    return load_stage_config("reasoning_rl", get_stage("reasoning_rl").config_class, REPO / path, overrides)


# ------------------------------------------------------------------ Big-Math /no_think (playbook)


def test_big_math_stage_penalises_overlong_answers_as_the_playbook_sets_it():
    """math_equivalence on the verified answer plus DAPO's soft penalty over the last 512 of 3072
    tokens: 0 up to 2560, -1 at 3072 (the playbook's 2.5-3k threshold)."""
    assert header_commands(BIG_MATH)["stage"] == ["reasoning_rl", "--config", BIG_MATH]
    config = recipe(BIG_MATH)
    assert config.data == ["catalogs/data/big_math_no_think.yaml"] and config.max_completion_length == 3072
    assert {"name": "math_equivalence", "answer_column": "expected_output"} in config.rewards
    penalty = [r for r in config.rewards if r["name"] == "overlong_penalty"]
    assert [(p["max_length"], p["cache"]) for p in penalty] == [(3072, 512)]
    result = CliRunner().invoke(app, ["stage", *header_commands(BIG_MATH)["stage"], "--dry_run"])
    assert result.exit_code == 0, result.output
    assert "overlong_cache: 512" in result.output and "config valid" in result.output


def test_big_math_prompts_carry_no_think_and_say_when_gsm8k_train_stands_in(hub_offline, data_root):
    catalog = load_catalog(REPO / "catalogs/data/big_math_no_think.yaml")
    (source,) = catalog.sources
    assert (source.hub.id, source.hub.split, source.system) == ("SynthLabsAI/Big-Math-RL-Verified", "train", "/no_think")
    with pytest.warns(UserWarning, match="revision 'main' of SynthLabsAI/Big-Math-RL-Verified is a branch"):
        opened = open_source(source)
    first = next(opened.rows)
    fmt = detect_format(opened.spec, first, catalog.kind)
    row = Canonicaliser(opened.spec, catalog.kind, fmt, resolve_columns(opened.spec, fmt, first))(first, 0)
    assert opened.provenance["fallback"]["used"] and "Big-Math-RL-Verified" in opened.provenance["fallback"]["instead_of"]
    assert opened.provenance["from"].endswith("gsm8k/train.jsonl")  # GSM8K train, never an eval split
    assert row["prompt"][0] == {"role": "system", "content": "/no_think"}
    assert row["prompt"][1]["role"] == "user" and row["expected_output"].rstrip().split("#### ")[-1].isdigit()


def test_big_math_without_its_data_is_refused_naming_both_places(hub_offline, monkeypatch, tmp_path):
    monkeypatch.setenv("RUFUS_DATA_ROOT", str(tmp_path))
    (source,) = load_catalog(REPO / "catalogs/data/big_math_no_think.yaml").sources
    with pytest.warns(UserWarning), pytest.raises(
            RufusError, match=r"source 'big_math': hub SynthLabsAI/Big-Math-RL-Verified .* is not available here, and "
                              r"source 'big_math' \(fallback\) could not be loaded; tried: \$RUFUS_DATA_ROOT/gsm8k/train"):
        open_source(source)


# ------------------------------------------------------------------ the minimal async reproduction (Rufus-Air)


def test_async_reproduction_is_the_sources_setup():
    """Qwen3-0.6B, trainer on GPU 0, server on GPU 1 with VLLM_SERVER_DEV_MODE=1 and a 16384-token
    context, --max_completion_length 8192: the header's serve line gives exactly that server."""
    commands = header_commands(ASYNC_QWEN3)
    assert commands["stage"] == ["reasoning_rl", "--config", ASYNC_QWEN3, "--grpo_execution", "async",
                                 "--max_completion_length", "8192"]
    config = recipe(ASYNC_QWEN3)
    assert (config.model, config.grpo_execution, config.max_completion_length) == ("dnotitia/Qwen3-0.6B", "async", 8192)
    assert (config.devices.trainer, config.devices.server, config.token_budget, config.lora.enabled) == ("0", "1", None, False)
    result = CliRunner().invoke(app, ["serve", *commands["serve"], "--dry_run"])
    assert result.exit_code == 0, result.output
    env, argv = serve.serve_command(serve.config_for_stage(config, {"max_model_len": 16384}), dry_run=True)
    assert env == {"VLLM_SERVER_DEV_MODE": "1", "CUDA_VISIBLE_DEVICES": "1"}
    assert argv[argv.index("--max-model-len") + 1] == "16384" and argv[argv.index("--model") + 1] == "dnotitia/Qwen3-0.6B"
    assert "VLLM_SERVER_DEV_MODE=1 CUDA_VISIBLE_DEVICES=1" in result.output and "--max-model-len 16384" in result.output


def test_async_reproduction_reaches_trls_async_config(tmp_path):
    """Every setting of the file reaches AsyncGRPOConfig (it builds on CPU): the source's numbers as TRL reads them."""
    from rufus_train.grpo.async_config import async_config

    args = async_config(recipe(ASYNC_QWEN3, output_dir=str(tmp_path / "run")))
    assert (args.max_completion_length, args.token_budget, args.num_generations) == (8192, None, 8)
    assert (args.max_steps, args.save_steps, args.vllm_server_base_url) == (12, 6, "http://localhost:8000")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without GPUs")
def test_async_reproduction_is_refused_before_loading_without_its_gpus(monkeypatch, tmp_path):
    """With the model cached (a stand-in: this machine is offline), the run line's dry run stops at
    the async checks: no CUDA GPU, naming the two GPUs the file places, exit 2, nothing written."""
    monkeypatch.setattr("rufus_data.models.reference.model_unavailable", lambda repo: None)
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["stage", *header_commands(ASYNC_QWEN3)["stage"], "--output_dir", str(out), "--dry_run"])
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.split())
    assert "grpo_execution: async cannot run this reasoning_rl config" in text
    assert "no CUDA GPU is visible to the trainer" in text
    assert "This config places the trainer GPU 0 and the server GPU 1 (devices)" in text
    assert "Traceback" not in result.output and not Path(out).exists()

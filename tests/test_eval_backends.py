"""rufus-eval's backends read rufus_data's ModelAccess (the settings filter and pairs take too):
each field reaches lm-eval's model arguments, and the `rufus-eval suite` options map onto it.
Nothing here loads a model."""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

from rufus_data.base.errors import RufusError
from rufus_data.generate import ModelAccess
from rufus_eval.cli import app
from rufus_eval.lm_eval_models import open_backend
from rufus_eval.request import CONCURRENCY, EvalRequest

NOBODY = "http://127.0.0.1:9"  # nothing listens: the server reports no max_model_len and no version


def test_server_backend_fields_reach_lm_eval():
    cfg = ModelAccess(backend="server", base_urls=[NOBODY + "/v1"], max_model_len=1024, concurrency=CONCURRENCY)
    with open_backend("smollm2-135m", cfg, seed=3) as (name, args, facts):
        assert name == "rufus-completions" and facts == {"backend": "server", "server_version": None}
        assert args["base_url"] == f"{NOBODY}/v1/completions"
        assert (args["model"], args["tokenizer"]) == ("smollm2-135m", "smollm2-135m")  # both default to the model
        assert (args["max_length"], args["num_concurrent"], args["seed"]) == (1024, 8, 3)


def test_a_built_in_name_or_a_folder_as_the_tokenizer_reaches_lm_eval_as_a_folder(tiny_model, tmp_path):
    """issue #47, item 11: `--tokenizer tiny-random` went to lm-eval as a hub id (a traceback)."""
    named = ModelAccess(backend="server", base_urls=[NOBODY], served_model_name="at-server", tokenizer="tiny-random")
    with open_backend("smollm2-135m", named) as (_, args, _):
        assert (args["model"], args["tokenizer"], args["max_length"]) == ("at-server", tiny_model, 2048)
    missing = ModelAccess(backend="server", base_urls=[NOBODY], tokenizer=str(tmp_path / "tok"))
    with pytest.raises(RufusError, match="does not exist"), open_backend("m", missing):
        pass


def test_eval_refuses_more_than_one_endpoint():
    cfg = ModelAccess(backend="server", base_urls=[NOBODY, NOBODY])
    with pytest.raises(RufusError, match="one endpoint; give one --base-url, not 2"), open_backend("m", cfg):
        pass
    with pytest.raises(ValueError, match="one endpoint: give one --base-url, not 2"):
        EvalRequest(suite="quick", checkpoint="m", backend="server", base_urls=[NOBODY, NOBODY])


def test_a_request_written_with_one_base_url_still_reads():
    """job.json files of checkpoint evaluations written before the URL setting was shared."""
    old = EvalRequest.model_validate({"suite": "quick", "checkpoint": "m", "backend": "server", "base_url": NOBODY})
    assert old.base_urls == [NOBODY]


def test_hf_backend_fields_reach_lm_eval():
    with open_backend("/models/m", ModelAccess(backend="hf", max_model_len=512), seed=5, batch_size=4) as (name, args, _):
        assert name == "rufus-hf"
        cuda = torch.cuda.is_available()
        assert args == {"pretrained": "/models/m", "device": "cuda" if cuda else "cpu",
                        "dtype": "auto" if cuda else "float32", "batch_size": 4, "seed": 5, "max_length": 512}
    with open_backend("/models/m", ModelAccess(backend="hf", dtype="bfloat16")) as (_, args, _):
        assert args["dtype"] == "bfloat16"  # a dtype given is used, not replaced by eval's default


def test_vllm_backend_launch_config_carries_every_server_field():
    cfg = ModelAccess(backend="vllm", devices="0,1", data_parallel_size=2, max_model_len=4096,
                      gpu_memory_utilization=0.5, vllm_command=["vllm", "serve"])
    launch = cfg.launch_config("/models/m", "run-7")
    assert (launch.model, launch.name, launch.devices, launch.max_model_len) == ("/models/m", "run-7", "0,1", 4096)
    assert (launch.data_parallel_size, launch.gpu_memory_utilization, launch.command) == (2, 0.5, ["vllm", "serve"])
    request = EvalRequest(suite="quick", checkpoint="m", backend="vllm", devices="2,3", run_name="run-7")
    assert (request.access().served_model_name, request.access().data_parallel_size) == ("run-7", 2)


def test_cli_refuses_a_server_backend_without_url_before_loading():
    result = CliRunner().invoke(app, ["suite", "quick", "--ckpt", "smollm2-135m", "--backend", "server"])
    assert result.exit_code == 2 and "--backend server needs --base-url" in result.output
    bad = CliRunner().invoke(app, ["suite", "quick", "--ckpt", "smollm2-135m", "--backend", "tgi"])
    said = " ".join(bad.output.replace("│", " ").split())
    assert bad.exit_code == 2 and "'tgi' is not one of 'auto', 'hf', 'vllm', 'server'" in said

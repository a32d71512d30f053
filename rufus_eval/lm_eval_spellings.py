"""lm-eval's options on `rufus-eval suite` (`lm_eval --model vllm --model_args pretrained=X
--output_path OUT --log_samples`): each taken as the Rufus option that means the same, with a
note, or refused with the line that says where Rufus keeps that setting
(rufus_data/base/borrowed_options.py)."""

from __future__ import annotations

from rufus_data.base.borrowed_options import Borrowed, is_true, key_values, refuse
from rufus_data.base.errors import RufusError

SUITE_FILE = "catalogs/suites/NAME.yaml"
# --model_args keys with a Rufus option of their own
MODEL_ARGS = {"pretrained": "--ckpt", "dtype": "--dtype", "max_model_len": "--max-model-len",
              "max_length": "--max-model-len", "gpu_memory_utilization": "--gpu-memory-utilization",
              "data_parallel_size": "--data-parallel-size", "base_url": "--base-url", "tokenizer": "--tokenizer",
              "model": "--served-model-name", "batch_size": "--batch-size"}
# --gen_kwargs keys with a Rufus option of their own
GEN_KWARGS = {"temperature": "--temperature", "max_gen_toks": "--max-tokens", "max_new_tokens": "--max-tokens",
              "max_tokens": "--max-tokens"}
BACKENDS = {"hf": "hf", "vllm": "vllm", "local-completions": "server", "local-chat-completions": "server",
            "openai-chat-completions": "server"}


def _model_args(value: str | None) -> list[str]:
    out = []
    for key, given in key_values("--model_args", value).items():
        if key not in MODEL_ARGS:
            raise RufusError(f"--model_args {key}={given}: Rufus keeps no such setting on the command line: a model's "
                             "own settings come from its folder (config.json), a vLLM server's extra flags from "
                             f"--vllm-command; the ones it takes are {', '.join(sorted(MODEL_ARGS))}")
        out += [MODEL_ARGS[key], given]
    return out


def _gen_kwargs(value: str | None) -> list[str]:
    out = []
    for key, given in key_values("--gen_kwargs", value).items():
        if key == "do_sample":
            out += [] if is_true("do_sample", given) else ["--temperature", "0", "--repeats", "1"]
        elif key in GEN_KWARGS:
            out += [GEN_KWARGS[key], given]
        else:
            raise RufusError(f"--gen_kwargs {key}={given}: set it in the suite's `sampling:` block ({SUITE_FILE}, "
                             "or a task's own `sampling:`); the command line takes temperature and max_gen_toks")
    return out


def _seed(value: str | None) -> list[str]:
    seeds = {s.strip() for s in (value or "").split(",") if s.strip() and s.strip() != "None"}
    if len(seeds) != 1:
        raise RufusError(f"--seed {value}: Rufus seeds sampling and lm-eval's random, numpy and torch with one seed: "
                         "give one number")
    return ["--seed", seeds.pop()]


def _num_fewshot(value: str | None) -> list[str]:
    if value == "0":
        return []
    raise RufusError(f"--num_fewshot {value}: Rufus's suites prompt zero-shot through the chat template; few-shot "
                     f"examples go into a task's `prompt:` in its suite YAML ({SUITE_FILE})")


def _chat_template(value: str | None) -> list[str]:
    if value is None or value.lower() == "true":
        return []
    raise RufusError(f"--apply_chat_template {value}: Rufus always applies the model's own chat template; another "
                     "template: give a tokenizer that carries it (--tokenizer)")


def _backend(value: str | None) -> list[str]:
    if value not in BACKENDS:
        raise RufusError(f"--model {value}: lm-eval's --model is Rufus's --backend (hf, vllm, or server for "
                         f"{', '.join(k for k, v in BACKENDS.items() if v == 'server')}); the model itself is --ckpt")
    return ["--backend", BACKENDS[value]]


LM_EVAL_SPELLINGS = (
    Borrowed("--output_path", "lm-eval", "`--out`", lambda value: ["--out", value], example="outputs/eval/mine",
             shows='"out": "outputs/eval/mine"'),
    Borrowed("--log_samples", "lm-eval", "always on", lambda value: [], takes="flag",
             note="Rufus keeps every task's samples: RUN/lm_eval/samples_TASK.jsonl", shows="suite: quick"),
    Borrowed("--seed", "lm-eval", "`--seed` (the suite's seed)", _seed, example="1234,1234,1234,1234",
             shows='"seed": 1234'),
    Borrowed("--num_fewshot", "lm-eval", "0 taken (suites are zero-shot); more refused", _num_fewshot, example="5",
             shows="few-shot examples go into a task's `prompt:`"),
    Borrowed("--apply_chat_template", "lm-eval", "always on", _chat_template, takes="flag",
             note="Rufus always applies the model's chat template", shows="suite: quick"),
    Borrowed("--gen_kwargs", "lm-eval", "`--temperature`, `--max-tokens` (others: the suite's `sampling:`)",
             _gen_kwargs, example="temperature=0.6,max_gen_toks=128", shows='"max_tokens": 128'),
    Borrowed("--model_args", "lm-eval", "pretrained -> `--ckpt`, dtype, max_model_len, gpu_memory_utilization, "
             "data_parallel_size, base_url, tokenizer, model -> their options; others refused", _model_args,
             example="pretrained=tiny-random,dtype=float32", shows='"dtype": "float32"'),
    Borrowed("--model", "lm-eval", "`--backend` (hf, vllm, server)", _backend, example="hf", shows='"backend": "hf"'),
    Borrowed("--include_path", "lm-eval", "refused: suites are YAML files", refuse(
        f"--include_path: Rufus's tasks are declared in a suite YAML ({SUITE_FILE}); give its path as the suite"),
        example="tasks/", shows="give its path as the suite"),
)

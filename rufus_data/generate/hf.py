"""The `hf` backend: transformers `generate`, in-process; the embedded default on CPU.

Determinism: each prompt is generated on its own, as one batch of its `n` samples (identical
rows, so no padding), after seeding torch with the prompt's seed (sampling.py); every
completion records that prompt seed, the one that reproduces it (row i of the batch comes from
the same torch stream, not from a seed of its own). Its completions
therefore depend only on the model, the prompt, its id and the run seed - not on which other
prompts run in the same call, their order, or whether the run was interrupted and resumed.
(Batching different prompts together would need left padding, which changes the logits a
little and so the samples.) tests/test_generate.py checks this."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator

# OpenMP threads that spin while waiting collapse CPU generation (10x slower measured) when the
# cores are shared with a vLLM server or other jobs; libgomp reads this when torch first loads.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from rufus_data.base.errors import RufusError
from rufus_data.generate.base import Completion, Generator, Prompt, PromptResult
from rufus_data.generate.sampling import SamplingParams
from rufus_data.models.end_tokens import end_tokens
from rufus_data.models.merged_model import plain_folder
from rufus_data.models.reference import ModelRef
from rufus_data.models.thinking import Thinking


class HFGenerator(Generator):
    def __init__(self, model: ModelRef, dtype: str = "bfloat16", device: str | None = None,
                 model_name: str | None = None, thinking: Thinking = Thinking()):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        ref = model
        path = plain_folder(ref)  # a LoRA run generates merged (its folder holds only the adapter)
        self.model = model_name or ref.text
        self.thinking = thinking
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(path)
            self.lm = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).to(self.device).eval()
        except OSError as err:  # a hub id that does not exist, or files missing from a folder
            raise RufusError(f"could not load model {ref.text!r} ({str(err).splitlines()[0]}): give a built-in name, a "
                             "model folder (config.json, weights, tokenizer) or a hub id that exists") from None
        self.eos_ids = set(end_tokens(self.tokenizer, self.lm.generation_config).ids)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else min(self.eos_ids)

    def prompt_ids(self, prompt: Prompt) -> list[int]:
        ids = self.tokenizer.apply_chat_template(self.thinking.messages(prompt.messages), add_generation_prompt=True,
                                                 tokenize=True, **self.thinking.template_kwargs())
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)

    def complete(self, prompt: Prompt, sampling: SamplingParams) -> PromptResult:
        import torch

        ids = torch.tensor([self.prompt_ids(prompt)] * sampling.n, device=self.device)
        greedy = sampling.temperature == 0
        options = {
            "max_new_tokens": sampling.max_tokens,
            "do_sample": not greedy,
            "repetition_penalty": sampling.repetition_penalty,
            "pad_token_id": self.pad_id,
            "eos_token_id": sorted(self.eos_ids),
            "return_dict_in_generate": True,
            "output_logits": True,
        }
        if not greedy:
            options.update(temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k or None)
            if sampling.min_p:
                options["min_p"] = sampling.min_p
        seed = sampling.prompt_seed(prompt.id)
        if seed is not None:
            torch.manual_seed(seed)
        with torch.inference_mode():
            out = self.lm.generate(ids, attention_mask=torch.ones_like(ids), **options)
            new = out.sequences[:, ids.shape[1] :]
            # log-probability of each chosen token under the model (before temperature / top-p)
            logits = torch.stack(out.logits, dim=1).float()
            chosen = torch.log_softmax(logits, dim=-1).gather(-1, new.unsqueeze(-1)).squeeze(-1)
        completions = []
        for row in range(sampling.n):
            tokens = new[row].tolist()
            finish = "length"
            for pos, tok in enumerate(tokens):
                if tok in self.eos_ids:
                    tokens, finish = tokens[:pos], "stop"
                    break
            completions.append(
                Completion(
                    text=self.tokenizer.decode(tokens, skip_special_tokens=True),
                    token_ids=tokens,
                    finish_reason=finish,
                    seed=seed,  # the prompt seed: re-running this prompt with it reproduces all n rows
                    logprobs=chosen[row, : len(tokens)].tolist(),
                )
            )
        return PromptResult(prompt, completions)

    def stream(self, prompts: Iterable[Prompt], sampling: SamplingParams) -> Iterator[PromptResult]:
        for prompt in prompts:
            yield self.complete(prompt, sampling)

    def close(self) -> None:
        self.lm = None

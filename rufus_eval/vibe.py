"""`rufus-eval vibe --ckpt A --ckpt B prompts.yaml`: your own handful of prompts, answered side by side.

The "vibe test" is how SmolLM3's team noticed a lost system prompt in their data: numbers looked
fine, answers did not. prompts.yaml is a list of strings or {system, user} mappings (or a `prompts:`
key holding one); catalogs/vibe_prompts.yaml is an example. The answers table goes to stdout, and
a side-by-side page (vibe_page.py) beside --out (OUT.html; vibe.html without --out)."""

from __future__ import annotations

from pathlib import Path

from rich.table import Table

from rufus_data.console import print_result
from rufus_data.errors import RufusError
from rufus_data.shards import as_messages
from rufus_data.yaml_config import StrictModel, read_yaml
from rufus_eval.runner import prepare_model
from rufus_eval.vibe_page import write_vibe_page


class VibePrompt(StrictModel):
    user: str
    system: str | None = None


def load_prompts(path: Path) -> list[VibePrompt]:
    data, _ = read_yaml(path)
    items = data.get("prompts") if isinstance(data, dict) else data
    if not isinstance(items, list) or not items:
        raise RufusError(f"{path}: expected a list of prompts (strings or {{system, user}}), or a `prompts:` key")
    prompts = []
    for index, item in enumerate(items):
        if isinstance(item, str):
            prompts.append(VibePrompt(user=item))
        elif isinstance(item, dict):
            try:
                prompts.append(VibePrompt(**item))
            except Exception as err:  # noqa: BLE001 - pydantic's message is the useful part
                raise RufusError(f"{path}: prompt {index}: {err}") from None
        else:
            raise RufusError(f"{path}: prompt {index} must be a string or a mapping with `user`")
    return prompts


def answer_all(ckpt: str, prompts: list[VibePrompt], max_tokens: int, temperature: float) -> list[str]:
    import torch  # heavy: only when a model answers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = prepare_model(ckpt)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    answers = []
    torch.manual_seed(0)
    for prompt in prompts:
        messages = ([{"role": "system", "content": prompt.system}] if prompt.system else []) + as_messages(prompt.user)
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
        with torch.no_grad():
            out = model.generate(
                **ids, max_new_tokens=max_tokens, do_sample=temperature > 0,
                **({"temperature": temperature} if temperature > 0 else {}),
            )
        answers.append(tokenizer.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True).strip())
    return answers


def run_vibe(prompts_file: Path, ckpts: list[str], max_tokens: int = 256, temperature: float = 0.0,
             out: Path | None = None) -> dict[str, list[str]]:
    prompts = load_prompts(Path(prompts_file))
    answers = {ckpt: answer_all(ckpt, prompts, max_tokens, temperature) for ckpt in ckpts}
    table = Table(title="vibe test", show_lines=True)
    table.add_column("prompt")
    for ckpt in ckpts:
        table.add_column(ckpt)
    for i, prompt in enumerate(prompts):
        table.add_row(prompt.user, *[answers[c][i] for c in ckpts])
    print_result(table)
    if out is not None:
        lines = ["# vibe test", ""]
        for i, prompt in enumerate(prompts):
            lines += [f"## {prompt.user}", ""] + [f"**{c}**:\n\n{answers[c][i]}\n" for c in ckpts]
        Path(out).write_text("\n".join(lines))
    write_vibe_page(Path(out or "vibe.md").with_suffix(".html"), [prompt.user for prompt in prompts], answers)
    return answers

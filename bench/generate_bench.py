"""Generated tokens/s on the same prompts, in one run:

  1. `rufus-data filter` through a vLLM server (the `server` backend: async client, retries, journal),
  2. the same server driven directly with the OpenAI client, same concurrency and request fields (the ceiling),
  3. transformers `generate`, batched over all prompts in-process (the CPU baseline).

Targets: filter >= 0.9x the direct client and >= 2x transformers. Both server paths are warmed up
(every prompt once, so the prefix cache favours neither) and then run twice each in the order
direct, filter, filter, direct; their figures are the sums of the two runs. Starts vLLM's CPU build from
.venv-vllm through rufus_data.generate.launcher unless --base-url is given.

    .venv/bin/python bench/generate_bench.py [--prompts 32 --n 4 --max-tokens 128 --concurrency 32]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rufus_data.generate import SamplingParams
from rufus_data.rollouts.prompts import normalise_prompt


def gsm8k_rows(count: int) -> list[dict]:
    root = Path(os.environ.get("RUFUS_DATA_ROOT", REPO.parent / "shared" / "data"))
    rows = []
    with open(root / "gsm8k" / "test.jsonl") as fh:
        for index, line in zip(range(count), fh):
            record = json.loads(line)
            rows.append({"id": f"gsm8k-test-{index}", "source": "gsm8k", "label": "math",
                         "prompt": [{"role": "user", "content": record["question"]}],
                         "expected_output": record["answer"].rsplit("####", 1)[1].strip()})
    return rows


def bench_filter(rows, base_url: str, model: str, sampling: SamplingParams, concurrency: int) -> dict:
    import pyarrow as pa

    from rufus_data.folders.shards import write_shards
    from rufus_data.rollouts.filter import FilterConfig, filter_prompts

    with tempfile.TemporaryDirectory() as tmp:
        write_shards(pa.Table.from_pylist(rows), Path(tmp) / "rl")
        config = FilterConfig(policy=model, reward=["string_match:gsm8k"], k=sampling.n, backend="server",
                              base_urls=[base_url], concurrency=concurrency, max_tokens=sampling.max_tokens,
                              temperature=sampling.temperature, seed=sampling.seed)
        started = time.monotonic()
        summary = filter_prompts([Path(tmp) / "rl"], Path(tmp) / "out", config)
        total = time.monotonic() - started
    gen = summary.manifest["generation"]
    return {"tokens": gen["generated_tokens"], "seconds": gen["seconds"], "end_to_end_seconds": round(total, 2)}


def bench_direct(rows, base_url: str, model: str, sampling: SamplingParams, concurrency: int) -> dict:
    from openai import AsyncOpenAI

    async def run() -> int:
        client = AsyncOpenAI(base_url=f"{base_url}/v1", api_key="none", max_retries=0, timeout=600)
        gate = asyncio.Semaphore(concurrency)

        async def one(row) -> int:
            async with gate:
                response = await client.chat.completions.create(
                    model=model, messages=normalise_prompt(row["prompt"], row["id"]), n=sampling.n,
                    max_tokens=sampling.max_tokens, temperature=sampling.temperature, top_p=sampling.top_p,
                    seed=sampling.prompt_seed(row["id"]),
                    # the same response fields filter asks for (it keeps them in rollouts.parquet)
                    logprobs=True, extra_body={"return_token_ids": True},
                )
                return response.usage.completion_tokens

        counts = await asyncio.gather(*(one(r) for r in rows))
        await client.close()
        return sum(counts)

    started = time.monotonic()
    tokens = asyncio.run(run())
    return {"tokens": tokens, "seconds": round(time.monotonic() - started, 3)}


def bench_transformers(rows, model_dir: str, sampling: SamplingParams, batch_prompts: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).eval()
    eos = tokenizer.eos_token_id
    torch.manual_seed(sampling.seed or 0)
    tokens, started = 0, time.monotonic()
    for start in range(0, len(rows), batch_prompts):
        texts = [tokenizer.apply_chat_template(normalise_prompt(r["prompt"], r["id"]), add_generation_prompt=True,
                                               tokenize=False) for r in rows[start:start + batch_prompts]]
        batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.inference_mode():
            out = model.generate(**batch, do_sample=True, temperature=sampling.temperature,
                                 max_new_tokens=sampling.max_tokens, num_return_sequences=sampling.n,
                                 pad_token_id=tokenizer.pad_token_id or eos)
        for seq in out[:, batch["input_ids"].shape[1]:].tolist():
            tokens += next((i + 1 for i, t in enumerate(seq) if t == eos), len(seq))
    return {"tokens": tokens, "seconds": round(time.monotonic() - started, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--base-url", help="an already running server (default: start vLLM's CPU build)")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--hf-batch-prompts", type=int, default=32, help="prompts per transformers generate call")
    args = parser.parse_args()

    from rufus_data.generate.launcher import LaunchConfig, VLLMServer
    from rufus_data.models.reference import ModelRef

    model_dir = ModelRef.of(args.model).folder()
    rows = gsm8k_rows(args.prompts)
    sampling = SamplingParams(n=args.n, max_tokens=args.max_tokens, temperature=1.0, seed=0)
    server = None
    if args.base_url:
        base_url = args.base_url
    else:
        server = VLLMServer(LaunchConfig(model=model_dir, served_model_name=args.model, max_model_len=2048))
        server.start()
        base_url = server.base_url
    try:
        # warm-up of both paths: every prompt once through the server (max_tokens=1), so vLLM's
        # prefix cache holds all of them before any measured run, and a small filter run
        bench_direct(rows, base_url, args.model, dataclasses.replace(sampling, max_tokens=1), args.concurrency)
        bench_filter(rows[:4], base_url, args.model, sampling, args.concurrency)
        # then alternate (direct, filter, filter, direct): neither path always runs first or last
        runs: dict[str, list[dict]] = {"direct": [], "filter": []}
        for name in ("direct", "filter", "filter", "direct"):
            bench = bench_direct if name == "direct" else bench_filter
            runs[name].append(bench(rows, base_url, args.model, sampling, args.concurrency))
        direct, filt = (
            {key: sum(r[key] for r in runs[name]) for key in runs[name][0]} for name in ("direct", "filter")
        )
    finally:
        if server:
            server.stop()
    hf = bench_transformers(rows, model_dir, sampling, args.hf_batch_prompts)

    def rate(r):
        return r["tokens"] / r["seconds"]

    print(f"{args.prompts} GSM8K prompts x n={args.n} x max {args.max_tokens} tokens, concurrency {args.concurrency}")
    print(f"{'path':<44}{'tokens':>8}{'seconds':>9}{'tok/s':>9}")
    for name, r in (("rufus-data filter via vLLM server", filt), ("same server, OpenAI client directly", direct),
                    ("transformers generate (batched, in-process)", hf)):
        print(f"{name:<44}{r['tokens']:>8}{r['seconds']:>9.1f}{rate(r):>9.1f}")
    vs_direct, vs_hf = rate(filt) / rate(direct), rate(filt) / rate(hf)
    print(f"filter end to end (reading, context check, scoring, writing): {filt['end_to_end_seconds']:.1f} s")
    print(f"filter / direct client: {vs_direct:.2f}x (target >= 0.9x) {'OK' if vs_direct >= 0.9 else 'BELOW TARGET'}")
    print(f"filter / transformers:  {vs_hf:.2f}x (target >= 2x) {'OK' if vs_hf >= 2 else 'BELOW TARGET'}")


if __name__ == "__main__":
    main()

"""Check the published numbers: IFEval and GSM8K on the built-in SmolLM2-135M-Instruct, compared
with its model card. Not a CI test; the output is recorded in docs/eval.md.

    RUFUS_DATA_ROOT=../shared/data .venv/bin/python bench/eval_published.py [--limit N] [--backend vllm]

Greedy decoding, one sample (the card's setting), through `rufus-eval suite` (hf backend by
default; `--backend vllm` serves the model with vLLM, which the full 541 + 1319 documents need on CPU).
IFEval: the card reports the average of prompt-level and instruction-level accuracy; both are
recomputed here from lm-eval's samples file with the rewards package's IFEval checker (strict and
loose). GSM8K: the card's figure is 5-shot; Rufus asks zero-shot through the chat template."""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from rufus_data.rewards.ifeval import ifeval_scores
from rufus_eval.request import EvalRequest
from rufus_eval.runner import run_suite

# SmolLM2-135M-Instruct model card (HuggingFaceTB/SmolLM2-135M-Instruct), "Instruction model" table
CARD = {"ifeval_avg_prompt_inst": 29.9, "gsm8k_5shot": 1.4}

SUITE = """name: published
repeats: 1
sampling: {{temperature: 0.0, top_p: 1.0, max_tokens: {max_tokens}}}
tasks:
  - name: ifeval
    kind: rufus
    role: validation
    benchmark: ifeval
    prompt: "{{prompt}}"
    gold_fields: [instruction_id_list, kwargs]
    scorer: {{name: ifeval, mode: strict, level: prompt}}
  - name: gsm8k
    kind: rufus
    role: validation
    benchmark: gsm8k
    prompt: "{{question}}"
    gold_fields: [answer]
    scorer: {{name: final_number, answer_column: answer}}
"""


def ifeval_levels(samples_file: str) -> dict:
    totals = {"prompt_strict": [], "inst_strict": [], "prompt_loose": [], "inst_loose": []}
    for line in Path(samples_file).read_text().splitlines():
        sample = json.loads(line)
        gold = json.loads(sample["doc"]["gold"])
        answer = sample["filtered_resps"][0][0]
        s = ifeval_scores(sample["doc"]["prompt"], answer, gold["instruction_id_list"], gold["kwargs"])
        totals["prompt_strict"].append(float(s["prompt_level_strict"]))
        totals["inst_strict"] += [float(x) for x in s["inst_level_strict"]]
        totals["prompt_loose"].append(float(s["prompt_level_loose"]))
        totals["inst_loose"] += [float(x) for x in s["inst_level_loose"]]
    return {k: 100 * sum(v) / len(v) for k, v in totals.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--limit", type=int, default=None, help="documents per task (default: all)")
    parser.add_argument("--max-tokens", type=int, default=384)
    parser.add_argument("--backend", choices=["hf", "vllm"], default="hf",
                        help="vllm: Rufus starts the CPU (or GPU) vLLM build for the model; fast enough for the full sets")
    parser.add_argument("--concurrency", type=int, default=32, help="vllm: requests in flight")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="rufus-published-"))
    suite = work / "published.yaml"
    suite.write_text(SUITE.format(max_tokens=args.max_tokens))
    start = time.time()
    record = run_suite(EvalRequest(suite=str(suite), checkpoint="smollm2-135m", backend=args.backend, concurrency=args.concurrency,
                                  limit=args.limit, out=work / "run", run_name="published"))
    levels = ifeval_levels(record["tasks"]["ifeval"]["samples_file"])
    avg_strict = (levels["prompt_strict"] + levels["inst_strict"]) / 2
    avg_loose = (levels["prompt_loose"] + levels["inst_loose"]) / 2
    gsm = record["tasks"]["gsm8k"]
    print(f"documents: IFEval {record['tasks']['ifeval']['docs']}, GSM8K {gsm['docs']}; {time.time() - start:.0f} s")
    print(f"{'benchmark':44s} {'Rufus':>8s} {'card':>8s}")
    print(f"{'IFEval avg(prompt, inst) strict':44s} {avg_strict:8.1f} {CARD['ifeval_avg_prompt_inst']:8.1f}")
    print(f"{'IFEval avg(prompt, inst) loose':44s} {avg_loose:8.1f} {CARD['ifeval_avg_prompt_inst']:8.1f}")
    for key, value in levels.items():
        print(f"{'  IFEval ' + key:44s} {value:8.1f}")
    print(f"{'GSM8K (Rufus 0-shot chat; card 5-shot)':44s} {100 * gsm['value']:8.1f} {CARD['gsm8k_5shot']:8.1f}"
          f"   (stderr {100 * (gsm['stderr'] or 0):.1f})")
    print(f"run folder: {work / 'run'}")


if __name__ == "__main__":
    main()

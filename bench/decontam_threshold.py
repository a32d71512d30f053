"""How the MinHash containment threshold of decontam was chosen (numbers in docs/decontam.md).

GSM8K test and MATH-500 problems of >= 15 words are rewritten so that no 8-gram survives (one
word in five changed) and planted into GSM8K train / Code Alpaca rows; clean data (Code
Alpaca vs GSM8K test, MBPP vs HumanEval, GSM8K train vs GSM8K test) is scanned the same way.
The scan runs at a low containment floor (0.3) and the table shows, per threshold, the recall
of the rewritten items and the rows that the MinHash stage alone would flag on clean data."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from decontam_planting import no_ngram_survives, shared_ngrams

from rufus_data.base.paths import data_root
from rufus_data.benchmarks import load_benchmarks
from rufus_data.decontam import DecontamConfig, build_eval_index, scan_table


def main() -> None:
    root = data_root()

    def jsonl(path):
        with open(root / path) as fh:
            return [json.loads(line) for line in fh]

    def table(rows, src):
        return pa.Table.from_pylist([{"id": f"{src}-{i}", "source": src, "label": src, "messages": m}
                                     for i, m in enumerate(rows)])

    gsm = [[{"role": "user", "content": r["question"]}, {"role": "assistant", "content": r["answer"]}]
           for r in jsonl("gsm8k/train.jsonl")]
    alpaca = [[{"role": "user", "content": r["instruction"] + ("\n" + r["input"] if r["input"] else "")},
               {"role": "assistant", "content": r["output"]}] for r in jsonl("code_alpaca_2k/code_alpaca_2k.jsonl")]
    mbpp = [[{"role": "user", "content": r["prompt"]}, {"role": "assistant", "content": r["code"]}]
            for r in jsonl("mbpp_sanitized/sanitized-mbpp.jsonl")]
    config = DecontamConfig(containment=0.3)
    items = load_benchmarks(["gsm8k", "math500"]).items
    index = build_eval_index(items, config)
    rng = random.Random(1)
    pick = rng.sample([i for i, it in enumerate(items) if len(it.problems[0].split()) >= 15], 300)
    rows, planted = [], []
    for j, i in enumerate(pick):
        base = gsm[rng.randrange(len(gsm))] if j % 2 == 0 else alpaca[rng.randrange(len(alpaca))]
        text = no_ngram_survives(items[i].problems[0], rng)
        if shared_ngrams(items[i].problems[0], text) == 0:
            planted.append((len(rows), i))
            rows.append([{"role": "user", "content": text}, base[1]])
    best = {(c.row, c.item): c.containment for c in scan_table(table(rows, "planted"), index, 0)}
    scores = [best.get(key, 0.0) for key in planted]
    clean = []
    for name, data, bench in [("Code Alpaca vs GSM8K", alpaca, ["gsm8k"]), ("MBPP vs HumanEval", mbpp, ["humaneval"]),
                              ("GSM8K train vs GSM8K test", gsm, ["gsm8k"])]:
        idx = build_eval_index(load_benchmarks(bench).items, config)
        per_row: dict[int, float] = {}
        for c in scan_table(table(data, "clean"), idx, 0):
            if not c.problem_grams:
                per_row[c.row] = max(per_row.get(c.row, 0.0), c.containment)
        clean.append((name, per_row))
    print(f"{len(planted)} rewritten items with no surviving 8-gram; LSH b={index.minhash.lsh.b} r={index.minhash.lsh.r}")
    print("| containment >= | recall | " + " | ".join(name for name, _ in clean) + " |")
    for threshold in (0.4, 0.5, 0.55, 0.6, 0.65, 0.7):
        recall = sum(s >= threshold for s in scores) / len(scores)
        flagged = [sum(v >= threshold for v in per_row.values()) for _, per_row in clean]
        print(f"| {threshold:.2f} | {recall:.1%} | " + " | ".join(str(f) for f in flagged) + " |")


if __name__ == "__main__":
    main()

"""Run the tulu3_mini pipeline (sft -> dpo -> reasoning_rl on GSM8K) on CPU and print its table.

    RUFUS_DATA_ROOT=/work/shared/data .venv/bin/python bench/tulu3_mini.py [--work DIR]

Builds the three shard folders from the raw GSM8K train file (disjoint slices for sft / pairs /
RL prompts), then runs catalogs/pipelines/tulu3_mini.yaml, whose table comes from rufus-eval's
`quick` suite on GSM8K test problems. The budget is 20 minutes on a 2-core CPU; the script says
whether it was met."""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from rufus_train import examples
from rufus_train.pipeline import load_pipeline, run_pipeline

BUDGET_S = 20 * 60


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--work", default="runs/tulu3_mini_bench", help="folder for shards and runs")
    args = parser.parse_args()
    data_root = Path(os.environ.get("RUFUS_DATA_ROOT", "/work/shared/data"))
    work = Path(args.work)
    shards = work / "shards"
    # disjoint train slices, so no stage sees another stage's problems
    examples.gsm8k_sft(data_root, shards / "gsm8k_sft", start=0, limit=320, max_chars=500)
    examples.gsm8k_preference(data_root, shards / "gsm8k_pref", start=2000, limit=60, max_chars=500)
    examples.gsm8k_rl(data_root, shards / "gsm8k_rl", start=4000, limit=64, max_chars=400)
    os.environ["RUFUS_SHARDS"] = str(shards)
    pipeline = load_pipeline("catalogs/pipelines/tulu3_mini.yaml")
    pipeline.output_dir = str(work / "runs")
    started = time.time()
    run_pipeline(pipeline)
    total = time.time() - started
    verdict = "within" if total < BUDGET_S else "OVER"
    print(f"tulu3_mini: {total / 60:.1f} min for {len(pipeline.stages)} stages + evaluations ({verdict} the 20 min budget)")


if __name__ == "__main__":
    main()

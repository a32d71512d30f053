"""Run the tulu3_mini pipeline (the Tulu 3 mini notebook: sft -> dpo -> RLVR on GSM8K under one
system prompt) on CPU and print its stage table.

    RUFUS_DATA_ROOT=/work/shared/data .venv/bin/python bench/tulu3_mini.py [--work DIR]

The pipeline builds each stage's rows from GSM8K train (catalogs/data/tulu3_mini_*.yaml, offline
from $RUFUS_DATA_ROOT), evaluates the base and every stage greedily on the same 24 GSM8K test
problems with the `tulu3_mini` suite, and ends with the merged model in WORK/merged. The budget
is an hour on a 2-core CPU (40 + 24 + 12 steps and four evaluations); the script says whether it
was met."""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from rufus_train.pipeline import load_pipeline, run_pipeline

BUDGET_S = 60 * 60
PIPELINE = Path(__file__).resolve().parents[1] / "catalogs" / "pipelines" / "tulu3_mini.yaml"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--work", default="runs/tulu3_mini_bench", help="the pipeline's output folder")
    args = parser.parse_args()
    if not os.environ.get("RUFUS_DATA_ROOT"):
        raise SystemExit("set RUFUS_DATA_ROOT to the shared data folder (the catalogs' offline fallbacks read it)")
    pipeline = load_pipeline(PIPELINE)
    pipeline.output_dir = str(Path(args.work))
    started = time.time()
    rows = run_pipeline(pipeline)
    total = time.time() - started
    verdict = "within" if total < BUDGET_S else "OVER"
    for row in rows:
        print({k: v for k, v in row.items() if k != "model"})
    print(f"tulu3_mini: {total / 60:.1f} min for {len(pipeline.stages)} stages + evaluations ({verdict} the "
          f"{BUDGET_S // 60} min budget)")


if __name__ == "__main__":
    main()

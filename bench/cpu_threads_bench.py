"""The CLIs' CPU thread defaults (rufus_data/base/cpu_threads.py), measured: the same short torch job
(built-in model: greedy generation, then forward + backward steps) with OpenMP's defaults and with
Rufus's (OMP_WAIT_POLICY=PASSIVE, OMP_NUM_THREADS = usable cores), alone and next to a busy
neighbour: a one-core busy loop (any other job), and a second copy of the same torch job (two
Rufus commands at once). Each figure is the job's wall time in a fresh process (the model load
excluded); the ratio is OpenMP's default over Rufus's, measured in the same run.

    .venv/bin/python bench/cpu_threads_bench.py [--tokens 16] [--steps 2] [--repeat 1]

Measured 2026-12-01 on the shared 2-core dev machine (load about 4 from other jobs throughout),
--tokens 32 --steps 4 --repeat 2, seconds per job, OpenMP default vs Rufus's defaults:
alone 87.3 vs 35.2 (2.48x), next to a busy loop 83.2 vs 37.4 (2.23x), next to a second torch job
109.0 vs 39.3 (2.78x).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from rufus_data.base.cpu_threads import cpu_thread_defaults, usable_cores
from rufus_data.models.reference import ModelRef

JOB = r"""
import json, sys, time
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
path, tokens, steps, loop = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "loop"
tokenizer = AutoTokenizer.from_pretrained(path)
model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Count from one to twenty in words."}],
                                       add_generation_prompt=True, return_tensors="pt", return_dict=True)
batch = tokenizer(["The quick brown fox jumps over the lazy dog. " * 12] * 4, return_tensors="pt")
optimizer = torch.optim.SGD(model.parameters(), lr=1e-6)
while True:
    started = time.perf_counter()
    with torch.no_grad():
        model.generate(**prompt, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False)
    for _ in range(steps):
        loss = model(**batch, labels=batch["input_ids"]).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    seconds = time.perf_counter() - started
    if not loop:
        print(json.dumps({"seconds": seconds, "threads": torch.get_num_threads()}))
        break
"""
BUSY_LOOP = "while True: pass"
OPENMP_KEYS = ("OMP_WAIT_POLICY", "OMP_NUM_THREADS")


def environment(rufus_defaults: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in OPENMP_KEYS}
    if rufus_defaults:
        cpu_thread_defaults(env)
    return env


def run_job(model: str, args, env: dict[str, str], neighbour: str) -> dict:
    """One timed job in a fresh process, with `neighbour` running beside it: none, busy, torch."""
    others = []
    if neighbour == "busy":
        others.append(subprocess.Popen([sys.executable, "-c", BUSY_LOOP]))
    elif neighbour == "torch":
        others.append(subprocess.Popen([sys.executable, "-c", JOB, model, str(args.tokens), str(args.steps), "loop"],
                                       env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        time.sleep(15)  # let it load its model and start computing
    try:
        out = subprocess.run([sys.executable, "-c", JOB, model, str(args.tokens), str(args.steps), "once"], env=env,
                             capture_output=True, text=True, check=True, timeout=1800)
    finally:
        for other in others:
            other.kill()
            other.wait()
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=16, help="greedy tokens generated per job")
    parser.add_argument("--steps", type=int, default=2, help="forward + backward steps per job")
    parser.add_argument("--repeat", type=int, default=1, help="runs per cell (the best is shown)")
    args = parser.parse_args()
    model = ModelRef.of("smollm2-135m").folder()
    print(f"usable cores: {usable_cores()}; load before: {os.getloadavg()[0]:.2f}; "
          f"Rufus's defaults here: {cpu_thread_defaults({})}")
    print(f"{'neighbour':<12} {'OpenMP default s':>17} {'Rufus default s':>16} {'default / Rufus':>16}")
    for neighbour in ("none", "busy", "torch"):
        cells = {}
        for rufus_defaults in (False, True):
            runs = [run_job(model, args, environment(rufus_defaults), neighbour) for _ in range(args.repeat)]
            cells[rufus_defaults] = min(r["seconds"] for r in runs)
        print(f"{neighbour:<12} {cells[False]:>17.2f} {cells[True]:>16.2f} {cells[False] / cells[True]:>15.2f}x",
              flush=True)


if __name__ == "__main__":
    main()

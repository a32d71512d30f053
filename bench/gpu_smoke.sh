#!/usr/bin/env bash
# The GPU paths of Rufus on one GPU machine, in under 8 minutes; prints one table and exits
# non-zero when any step fails (every step runs; a failed step shows its log's tail).
#
#   RUFUS_DATA_ROOT=/path/to/shared/data bash bench/gpu_smoke.sh [--dry-run | --precheck]
#
# It first checks what it needs (a GPU, a CUDA torch, the packages of the `gpu` extra: vllm in TRL's
# range, kernels, deepspeed, lm-eval; async GRPO's attention kernel in the cache; RUFUS_DATA_ROOT,
# curl) and prints a table of each, what is missing and the command that installs it; with anything
# missing it stops there (exit 2), so a run never looks green without proving the paths it names.
# --precheck prints that table only. A step that cannot run because an earlier one failed (the
# resume without its checkpoint) is "skip", with why; any skip or failure makes the exit non-zero.
# Steps (the built-in model, tiny settings, all on GPU $GPU):
#   serve         `rufus-train serve` for the built-in model (the GRPO server, 25% of the GPU)
#   sync_grpo     synchronous GRPO in vLLM server mode, 5 steps (weights pushed to the server over NCCL)
#   async_grpo    async GRPO, 3 steps, then resumed from checkpoint-3 (rollout_state.json) to step 5
#   ckpt_eval     SFT with checkpoint evaluation through a vLLM eval server (20% of the GPU): three
#                 processes on one GPU (GRPO server, trainer, eval server)
#   eval_agree    `rufus-eval suite quick --backend vllm` and `--backend hf` on the same 16 items:
#                 each task's scores agree within sampling noise (3 standard errors)
#   full_ft       `rufus-train stage sft_full`, 5 steps of full fine-tuning at dtype auto: the checkpoint's
#                 weights and AdamW states are fp32 and the trainer computed in bf16 (fp32 masters)
#   resume_killed the same stage with `--resume_from_checkpoint latest`, killed (SIGKILL, whole process
#   resume_latest group) once checkpoint-6 is written, then the same command again: it resumes from the
#                 newest complete checkpoint and ends at step 30 with no step logged twice
#   zero3         `--num_processes 1 --accelerate_config zero3` (DeepSpeed ZeRO-3) with checkpoint
#                 evaluation (hf backend): the sharded checkpoints consolidated and evaluated at steps 2, 4
#                 (deepspeed comes with the gpu extra; the pre-check stops the run without it)
# --dry-run prints every command (shell-quoted, with its environment) and runs nothing;
# tests/test_distributed_setup.py parses each printed command with Rufus's own CLIs.
# Note: NCCL refuses two ranks on one GPU on some versions ("Duplicate GPU detected"); the weight
# sync of sync_grpo / async_grpo then fails here although it runs with the server on its own GPU.
set -uo pipefail

DRY=0 PRECHECK_ONLY=0
[[ "${1:-}" == "--dry-run" ]] && DRY=1
[[ "${1:-}" == "--precheck" ]] && PRECHECK_ONLY=1
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-$REPO/.venv/bin/python}"
WORK="${WORK:-/tmp/rufus-gpu-smoke}"
GPU="${GPU:-0}"
PORT="${PORT:-8000}"
MODEL="smollm2-135m"
SERVER="http://127.0.0.1:$PORT"
BUDGET_S=480
# the eval server's share of the GPU: rufus-eval starts vLLM with this command line
EVAL_VLLM="$PY -m vllm.entrypoints.openai.api_server --gpu-memory-utilization 0.2"
TINY_GRPO=(--data "$WORK/rl" --max_completion_length 64 --num_generations 4 --per_device_train_batch_size 8
           --logging_steps 1 --overwrite)
ROWS=()
FAILED=0
START=$(date +%s)

run() {  # run NAME CMD... : one step, logged to $WORK/NAME.log
  local name=$1; shift
  if (( DRY )); then printf '[%s]' "$name"; printf ' %q' "$@"; echo; return 0; fi
  local t0=$SECONDS
  "$@" >"$WORK/$name.log" 2>&1
  local code=$?
  echo "$name: exit $code after $((SECONDS - t0)) s (log $WORK/$name.log)"
  return $code
}

record() {  # record NAME STATUS SECONDS DETAIL
  ROWS+=("$(printf '| %-13s | %-4s | %5s | %s |' "$1" "$2" "$3" "$4")")
  [[ "$2" == FAIL || "$2" == skip ]] && FAILED=1
  if [[ "$2" == FAIL && -f "$WORK/$1.log" ]]; then echo "--- $1 failed; last lines of its log:"; tail -n 25 "$WORK/$1.log"; fi
}

step() {  # step NAME DETAIL CHECK-CMD -- RUN-CMD... : run, then PASS when both the run and CHECK succeed
  local name=$1 detail=$2 check=$3; shift 4
  local t0=$SECONDS
  if (( DRY )); then run "$name" "$@"; record "$name" dry 0 "$detail"; return; fi
  if [[ -n "${SKIP_WHY:-}" ]]; then record "$name" skip 0 "$detail: skipped, $SKIP_WHY"; SKIP_WHY=; return; fi
  if run "$name" "$@" && eval "$check"; then record "$name" PASS $((SECONDS - t0)) "$detail"
  else record "$name" FAIL $((SECONDS - t0)) "$detail"; fi
}

global_step() { "$PY" -c "import json,sys; print(json.load(open(sys.argv[1]))['global_step'])" "$1" 2>/dev/null; }

# A checkpoint of full fine-tuning at dtype auto: fp32 weights and AdamW states (the masters), trained
# with bf16 autocast. Read by `"$PY" - CHECKPOINT <<<"$FP32_MASTERS"`.
FP32_MASTERS='
import sys, torch
from safetensors import safe_open
ckpt = sys.argv[1]
with safe_open(f"{ckpt}/model.safetensors", "pt") as f:
    weights = {f.get_slice(k).get_dtype() for k in f.keys()}
state = torch.load(f"{ckpt}/optimizer.pt", map_location="cpu", weights_only=True)["state"]
adam = {str(s[k].dtype) for s in state.values() for k in ("exp_avg", "exp_avg_sq")}
bf16 = torch.load(f"{ckpt}/training_args.bin", weights_only=False).bf16
print(f"weights {sorted(weights)}, AdamW states {sorted(adam)}, bf16 autocast {bf16}")
sys.exit(0 if weights == {"F32"} and adam == {"torch.float32"} and bf16 else 1)
'
# metrics.jsonl of a resumed run: every logged training step once (`"$PY" - FILE <<<"$STEPS_ONCE"`).
STEPS_ONCE='
import json, sys
steps = [json.loads(line)["step"] for line in open(sys.argv[1]) if "loss" in json.loads(line)]
print(f"{len(steps)} loss lines, steps {steps[0]}..{steps[-1]}")
sys.exit(0 if len(steps) == len(set(steps)) else 1)
'


# ------------------------------------------------------------------ pre-check: what the steps need
# One line per need: ok/MISSING, what, detail. The packages are the `gpu` extra's (pyproject.toml).
INSTALL_TORCH="$PY -m pip install torch==2.13.0   # the CUDA build (plain PyPI serves it on Linux x86-64)"
INSTALL_GPU="$PY -m pip install -c $REPO/constraints.txt -e \"$REPO[gpu]\""
PRECHECK='
import importlib.util, os, shutil, subprocess, sys
from importlib.metadata import PackageNotFoundError, version
rows = []
def need(ok, what, detail): rows.append(("ok" if ok else "MISSING", what, detail))
smi = shutil.which("nvidia-smi")
gpus = subprocess.run([smi, "-L"], capture_output=True, text=True).stdout.strip().splitlines() if smi else []
need(bool(gpus), "GPU", gpus[0] + (f" (+{len(gpus) - 1} more)" if len(gpus) > 1 else "") if gpus
     else "nvidia-smi -L lists none" if smi else "no nvidia-smi: no NVIDIA driver on this machine")
cuda = False
try:
    import torch
    cuda = torch.cuda.is_available()
    backend = torch.version.cuda or torch.version.hip or "none: a CPU build"
    need(cuda, "CUDA torch", f"torch {torch.__version__}, CUDA {backend}"
         + ("" if cuda else ": no CUDA device visible: install-torch below (on a GPU machine)"))
except ImportError:
    need(False, "CUDA torch", "torch is not installed: install-torch below")
def package(name, why, low=None, high=None):
    try:
        have = version(name)
    except PackageNotFoundError:
        return need(False, name, f"not installed ({why}): install-gpu below")
    from packaging.version import Version
    base = Version(Version(have).base_version)
    inside = (low is None or base >= Version(low)) and (high is None or base <= Version(high))
    need(inside, name, f"{have} ({why})" + ("" if inside else f": TRL supports {low} to {high}: install-gpu below"))
package("vllm", "every vLLM step", "0.22.0", "0.31.0")
package("trl", "sync and async GRPO")
package("aiohttp", "async GRPO rollout worker")
package("kernels", "async GRPO attention kernel")
package("deepspeed", "zero3")
package("lm_eval", "eval steps")
package("rufus", "the CLIs")
if cuda and importlib.util.find_spec("kernels"):
    from rufus_train.grpo.attention_kernel import cached_kernel, tree_attention_kernel
    repo, v = tree_attention_kernel()
    path = cached_kernel()
    offline = os.environ.get("HF_HUB_OFFLINE") == "1"
    need(path is not None or not offline, "attention kernel", f"{repo} v{v} cached at {path}" if path else
         f"{repo} v{v} not cached: " + ("HF_HUB_OFFLINE=1, so async GRPO cannot fetch it: run `rufus-train prefetch` "
         "online first" if offline else "async GRPO fetches it on first use (online); `rufus-train prefetch` caches it"))
else:
    need(False, "attention kernel", "not checked: needs CUDA and kernels (above)")
need(bool(os.environ.get("RUFUS_DATA_ROOT")), "RUFUS_DATA_ROOT", os.environ.get("RUFUS_DATA_ROOT") or
     "not set: the quick suite reads its data there (export RUFUS_DATA_ROOT=/path/to/shared/data)")
need(shutil.which("curl") is not None, "curl", shutil.which("curl") or "not installed: the server readiness poll uses it")
for row in rows: print("\t".join(row))
'
precheck() {  # prints the pre-check table; returns non-zero when anything is missing
  local lines
  if [[ ! -x "$PY" ]]; then
    echo "pre-check: no Python at $PY (set PYTHON=..., or create the environment: make venv, then the install below)"
    lines="MISSING"$'\t'"python"$'\t'"$PY does not exist"
  else
    lines="$("$PY" - <<<"$PRECHECK" 2>&1)"
  fi
  echo "| need             | ok      | detail |"
  echo "|------------------|---------|--------|"
  local missing=0 ok what detail
  while IFS=$'\t' read -r ok what detail; do
    [[ -z "$what" ]] && { echo "| (pre-check)      | MISSING | $ok |"; missing=1; continue; }
    printf '| %-16s | %-7s | %s |\n' "$what" "$ok" "$detail"
    [[ "$ok" == MISSING ]] && missing=1
  done <<<"$lines"
  if (( missing )); then
    echo
    echo "missing: install-torch: $INSTALL_TORCH"
    echo "         install-gpu:   $INSTALL_GPU"
    echo "         (offline GPU machine: run \`$PY -m rufus_train.cli prefetch\` once while online)"
  fi
  return $missing
}

if (( PRECHECK_ONLY )); then precheck && exit 0; exit 2; fi
if (( ! DRY )); then
  precheck || { echo "pre-check: something the steps need is missing (above): nothing run"; exit 2; }
fi
mkdir -p "$WORK"
if (( ! DRY )); then
  "$PY" - "$WORK/rl" <<'EOF'
import sys
from pathlib import Path
import pyarrow as pa
from rufus_data.folders.shards import write_shards
rows = [{"id": f"add-{a}-{b}", "source": "generated", "label": "arithmetic", "expected_output": str(a + b),
         "prompt": [{"role": "user", "content": f"What is {a} + {b}? Answer with just the number."}]}
        for a in range(1, 5) for b in range(1, 5)]
write_shards(pa.Table.from_pylist(rows), Path(sys.argv[1]))
EOF
  "$PY" - "$WORK/sft" <<'EOF'
import sys
from pathlib import Path
import pyarrow as pa
from rufus_data.folders.shards import write_shards
rows = [{"id": f"sft-{a}-{b}", "source": "generated", "label": "arithmetic",
         "messages": [{"role": "user", "content": f"What is {a} times {b}?"},
                      {"role": "assistant", "content": f"{a} times {b} is {a * b}."}]}
        for a in range(1, 17) for b in range(1, 9)]
write_shards(pa.Table.from_pylist(rows), Path(sys.argv[1]))
EOF
fi
export OMP_NUM_THREADS=4

# ------------------------------------------------------------------ the GRPO server
if (( DRY )); then
  run serve "$PY" -m rufus_train.cli serve "$MODEL" --devices "$GPU" --port "$PORT" --max-model-len 2048 \
      --gpu-memory-utilization 0.25 --lora-rank 4
  record serve dry 0 "vLLM at $SERVER"
else
  t0=$SECONDS
  "$PY" -m rufus_train.cli serve "$MODEL" --devices "$GPU" --port "$PORT" --max-model-len 2048 \
      --gpu-memory-utilization 0.25 --lora-rank 4 >"$WORK/serve.log" 2>&1 &
  SERVER_PID=$!
  trap '[[ -n "${SERVER_PID:-}" ]] && kill "$SERVER_PID" 2>/dev/null' EXIT
  until curl -sf "$SERVER/v1/models" >/dev/null; do
    if ! kill -0 "$SERVER_PID" 2>/dev/null || (( SECONDS - t0 > 240 )); then break; fi
    sleep 2
  done
  if curl -sf "$SERVER/v1/models" >/dev/null; then record serve PASS $((SECONDS - t0)) "vLLM up at $SERVER"
  else record serve FAIL $((SECONDS - t0)) "vLLM did not answer /v1/models"; fi
fi

# ------------------------------------------------------------------ GRPO against it
step sync_grpo "5 steps, vllm_server mode" '[[ "$(global_step "$WORK/sync/run.json")" == 5 ]]' -- \
  "$PY" -m rufus_train.cli stage reasoning_rl "${TINY_GRPO[@]}" --output_dir "$WORK/sync" --vllm_server "$SERVER" \
  --max_steps 5 --save_steps 5

step async_grpo "3 steps" '[[ -f "$WORK/async/checkpoint-3/rollout_state.json" ]]' -- \
  "$PY" -m rufus_train.cli stage reasoning_rl "${TINY_GRPO[@]}" --output_dir "$WORK/async" --grpo_execution async \
  --vllm_server "$SERVER" --max_steps 3 --save_steps 3
(( DRY )) || [[ -f "$WORK/async/checkpoint-3/rollout_state.json" ]] || SKIP_WHY="async_grpo wrote no checkpoint-3"
step async_resume "resumed from checkpoint-3 to step 5" '[[ "$(global_step "$WORK/async/run.json")" == 5 ]]' -- \
  "$PY" -m rufus_train.cli stage reasoning_rl --data "$WORK/rl" --max_completion_length 64 --num_generations 4 \
  --per_device_train_batch_size 8 --logging_steps 1 --output_dir "$WORK/async" --grpo_execution async \
  --vllm_server "$SERVER" --max_steps 5 --save_steps 5 --resume_from_checkpoint "$WORK/async/checkpoint-3"

# ------------------------------------------------------------------ checkpoint evaluation beside them
step ckpt_eval "baseline + checkpoints 2, 4 via vLLM" \
  '[[ -f "$WORK/ckpt/eval_logs/step-0/results.json" && -f "$WORK/ckpt/eval_logs/step-4/results.json" ]]' -- \
  env RUFUS_VLLM_COMMAND="$EVAL_VLLM" "$PY" -m rufus_train.cli stage sft --output_dir "$WORK/ckpt" --overwrite \
  --max_rows 32 --max_steps 4 --save_steps 2 --per_device_train_batch_size 2 --max_length 256 --logging_steps 1 \
  --eval.eval_on_checkpoint --eval.backend vllm --devices.eval "$GPU" --eval.suite quick --eval.limit 16 \
  --eval.repeats 1 --eval.max_tokens 128

# ------------------------------------------------------------------ vllm vs hf on the same items
QUICK=(suite quick --ckpt "$MODEL" --limit 16 --repeats 2 --max-tokens 256)
step eval_vllm "quick on 16 items, vLLM" '[[ -f "$WORK/eval_vllm/results.json" ]]' -- \
  env RUFUS_VLLM_COMMAND="$EVAL_VLLM" "$PY" -m rufus_eval.cli "${QUICK[@]}" --backend vllm --devices "$GPU" \
  --out "$WORK/eval_vllm"
step eval_hf "quick on the same items, transformers" '[[ -f "$WORK/eval_hf/results.json" ]]' -- \
  env CUDA_VISIBLE_DEVICES="$GPU" "$PY" -m rufus_eval.cli "${QUICK[@]}" --backend hf --out "$WORK/eval_hf"
(( DRY )) || [[ -f "$WORK/eval_vllm/results.json" && -f "$WORK/eval_hf/results.json" ]] \
  || SKIP_WHY="eval_vllm or eval_hf wrote no results.json"
step eval_agree "quick, 16 items: vllm vs hf within 3 standard errors" true -- \
  "$PY" - "$WORK/eval_vllm/results.json" "$WORK/eval_hf/results.json" <<'EOF'
import json, math, sys
a, b = (json.load(open(path))["tasks"] for path in sys.argv[1:3])
bad = []
for task in sorted(a):
    x, y = a[task], b[task]
    noise = 3 * math.hypot(x["stderr"] or 0.0, y["stderr"] or 0.0) + 1e-9
    agree = abs(x["value"] - y["value"]) <= max(noise, 1 / 16)  # at least one item's worth
    print(f"{task}: vllm {x['value']:.4f} ± {x['stderr']:.4f}, hf {y['value']:.4f} ± {y['stderr']:.4f}: "
          f"{'agree' if agree else 'DIFFER'}")
    bad += [] if agree else [task]
sys.exit(1 if bad else 0)
EOF

# ------------------------------------------------------------------ full fine-tuning: fp32 masters, kill -9, resume
FULL=(--data "$WORK/sft" --max_length 256 --per_device_train_batch_size 4 --gradient_accumulation_steps 1
      --logging_steps 1)
step full_ft "sft_full, 5 steps at dtype auto: fp32 weights and AdamW states, bf16 autocast" \
  '"$PY" - "$WORK/full/checkpoint-5" <<<"$FP32_MASTERS"' -- \
  "$PY" -m rufus_train.cli stage sft_full "${FULL[@]}" --output_dir "$WORK/full" --overwrite --max_steps 5 --save_steps 5

# one command line for the first run and every restart, as a scheduler re-runs it
RESUMABLE=("$PY" -m rufus_train.cli stage sft_full "${FULL[@]}" --output_dir "$WORK/resume" --max_steps 30
           --save_steps 3 --trainer.save_total_limit 2 --resume_from_checkpoint latest)
if (( DRY )); then
  run resume_killed "${RESUMABLE[@]}"; record resume_killed dry 0 "killed with SIGKILL after checkpoint-6"
  run resume_latest "${RESUMABLE[@]}"; record resume_latest dry 0 "the same command resumes to step 30"
else
  t0=$SECONDS
  rm -rf "$WORK/resume"
  setsid "${RESUMABLE[@]}" >"$WORK/resume_killed.log" 2>&1 &
  KILLED_PID=$!
  until [[ -f "$WORK/resume/checkpoint-6/trainer_state.json" ]] || ! kill -0 "$KILLED_PID" 2>/dev/null \
        || (( SECONDS - t0 > 240 )); do sleep 0.5; done
  kill -9 -- "-$KILLED_PID" 2>/dev/null
  wait "$KILLED_PID" 2>/dev/null
  if [[ -f "$WORK/resume/checkpoint-6/trainer_state.json" && ! -f "$WORK/resume/run.json" ]]; then
    record resume_killed PASS $((SECONDS - t0)) "killed with SIGKILL after checkpoint-6"
  else record resume_killed FAIL $((SECONDS - t0)) "no checkpoint-6 before the kill, or the run ended first"; fi
  [[ -f "$WORK/resume/checkpoint-6/trainer_state.json" ]] || SKIP_WHY="no checkpoint-6 to resume from"
  step resume_latest "the same command resumes to step 30, no step logged twice" \
    '[[ "$(global_step "$WORK/resume/run.json")" == 30 ]] && "$PY" - "$WORK/resume/metrics.jsonl" <<<"$STEPS_ONCE"' -- \
    "${RESUMABLE[@]}"
fi

# ------------------------------------------------------------------ DeepSpeed ZeRO-3 with checkpoint evaluation
ZERO3=("$PY" -m rufus_train.cli stage sft_full "${FULL[@]}" --output_dir "$WORK/zero3" --overwrite --max_steps 4
       --save_steps 2 --num_processes 1 --accelerate_config zero3 --eval.eval_on_checkpoint --eval.backend hf
       --devices.eval "$GPU" --eval.suite quick --eval.limit 8 --eval.repeats 1 --eval.max_tokens 64)
step zero3 "ZeRO-3, 4 steps; checkpoints 2 and 4 consolidated and evaluated" \
  '[[ "$(global_step "$WORK/zero3/run.json")" == 4 && -f "$WORK/zero3/eval_logs/step-2/results.json"
     && -f "$WORK/zero3/eval_logs/step-4/results.json" ]]' -- "${ZERO3[@]}"

# ------------------------------------------------------------------ the table
TOTAL=$(( $(date +%s) - START ))
echo
echo "| step          | ok   |   s   | what (skip: why) |"
echo "|---------------|------|-------|------|"
printf '%s\n' "${ROWS[@]}"
echo "total ${TOTAL} s (budget ${BUDGET_S} s); work folder $WORK"
if (( DRY )); then exit 0; fi
(( TOTAL > BUDGET_S )) && { echo "over the 8-minute budget"; FAILED=1; }
exit $FAILED

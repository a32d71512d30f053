"""FSDP2 on CPU with Rufus's checkpoint evaluation, run under torchrun (gloo).

accelerate 1.15 enables FSDP only for accelerator process groups: on CPU its processes become
MULTI_CPU and train plain DDP (rufus_train/launch.py refuses that launch). So this script builds
what transformers + accelerate would build on GPUs: `fully_shard` on every decoder layer and on the
model, one AdamW step, and a SHARDED_STATE_DICT checkpoint written by accelerate's own
`save_fsdp_model`; then every rank calls the callback's `on_train_begin` / `on_save`, as the
Trainer does. Rank 0 also writes the reference: the full state dict gathered with
`get_model_state_dict(full_state_dict=True, cpu_offload=True)`, saved as a plain model folder.

    torchrun --nproc_per_node 2 tests/fsdp2_callback_run.py SPEC.json
    SPEC: {"model": folder, "out": run folder, "reference": folder, "eval": CheckpointEvalConfig}"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist
from accelerate import PartialState
from accelerate.utils import FullyShardedDataParallelPlugin
from accelerate.utils.fsdp_utils import save_fsdp_model
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import fully_shard
from transformers import AutoModelForCausalLM, AutoTokenizer

from rufus_eval.checkpoint_eval.callback import CheckpointEvalCallback


def main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    dist.init_process_group("gloo")
    PartialState(cpu=True)  # accelerate's state over that group: save_fsdp_model logs through it
    rank = dist.get_rank()
    torch.manual_seed(0)
    out = Path(spec["out"])
    tokenizer = AutoTokenizer.from_pretrained(spec["model"])
    model = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=torch.float32)
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    callback = CheckpointEvalCallback(spec["eval"], starting_model=spec["model"])
    args = SimpleNamespace(output_dir=str(out), report_to=[])
    state = SimpleNamespace(is_world_process_zero=rank == 0, global_step=0, log_history=[])
    callback.on_train_begin(args, state, SimpleNamespace(should_training_stop=False), model=model,
                            processing_class=tokenizer)

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batch = tokenizer([f"Rank {rank} says: the answer is {rank + 4}."], return_tensors="pt")
    model(**batch, labels=batch["input_ids"]).loss.backward()
    optimizer.step()
    state.global_step = 1

    checkpoint = out / "checkpoint-1"
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, state_dict_type="SHARDED_STATE_DICT")
    accelerator = SimpleNamespace(process_index=rank, num_processes=dist.get_world_size())
    save_fsdp_model(plugin, accelerator, model, str(checkpoint))  # what Trainer._save_checkpoint calls under FSDP
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        model.save_pretrained(spec["reference"], state_dict=full)
        tokenizer.save_pretrained(spec["reference"])
    dist.barrier()
    callback.on_save(args, state, SimpleNamespace(should_training_stop=True), model=model, processing_class=tokenizer)
    callback.on_train_end(args, state, SimpleNamespace(should_training_stop=True))
    (out / f"rank{rank}.json").write_text(json.dumps({
        "rank": rank, "jobs": callback.jobs, "logged": callback.logged, "staging": callback.staging,
        "shard_files": sorted(p.name for p in (checkpoint / "pytorch_model_fsdp_0").iterdir()),
        "env_rank": os.environ.get("RANK"),
    }))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])

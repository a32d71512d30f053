"""rufus_train: stage trainers (TRL + peft) on the shard folders rufus_data writes; one run folder
per stage. It builds on rufus_data (shards, models, rewards, generation) and rufus_eval
(checkpoint evaluation while training), never the reverse.

The run, start to end:
- cli.py: `rufus-train` (stage, stages, pipeline, export, plan, serve): thin wrappers;
  stage_help.py: `rufus-train stage NAME --help`, every key of the stage.
- config.py: the strict per-stage configs, the schema of catalogs/stages/NAME.yaml;
  config_loading.py: a config from its YAML and CLI overrides, and the resolved YAML --dry-run prints;
  trl_keys.py: which TRL fields Rufus sets, and TRL keys written outside `trainer:` taken into it;
  trl_spellings.py: TRL's names of stage keys (--model_name_or_path, --use_peft) taken with a note.
- guards.py: what is refused before any model or dataset loads.
- guidance.py: the Smol playbook's advice as config-time warnings (packing, preference epochs and rates).
- launch.py: `--num_processes N`: the stage starts `accelerate launch` itself.
- trl_args.py: a stage's TRL config: the fields every stage sets alike, its own, `trainer:` on top.
- data.py: what `data:` names (shard folders or catalogs, mixed first) and the rows read.
- runner.py: one stage run: guards -> run folder -> model -> LoRA -> dataset -> trainer -> run.json.
- stage_base.py: what a stage is (`Stage`, `StageContext`, `conversational`), on the ground floor.
- grpo/: what the GRPO stages share (its own docstring maps it), a floor of its own above
  stage_base.py; stages/: the stage registry above it, one module per stage (sft, dpo, kto,
  orpo, distill, online_dpo, the GRPO stages). grpo/ never imports stages/ (tests/test_layering.py).
- modeling.py: loading policies once, LoRA, merging adapters back.
- pipeline.py: `rufus-train pipeline`: stages in order, each evaluated.

Around the run:
- checkpoints.py, mirror.py, resume.py: complete checkpoints, a mirror on a second place, and
  where a run resumes from (exactly).
- weight_update.py, model_card.py: how far the weights moved; the run folder's README.md.
- step_progress.py: the console line after each logged step (its metrics, s/step, ETA), every stage's.
- divergence.py: a loss or grad norm that turns NaN or infinite stops the run, no model saved.
- run_summary.py: the table a stage ends with, train_curves.png, the tracker project and run name.
- push.py: `push_to_hub: ORG/NAME`: the run (or RUN/merged) uploaded after its card.
- mask.py: `--show-mask`: which tokens carry loss.
- serve.py: `rufus-train serve`, the vLLM server GRPO trains against.
- plan.py: `rufus-train plan`: how many GPUs a pretraining run needs.
- export.py: `rufus-train export RUN`: the adapter merged into a copy of its base."""

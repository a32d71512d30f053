"""GRPO in Rufus, one module per job. The stages built on it (reasoning_rl, coding_rl, if_rl,
rlhf and the agents) are registered from rufus_train/stages/, each a thin subclass.

- config.py: the keys every GRPO stage shares (`GRPOStageConfig`).
- stage.py: `GRPOStage`: checks before anything loads, the prompt dataset, rewards, tools, and
  the trainer (sync or async).
- trainer.py: the sync trainer, TRL's GRPOTrainer with the two below.
- dynamic_sampling.py: `RufusGRPOConfig` (the `trainer:` block's TRL config) and the sync
  trainer that masks or resamples prompt groups whose rewards carry no signal.
- filter_settings.py, prompt_filter.py: `filter:`, the stage's prompts filtered by its starting
  model (rufus-data filter) before it trains, which then trains on the learnable bucket.
- kl_penalty.py: the KL estimator a recipe names (`kl_estimator`), which TRL has no switch for.
- dead_groups.py: a step whose prompt groups all had equal rewards is said with its measured cause
  and fix; `stop_after_dead_steps` such steps in a row stop the run; the closing note of the share.
- async_checks.py: every configuration TRL's AsyncGRPOTrainer cannot run, refused up front.
- async_config.py: TRL's AsyncGRPOConfig from a stage config; async_trainer.py: the async trainer.
- attention_kernel.py: the kernel async GRPO packs with, its cache, `rufus-train prefetch`.
- rollout_failures.py: the rollout worker's death on the server's context-length 400, explained.
- length_checks.py: prompt plus completion against the server's or the model's context.
- rollout_state.py: where an async run resumes its rollouts.
- tools.py, search_index.py: the agent stages' tools and environments, and the offline BM25 index.

The vLLM server GRPO trains against is started by `rufus-train serve` (rufus_train/serve.py), on
the stage's `devices.server` (every role's GPUs: rufus_data/models/devices.py).
Nothing is imported here: torch and TRL load only with dynamic_sampling.py and async_trainer.py, when a
run starts."""

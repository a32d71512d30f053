"""Evaluate checkpoints while training runs, on other devices, without ever blocking or breaking it.

`CheckpointEvalCallback` (a transformers TrainerCallback, attached by every rufus-train stage with
`eval.eval_on_checkpoint`), one module per job:

- config.py: `CheckpointEvalConfig`, the stage's `eval` block: the evaluation request's settings
  (rufus_eval/request.py) and the schedule (baseline, wait at the end, keep staging).
- callback.py: the trainer events. Rank 0 only (`state.is_world_process_zero`); other ranks
  return at once and issue no collective. `on_train_begin` (with `eval_baseline`, on a fresh run)
  evaluates the starting model's own folder as `<tag>-checkpoint-0` (nothing is saved: under FSDP
  or ZeRO-3 rank 0 holds only shards); a resumed run has no baseline, and the resumed checkpoint's
  evaluation runs again when the stopped job started it and never finished. `on_save` stages the
  checkpoint and starts its evaluation; one evaluation at a time: a checkpoint arriving while one
  runs is skipped with a warning, the last checkpoint waits for the running evaluation instead
  (`wait_at_end`), and is awaited in its own `on_save`: transformers calls the trackers'
  `on_train_end` before ours, and TrackioCallback closes its run there.
- staged.py: the hard-link snapshot of each checkpoint, removed once evaluated, its disk use reported.
- process.py: `rufus-eval suite --request job.json` in a child process in its own session, given
  its request whole; stopped on every path, and with a killed trainer.
- curve.py: the results as `eval/<task>` on the `eval/step` axis: the training log,
  `eval_logs/metrics.jsonl`, a resumed run's curve.
- trackers.py: the same into W&B (`define_metric`) and trackio (`eval/step` in every record).

The evaluation's GPUs are the stage's `devices.eval` role (rufus_data/models/devices.py), physical ids
given verbatim to its CUDA_VISIBLE_DEVICES.

Nothing is imported here: a stage config reads config.py without loading transformers, which
callback.py needs (import `rufus_eval.checkpoint_eval.callback` for the callback)."""

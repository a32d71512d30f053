"""rufus_eval: lm-evaluation-harness suites with true avg@k, and evaluation of checkpoints while
training runs. It builds on rufus_data (benchmarks, rewards, the generation backends) and is
imported by rufus_train, never the reverse.

A suite run (`rufus-eval suite`):
- cli.py: `rufus-eval` (suite, compare, vibe, data pull): thin wrappers; lm_eval_spellings.py:
  lm-eval's options (--output_path, --model_args, --gen_kwargs) taken or refused with a note.
- request.py: one evaluation request (suite, tasks, overrides, backend, model), whoever asks:
  the command line, a checkpoint evaluation's job.json, a pipeline.
- runner.py: a suite's tasks through lm-eval, one model for all, results recorded; plan.py: how a run
  starts (backend, suite, tasks, step), and `--dry-run`'s plan of it.
- task_data.py: where a task's rows come from (rufus_data.benchmarks), and what to do when they
  are not here; tasks.py: a task as an lm-eval config over local JSON; native.py: lm-eval's own
  tasks under Rufus's scoring.
- lm_eval_models.py: hf, vllm or server, as lm-eval model classes that seed every sample.
- metrics.py: every one of the k samples scored by the suite's reward; judge.py: a judged task's
  judge pinned before anything is generated.
- suite_trackers.py: `--report_to wandb|trackio`, through lm-eval's own loggers.
- resume.py: a run's work folder, keyed by the request, so a killed run continues.
- results.py: results.json per run, and the table of all runs read from them (`rufus-eval results`);
  data_check.py: per task, whether the model's training data was checked against its benchmark.
- compare.py: runs side by side; paired.py: two runs paired on their documents; documents.py: a
  run's per-document scores from lm-eval's samples; stats.py: pass@k, standard errors, paired deltas.
- vibe.py: your own prompts, answered side by side; vibe_page.py: the answers as a page.
- replay.py: responses generated elsewhere (released outputs, gold solutions) scored through a
  task's own lm-eval config: the reference checks of docs/eval.md.

While training (attached by every rufus-train stage):
- checkpoint_eval/: `CheckpointEvalCallback`: evaluates checkpoints in another process, never
  blocking or breaking the run (its own docstring maps it).
- staging.py: what an evaluator loads, safe from checkpoint rotation."""

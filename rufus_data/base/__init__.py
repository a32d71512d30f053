"""base/: what every command of the three CLIs stands on. Imports nothing of rufus_data above it.

- redaction.py: credentials in URLs hidden wherever a URL is recorded or logged.
- errors.py: `RufusError` (bad input: one paragraph, exit 2), the warnings the CLIs handle, `quoted`
  (a user's value in a message, bounded) and `write_failure` (a full or read-only disk).
- console.py: the one rich console, errors as one paragraph, progress bars with rate and ETA.
- cli_options.py: typer options generated from a pydantic config model (`CliApp`, `Flag`);
  borrowed_options.py: TRL's and lm-eval's spellings of options, taken or refused with a note.
- yaml_config.py: strict YAML configs whose errors name the file, line and key; a step's settings
  given from Python (model, dict or YAML path).
- cpu_threads.py: OpenMP defaults set before torch loads; quiet_bars.py: third-party tqdm bars
  off when stderr is no terminal.
- ports.py: a free local TCP port, for a server or a launch Rufus starts.
- paths.py: where Rufus keeps things (the data root), files written or linked whole; cache.py:
  what `$RUFUS_CACHE` holds.
- catalog_files.py: where catalogs are (the user's own, then the shipped ones).
- version.py: the version every output records; env_report.py: `rufus-data env`.
- engines.py: independent tasks over a shard folder (in process, a process pool, Ray).
- report.py: markdown tables and figures; jsonl.py: JSON Lines, read once.
- lazy_exports.py: a data step's package names its entry points without loading them."""

"""Resumable generation: finished prompts are appended to a JSONL journal as they arrive.

The journal lives beside the output (`.OUT.partial/<role>-<config hash>.jsonl`), one line per
finished prompt with all its completions and rewards, flushed and fsynced. A run killed at any
point (even SIGKILL mid-line) and started again with the same configuration reads it back,
drops a torn last line, and generates only the prompts that are missing: no prompt twice, none
lost. A prompt scored again (its judge had failed) is appended again: the last line of a prompt wins. A different configuration hashes to a different file, so results never mix."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from rich.progress import ProgressColumn
from rich.text import Text

from rufus_data.base.console import progress
from rufus_data.generate.base import Generator, Prompt, PromptResult
from rufus_data.generate.sampling import SamplingParams


class Journal:
    def __init__(self, path: Path, config_hash: str):
        self.path = Path(path)
        self.config_hash = config_hash
        self.records: dict[str, dict] = {}
        self._load()

    def _load(self) -> None:
        if not self.path.exists():
            return
        good_bytes = 0
        with open(self.path, "rb") as fh:
            for line in fh:
                if not line.endswith(b"\n"):
                    break  # torn write of a killed run
                try:
                    record = json.loads(line)
                except ValueError:
                    break
                if record.get("config_hash") == self.config_hash:
                    self.records[record["prompt_id"]] = record  # the last: a prompt scored again
                good_bytes += len(line)
        if good_bytes < self.path.stat().st_size:
            with open(self.path, "r+b") as fh:
                fh.truncate(good_bytes)

    def __contains__(self, prompt_id: str) -> bool:
        return prompt_id in self.records

    def append(self, record: dict) -> None:
        record = {"prompt_id": record["prompt_id"], "config_hash": self.config_hash, **record}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as fh:
            fh.write(json.dumps(record, sort_keys=True) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        self.records[record["prompt_id"]] = record


class TokensPerSecond(ProgressColumn):
    """Generated tokens per second since the bar started."""

    def __init__(self):
        super().__init__()
        self.tokens = 0
        self.started = time.monotonic()

    def render(self, task) -> Text:
        elapsed = max(time.monotonic() - self.started, 1e-9)
        return Text(f"{self.tokens / elapsed:,.0f} tok/s", style="magenta")


def run_journaled(
    generator: Generator,
    prompts: Iterable[Prompt],
    sampling: SamplingParams,
    journal: Journal,
    to_record: Callable[[PromptResult], dict],
    description: str = "generating",
    show_progress: bool = True,
) -> dict:
    """Generate the prompts the journal lacks, turning each result into a record (score it there)
    and appending it at once; shows prompts/s and generated tokens/s. Returns timing figures."""
    prompts = list(prompts)
    todo = [p for p in prompts if p.id not in journal]
    tokens = TokensPerSecond()
    started = time.monotonic()
    generated_tokens = 0
    with progress("prompts", tokens) as bar:
        task = bar.add_task(description, total=len(prompts), completed=len(prompts) - len(todo), visible=show_progress)
        for result in generator.stream(todo, sampling):
            record = to_record(result)
            record["prompt_id"] = result.prompt.id
            record["pid"] = os.getpid()
            journal.append(record)
            tokens.tokens += result.num_tokens
            generated_tokens += result.num_tokens
            bar.advance(task)
    seconds = time.monotonic() - started
    return {
        "prompts_total": len(prompts),
        "prompts_resumed": len(prompts) - len(todo),
        "prompts_generated": len(todo),
        "generated_tokens": generated_tokens,
        "seconds": round(seconds, 3),
        "tokens_per_s": round(generated_tokens / seconds, 2) if seconds > 0 else None,
    }

"""Issue 47 item 13: a credential in a URL (`http://user:key@host`, `?api_key=...`) is written
nowhere: not in a manifest, dataset card, report, lock record, run config or log."""

from __future__ import annotations

import json
import logging
import sys

import pytest
from rl_prompts import NUMBER_REWARD, arithmetic_rows, write_rl_shards
from typer.testing import CliRunner

from rufus_data.base.console import console
from rufus_data.base.redaction import RedactingFormatter, redact, redact_text, redact_url
from rufus_data.cli import app as data_app
from rufus_data.folders import output_lock

SECRET = "s3cr3tKEY"


@pytest.mark.parametrize(("url", "shown"), [
    (f"http://user:{SECRET}@host:8000/v1", "http://***@host:8000/v1"),
    (f"https://{SECRET}@host/v1", "https://***@host/v1"),
    (f"https://host/v1?api_key={SECRET}&model=m", "https://host/v1?api_key=***&model=m"),
    (f"s3://bucket/x?X-Amz-Signature={SECRET}&X-Amz-Credential={SECRET}", "s3://bucket/x?X-Amz-Signature=***&X-Amz-Credential=***"),
    ("http://127.0.0.1:8000/v1?model=m", "http://127.0.0.1:8000/v1?model=m"),
])
def test_a_url_keeps_its_server_and_loses_its_credentials(url, shown):
    assert redact_url(url) == shown
    assert redact_text(f"the judge at {url}: 500") == f"the judge at {shown}: 500"


def test_records_logs_and_the_console_are_redacted(tmp_path, capsys):
    record = {"base_urls": [f"http://u:{SECRET}@h/v1"], "n": 3, "nested": ({"cmd": f"--base-url http://u:{SECRET}@h"},)}
    assert SECRET not in json.dumps(redact(record)) and redact(record)["n"] == 3
    handler = logging.FileHandler(tmp_path / "train.log")
    handler.setFormatter(RedactingFormatter("%(message)s"))
    log = logging.getLogger("redaction-test")
    log.addHandler(handler)
    log.warning("server at %s", f"http://u:{SECRET}@h")
    handler.close()
    assert "http://***@h" in (tmp_path / "train.log").read_text()
    console.print(f"reached http://u:{SECRET}@h/v1")
    assert "http://***@h/v1" in capsys.readouterr().err


def test_filter_through_a_server_with_a_key_in_its_url_writes_no_key(tmp_path, openai_stub, monkeypatch):
    """Probe: `--base-url http://user:key@host` landed in the manifests and dataset cards of a filter output."""
    stub = openai_stub(lambda request: "7", models=["policy"])
    url = stub.base_url.replace("http://", f"http://user:{SECRET}@")
    shards = write_rl_shards(tmp_path / "rl", arithmetic_rows(4))
    out = tmp_path / "out"
    argv = ["filter", str(shards), "--out", str(out), "--policy", "policy", "--tokenizer", "tiny-random",
            "--reward", json.dumps(NUMBER_REWARD), "--k", "2", "--max-tokens", "4", "--backend", "server",
            "--base-url", url]
    monkeypatch.setattr(sys, "argv", ["rufus-data", *argv])
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert SECRET not in output_lock.command_line()  # the lock record's command line
    res = CliRunner().invoke(data_app, argv)
    assert res.exit_code == 0, res.output
    assert SECRET not in res.output
    written = [p for p in out.rglob("*") if p.is_file() and p.suffix in (".json", ".md", ".yaml", ".txt")]
    assert any(p.name == "manifest.json" for p in written) and any(p.name == "README.md" for p in written)
    assert [p for p in written if SECRET in p.read_text()] == []
    assert "***@127.0.0.1" in (out / "manifest.json").read_text()

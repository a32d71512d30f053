"""The options of every `rufus-train` command: `stage NAME --help` lists the stage's keys, each
command's options come from its config model, `--dry_run` prints a plan and loads nothing, and
the own options of `stage` and `pipeline` parse in both spellings. Nothing here trains."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from rufus_train.cli import app


def invoke(*args: str, **options):
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "200"}, **options)


def flat(text: str) -> str:
    """Help text with the panels' borders and line breaks gone: one line of words."""
    return " ".join(text.replace("│", " ").split())


def key_line(help_text: str, key: str) -> str:
    """The table row of `key` (its first line) in `stage NAME --help`."""
    return next(line for line in help_text.splitlines() if line.replace("│", " ").split()[:1] == [key])


def test_stage_help_lists_every_key_with_type_default_and_description():
    from rufus_train.config_loading import load_stage_config
    from rufus_train.stage_help import NO_DESCRIPTION, key_rows
    from rufus_train.stages import get_stage

    config = get_stage("sft").config_class
    rows = {row[0]: row[1:] for row in key_rows(config, load_stage_config("sft", config).model_dump(mode="json"))}

    def described(model, name):
        return model.model_fields[name].description or NO_DESCRIPTION

    lora, evaluation = config.model_fields["lora"].annotation, config.model_fields["eval"].annotation
    assert rows["lora.r"] == ("int", "4", described(lora, "r"))
    assert rows["learning_rate"] == ("float | null", "0.0001", described(config, "learning_rate"))  # null, resolved
    assert rows["eval.suite"] == ("str", "quick", described(evaluation, "suite"))
    assert rows["data"][1] == "[catalogs/data/sft_mixture.yaml]"  # the stage YAML's default, not the model's []
    assert rows["packing_strategy"][0] == "bfd | bfd_split | wrapped"
    assert "stage" not in rows and "lora" not in rows and "devices.server" in rows

    result = invoke("stage", "sft", "--help")
    assert result.exit_code == 0, result.output
    text = result.stdout
    assert "--dry_run" in text and "--show_mask" in text  # the command's own options first
    for key, (kind, default, description) in rows.items():  # every key, a row of its own, as key_rows has it
        line = key_line(text, key).replace("│", " ").split()
        assert line[1] == kind.split()[0] and description.split()[0] in line, (key, line)
    assert key_line(text, "lora.r").replace("│", " ").split()[:3] == ["lora.r", "int", "4"]
    said = flat(text)
    assert "defaults: catalogs/stages/sft.yaml, resolved" in said
    assert "trainer.*: any field of trl.SFTConfig (TRL " in said and "`trl sft --help`" in said
    assert "bf16, fp16 -> dtype" in said and "save_strategy -> save_steps" in said


def test_stage_help_names_the_grpo_config_and_takes_h():
    result = invoke("stage", "reasoning_rl", "-h")
    assert result.exit_code == 0, result.output
    said = flat(result.stdout)
    assert "RufusGRPOConfig (extends trl.GRPOConfig, TRL" in said and "`trl grpo --help`" in said
    assert "scale_rewards -> adv_norm" in said and "max_completion_length" in said


def test_stage_help_without_a_name_stays_generic_and_an_unknown_name_is_refused():
    generic = invoke("stage", "--help")
    assert generic.exit_code == 0 and "Keys of stage" not in generic.output
    assert "--dry_run" in generic.output and "validate, resolve and print the plan" in flat(generic.output)
    unknown = invoke("stage", "stf", "--help")
    assert unknown.exit_code == 2 and "unknown stage 'stf'; did you mean 'sft'?" in unknown.output
    assert "Traceback" not in unknown.output


def test_stage_help_at_80_columns_puts_each_key_on_a_line_and_its_description_beneath():
    """A pipe or an 80-column terminal: `--key  type  (default: ...)`, the description wrapped under
    it, every line within 80 columns (before: a 3-character description column, 2,800 lines)."""
    from rich.cells import cell_len

    result = CliRunner().invoke(app, ["stage", "coding_rl", "--help"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert max(cell_len(line) for line in lines) <= 80
    assert len(lines) < 400
    text = flat(result.stdout)
    assert "--lora.r int (default: 4) adapter rank: the inner dimension of each low-rank update" in text
    assert "--model str (default: smollm2-135m) built-in name" in text
    assert "RufusGRPOConfig (extends trl.GRPOConfig, TRL" in text


@pytest.mark.spawn  # a fresh interpreter imports the modules
def test_stage_help_with_a_name_imports_no_trl_or_torch():
    """The TRL config classes import torch (about 10 s, 43 s on a loaded machine): the help reads
    the stage's keys and names its TRL class without them."""
    import subprocess
    import sys

    code = ("import sys; from typer.testing import CliRunner; from rufus_train.cli import app; "
            "r = CliRunner().invoke(app, ['stage', 'coding_rl', '--help']); assert r.exit_code == 0, r.output; "
            "print('torch' in sys.modules, 'trl' in sys.modules)")
    said = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert said == "False False"


def test_stage_help_loads_no_stage_registry_without_a_name():
    import subprocess
    import sys

    code = ("import sys; from typer.testing import CliRunner; from rufus_train.cli import app; "
            "CliRunner().invoke(app, ['stage', '--help']); print('trl' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "False"


@pytest.mark.parametrize("spelling", ["--dry-run", "--dry_run"])
def test_stage_and_pipeline_own_options_parse_in_both_spellings(spelling, tmp_path, no_model_loads):
    """TRL writes --dry_run, lm-eval --dry-run: both parse; help shows rufus-train's (TRL's) spelling."""
    result = invoke("stage", "sft", spelling, "--output_dir", str(tmp_path / "never"))
    assert result.exit_code == 0, result.output
    assert "max_steps: -1" in result.stdout and not (tmp_path / "never").exists()
    pipeline = tmp_path / "p.yaml"
    pipeline.write_text("name: p\nmerge: false\nstages:\n  - {stage: sft}\n")
    result = invoke("pipeline", str(pipeline), spelling)
    assert result.exit_code == 0, result.output
    assert "# stage 1 of 1: sft" in result.stdout
    assert "--dry_run" in invoke("pipeline", "--help").stdout


@pytest.mark.parametrize("spelling", ["--show-mask", "--show_mask"])
def test_show_mask_parses_in_both_spellings(spelling):
    result = invoke("stage", "dpo", spelling, "1")
    assert result.exit_code == 2 and "--show_mask applies to the sft and midtrain stages" in result.output


def test_plan_options_come_from_its_config_and_gpu_choices_are_checked():
    from rufus_train.plan import GPU_PEAK_TFLOPS, PlanConfig

    result = invoke("plan", "--params", "3e9", "--tokens", "1e12", "--days", "10", "--gpu", "x100")
    assert result.exit_code == 2 and "'x100' is not one of" in result.output
    assert all(f"'{gpu}'" in result.output for gpu in GPU_PEAK_TFLOPS)
    shown = flat(invoke("plan", "--help").stdout)
    assert "<" + "|".join(GPU_PEAK_TFLOPS) + ">" in shown
    for name, info in PlanConfig.model_fields.items():
        assert f"--{name}" in shown and flat(info.description) in shown
    bad = invoke("plan", "--params", "3e9", "--tokens", "1e12", "--days", "10", "--mfu", "2")
    assert bad.exit_code == 2 and "--mfu: Input should be less than or equal to 1" in bad.output


def fake_adapter_run(folder, base: str = "smollm2-135m"):
    """A run folder as export reads it before merging: the adapter's config and weights file."""
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": base}))
    (folder / "adapter_model.safetensors").write_bytes(b"adapter weights")
    return folder


def test_export_dry_run_says_what_it_would_merge_and_loads_nothing(tmp_path, no_model_loads):
    run = fake_adapter_run(tmp_path / "run")
    out = tmp_path / "out"
    result = invoke("export", str(run), "--dry_run", "--out", str(out))
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == f"adapter  {run} (LoRA)" and lines[1].startswith("base     smollm2-135m")
    assert lines[2] == f"merged   {run / 'merged'} <- the adapter merged into a copy of the base, in float32"
    assert lines[3] == f"copy     {run / 'merged'} -> {out}"
    assert sorted(p.name for p in run.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    assert not out.exists()
    out.mkdir()  # checked as the export checks it
    refused = invoke("export", str(run), "--dry-run", "--out", str(out))
    assert refused.exit_code == 2 and "already exists: pass --overwrite" in refused.output
    noted = invoke("export", str(run), "--dry_run", "--merge")
    assert noted.exit_code == 0 and "--merge is no longer needed" in " ".join(noted.output.split())
    plain = invoke("export", str(tmp_path / "out"), "--dry_run")
    assert plain.exit_code == 2 and "holds no LoRA adapter" in plain.output


def test_serve_dry_run_prints_the_server_command_and_starts_nothing(tmp_path, monkeypatch, no_model_loads):
    from rufus_data.generate.backend_config import ServerLaunch
    from rufus_data.models import builtin as models
    from rufus_train.cli import serve_cmd

    def no_pull(name):
        raise AssertionError(f"--dry_run converted the built-in {name}")

    monkeypatch.setattr(models, "pull", no_pull)
    result = invoke("serve", "smollm2-135m", "--dry_run", "--devices", "0,1,2,3", "--data_parallel_size", "2")
    assert result.exit_code == 0, result.output
    command = result.stdout.strip()
    assert command.startswith("VLLM_SERVER_DEV_MODE=1 CUDA_VISIBLE_DEVICES=0,1,2,3 ")
    for flag in ("--tensor-parallel-size 2", "--data-parallel-size 2", "--max-model-len 16384", "--dtype bfloat16",
                 "--gpu-memory-utilization 0.9", "--host 127.0.0.1", "--port 8000", "-m vllm.entrypoints.openai.api_server"):
        assert flag in command, flag  # the recipe's defaults, on loopback unless asked (issue 47)
    uneven = invoke("serve", "org/model", "--dry_run", "--devices", "0,1,2", "--data_parallel_size", "2")
    assert uneven.exit_code == 2 and "does not divide the 3 GPUs" in uneven.output
    # the launch settings are ServerLaunch's: the same options as rufus-data's vllm backend
    options = {name for name in serve_cmd.__signature__.parameters}
    assert set(ServerLaunch.model_fields) <= options


def test_serve_takes_a_stages_settings_and_the_command_line_wins(tmp_path):
    stage_yaml = tmp_path / "rl.yaml"
    stage_yaml.write_text("devices: {trainer: '0', server: '2,3'}\nvllm_server: http://127.0.0.1:8123\n")
    result = invoke("serve", "--stage", "reasoning_rl", "--config", str(stage_yaml), "--dry_run", "--max_staleness", "1")
    assert result.exit_code == 0, result.output
    assert "CUDA_VISIBLE_DEVICES=2,3" in result.stdout and "--port 8123" in result.stdout
    assert "--max-lora-rank 8 --max-loras 3" in result.stdout  # the stage's lora.r 4 rounded up; 1 + 2 slots
    given = invoke("serve", "--stage", "reasoning_rl", "--config", str(stage_yaml), "--dry_run", "--port", "9000",
                   "--devices", "4", "--vllm_command", "vllm serve")
    assert given.exit_code == 0, given.output
    assert "CUDA_VISIBLE_DEVICES=4" in given.stdout and "--port 9000" in given.stdout
    assert " vllm serve " in given.stdout


def test_serve_old_options_still_work_with_a_note():
    result = invoke("serve", "org/model", "--print", "--python", "/opt/vllm/bin/python")
    assert result.exit_code == 0, result.output
    assert "/opt/vllm/bin/python -m vllm.entrypoints.openai.api_server --model org/model" in result.stdout
    said = " ".join(result.stderr.split())
    assert "note: --print is now --dry_run" in said and "note: --python PY is now --vllm_command" in said
    assert "--python" not in invoke("serve", "--help").stdout and "--print" not in invoke("serve", "--help").stdout
    missing = invoke("serve", "--dry_run")
    assert missing.exit_code == 2 and "give the MODEL to serve, or --stage NAME" in missing.output


def test_stages_prints_a_table_or_rows_a_script_reads():
    from rufus_train.stages import all_stages

    rows = json.loads(invoke("stages", "--format", "json").stdout)
    assert [row["stage"] for row in rows] == sorted(all_stages())
    sft = next(row for row in rows if row["stage"] == "sft")
    assert sft == {"stage": "sft", "description": all_stages()["sft"].description, "trl_config": "trl.SFTConfig"}
    csv = invoke("stages", "--format", "csv").stdout.splitlines()
    assert csv[0] == "stage,description,trl_config" and len(csv) == len(rows) + 1
    assert "rufus-train stages" in invoke("stages").stdout

"""Stage configs, CLI overrides, --dry-run, the guards' messages, `stages` and `plan`: all of it
runs before (and without) loading a model or dataset."""

from __future__ import annotations

import sys

import pytest
from typer.testing import CliRunner

from rufus_data.base.errors import RufusError
from rufus_train import guards
from rufus_train.cli import app
from rufus_train.config_loading import load_stage_config, parse_cli_overrides
from rufus_train.plan import plan
from rufus_train.stages import all_stages, check_config, get_stage

MY_STAGES = ("sft", "midtrain", "dpo", "kto", "orpo", "distill")


@pytest.fixture(scope="module")
def sft_shards(tmp_path_factory, data_root):
    import example_shards

    root = tmp_path_factory.mktemp("cfg_shards")
    return {
        "sft": example_shards.gsm8k_sft(data_root, root / "sft", limit=4),
        "pref": example_shards.gsm8k_preference(data_root, root / "pref", limit=4),
        "rl": example_shards.gsm8k_rl(data_root, root / "rl", limit=4),
    }


def load(stage: str, **overrides):
    return load_stage_config(stage, get_stage(stage).config_class, overrides=overrides)


def test_every_stage_yaml_loads_with_documented_defaults():
    for name in MY_STAGES:
        config = load(name)
        assert config.stage == name and config.lora.r == 4
        assert config.lora.target_modules == ["q_proj", "k_proj", "v_proj", "o_proj"]


def test_learning_rate_defaults_full_vs_lora():
    assert load("sft").learning_rate == pytest.approx(1e-4)
    assert load("sft", **{"lora.enabled": False}).learning_rate == pytest.approx(1e-5)
    assert load("dpo").learning_rate == pytest.approx(1e-5)  # 10x below SFT
    assert load("dpo", **{"lora.enabled": False}).learning_rate == pytest.approx(1e-6)
    assert load("sft", learning_rate=3e-6).learning_rate == pytest.approx(3e-6)  # given wins


def test_cli_overrides_are_typed_by_the_model_and_win():
    pairs = parse_cli_overrides(["--max_steps", "7", "--lora.r=8", "--packing", "--model", "123", "--trainer.warmup_steps", "3"])
    config = load_stage_config("sft", get_stage("sft").config_class, overrides=pairs)
    assert config.max_steps == 7 and config.lora.r == 8 and config.packing is True
    assert config.model == "123"  # a str field stays a string
    assert config.trainer == {"warmup_steps": 3}


def test_boolean_keys_are_bare_flags_with_a_no_form_and_still_take_true_false():
    sft = get_stage("sft").config_class
    flags = load_stage_config("sft", sft, overrides=parse_cli_overrides(["--packing", "--no-assistant_only_loss",
                                                                           "--no-lora.enabled", "--overwrite"]))
    assert (flags.packing, flags.assistant_only_loss, flags.lora.enabled, flags.overwrite) == (True, False, False, True)
    nested = load_stage_config("sft", sft, overrides=parse_cli_overrides(["--lora.no-enabled"]))
    assert nested.lora.enabled is False
    spelled = load_stage_config("sft", sft, overrides=parse_cli_overrides(["--packing", "false", "--overwrite=true"]))
    assert (spelled.packing, spelled.overwrite) == (False, True)
    with pytest.raises(RufusError, match=r"command line --no_max_steps: unknown key"):  # only booleans have a no- form
        load_stage_config("sft", sft, overrides=parse_cli_overrides(["--no-max-steps"]))


def test_unknown_keys_name_their_source_key_and_nearest_valid(tmp_path):
    """A key given on the command line is named as the command line's; one in the file by its line."""
    with pytest.raises(RufusError, match=r"command line --lora\.rr: unknown key 'lora\.rr'; did you mean 'r'"):
        load("sft", **{"lora.rr": 8})
    with pytest.raises(RufusError, match=r"command line --max_step: unknown key 'max_step'; did you mean 'max_steps'"):
        load_stage_config("sft", get_stage("sft").config_class, overrides=parse_cli_overrides(["--max_step", "2"]))
    with pytest.raises(RufusError, match=r"command line --trainer\.warmup_step: unknown key 'trainer\.warmup_step' "
                                         r"for SFTConfig; did you mean 'warmup_steps'"):
        load("sft", **{"trainer.warmup_step": 3})
    mine = tmp_path / "sft.yaml"
    mine.write_text("max_steps: 2\nmax_step: 3\ntrainer:\n  warmup_step: 1\n")
    with pytest.raises(RufusError, match=r"sft\.yaml:2: unknown key 'max_step'; did you mean 'max_steps'") as err:
        load_stage_config("sft", get_stage("sft").config_class, mine, overrides=parse_cli_overrides(["--max_steps", "4"]))
    assert "command line" not in str(err.value)
    mine.write_text("trainer:\n  warmup_step: 1\n")
    with pytest.raises(RufusError, match=r"sft\.yaml: unknown key 'trainer\.warmup_step'"):
        load_stage_config("sft", get_stage("sft").config_class, mine, overrides={"max_steps": 4})
    with pytest.raises(RufusError, match=r"'trainer\.beta' is set by Rufus: use the top-level key 'beta'"):
        load("dpo", **{"trainer.beta": 0.5})


def test_bad_yaml_file_names_the_file(tmp_path):
    bad = tmp_path / "mine.yaml"
    bad.write_text("max_steps: [1\n")
    with pytest.raises(RufusError, match=r"mine\.yaml: malformed YAML at line"):
        load_stage_config("sft", get_stage("sft").config_class, bad)
    other = tmp_path / "dpo.yaml"
    other.write_text("stage: dpo\n")
    with pytest.raises(RufusError, match=r"config for stage 'dpo', not 'sft'"):
        load_stage_config("sft", get_stage("sft").config_class, other)


def test_guard_lm_head_and_embeddings_refused():
    with pytest.raises(RufusError, match=r"contains 'lm_head': the loss reads lm_head\.weight directly.*Remove it"):
        guards.check_lora_targets(["q_proj", "lm_head"])
    with pytest.raises(RufusError, match=r"contains 'model\.embed_tokens'.*indexed, not multiplied"):
        guards.check_lora_targets(["model.embed_tokens"])
    with pytest.raises(RufusError, match=r"'\.\*head'"):
        guards.check_lora_targets(".*head")
    guards.check_lora_targets(["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj"])


@pytest.mark.parametrize("method", ["PromptTuning", "prefix_tuning", "P-Tuning", "PrefixTuningConfig", "PROMPT_TUNING"])
def test_guard_prompt_learning_refused_use_lora(method):
    with pytest.raises(RufusError, match=r"prompt-learning method.*Use LoRA: set `lora\.method: lora`"):
        guards.check_peft_method(method)


def test_guard_prompt_learning_config_object_refused():
    from peft import PromptTuningConfig

    with pytest.raises(RufusError, match="Use LoRA"):
        guards.check_peft_config(PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=8))


def test_guards_run_from_the_config_before_loading(sft_shards, tmp_path, monkeypatch):
    with pytest.raises(RufusError, match="lm_head"):
        check_config(load("sft", data=[str(sft_shards["sft"])], **{"lora.target_modules": ["lm_head"]}))
    with pytest.raises(RufusError, match="has no `data`"):
        check_config(load("sft", data=[]))
    with pytest.raises(RufusError, match=r"shard folder .*nowhere does not exist"):
        check_config(load("sft", data=[str(tmp_path / "nowhere")]))
    with pytest.raises(RufusError, match=r"stage dpo reads column 'prompt'.*has \['id', 'label', 'messages', 'source'\]"):
        check_config(load("dpo", data=[str(sft_shards["sft"])], output_dir=str(tmp_path / "o")))
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if not installed (find_spec then answers None)
    with pytest.raises(RufusError, match=r"report_to 'wandb' needs the `wandb` package"):
        check_config(load("sft", data=[str(sft_shards["sft"])], report_to="wandb", output_dir=str(tmp_path / "o")))


def test_guard_existing_run_folder_not_overwritten(sft_shards, tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "run.json").write_text("{}")
    with pytest.raises(RufusError, match=r"already holds a run \(run.json\): pass --overwrite to replace it"):
        check_config(load("sft", data=[str(sft_shards["sft"])], output_dir=str(tmp_path / "run")))


def test_a_run_folder_without_a_finished_step_is_taken_over(sft_shards, tmp_path, capsys):
    """A run that failed before its first checkpoint (a bad model, no data root) leaves config.yaml,
    train.log and data/: the corrected command takes the folder over, with a note; a checkpoint in it
    asks for --overwrite or --resume_from_checkpoint."""
    import contextlib

    from rufus_train.runner import prepare_output

    run = tmp_path / "run"
    (run / "data" / "mix").mkdir(parents=True)
    (run / "config.yaml").write_text("stage: sft\n")
    (run / "train.log").write_text("it failed\n")
    config = load("sft", data=[str(sft_shards["sft"])], output_dir=str(run))
    check_config(config)
    with contextlib.ExitStack() as held:
        out, resume, done = prepare_output(config, held)
    assert resume is None and done is None and not (out / "data").exists()
    assert (out / "config.yaml").read_text() != "stage: sft\n"
    assert "holds no finished step" in capsys.readouterr().err
    (run / "checkpoint-2").mkdir()
    with pytest.raises(RufusError, match=r"already holds a run \(checkpoint-2\): pass --overwrite"):
        check_config(config)


def test_kto_refuses_the_source_label_column(sft_shards, tmp_path):
    with pytest.raises(RufusError, match=r"`label` is the source's own label"):
        check_config(load("kto", data=[str(sft_shards["pref"])], desirable_column="label", output_dir=str(tmp_path / "k")))


def test_distill_guards_teacher(sft_shards, builtin_model, tmp_path):
    base = {"data": [str(sft_shards["rl"])], "output_dir": str(tmp_path / "d")}
    with pytest.raises(RufusError, match="distill needs a teacher"):
        check_config(load("distill", **base))
    with pytest.raises(RufusError, match="the student's own starting point"):
        check_config(load("distill", teacher=builtin_model, **base))
    with pytest.raises(RufusError, match=r"'beta'.*less than or equal to 1"):
        load("distill", beta=1.5, **base)


def test_registry_lists_my_stages_with_one_line_each():
    stages = all_stages()
    for name in MY_STAGES:
        assert name in stages and "\n" not in stages[name].description
    with pytest.raises(RufusError, match="unknown stage 'stf'; did you mean 'sft'"):
        get_stage("stf")
    result = CliRunner().invoke(app, ["stages"])
    assert result.exit_code == 0
    for name in MY_STAGES:
        assert name in result.output


def test_dry_run_prints_resolved_config_and_loads_nothing(sft_shards, tmp_path):
    out = tmp_path / "never"
    result = CliRunner().invoke(
        app, ["stage", "sft", "--dry-run", "--data", str(sft_shards["sft"]), "--max_steps", "5", "--lora.r", "16",
              "--output_dir", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert "max_steps: 5" in result.stdout and "  r: 16" in result.stdout and "learning_rate: 0.0001" in result.stdout
    assert not out.exists()  # nothing was written or loaded


def test_cli_guard_error_exits_2_with_message(sft_shards):
    result = CliRunner().invoke(
        app, ["stage", "sft", "--dry-run", "--data", str(sft_shards["sft"]), "--lora.method", "PrefixTuning"]
    )
    assert result.exit_code == 2 and "Use LoRA" in result.output


def test_plan_prints_322_with_formula():
    assert plan(3e9, 1.1e13, 24, 0.3, "h100").gpus == 322
    result = CliRunner().invoke(app, ["plan", "--params", "3e9", "--tokens", "1.1e13", "--days", "24", "--mfu", "0.3", "--gpu", "h100"])
    assert result.exit_code == 0, result.output
    assert "6 x N x D = 6 x 3e+09 x 1.1e+13 = 1.980e+23" in result.stdout
    assert "0.3 x 989 TFLOP/s" in result.stdout and "321.8 -> 322" in result.stdout
    assert result.stdout.strip().endswith("322 GPUs (h100)")
    assert plan(3e9, 1.1e13, 24, 0.3, "a100").gpus > 322  # a slower GPU needs more
    with pytest.raises(RufusError, match="unknown --gpu 'h900'"):
        plan(3e9, 1.1e13, 24, 0.3, "h900")


def test_data_may_name_a_mixture_catalog(tmp_path):
    """A rufus-data catalog is validated (and its kind's columns checked) before anything loads."""
    from conftest import REPO

    sft_catalog = str(REPO / "catalogs" / "sft.yaml")
    check_config(load("sft", data=[sft_catalog], output_dir=str(tmp_path / "a")))
    with pytest.raises(RufusError, match=r"stage dpo reads column 'prompt'.*catalogs/sft\.yaml has "
                       r"\['id', 'label', 'messages', 'source'\]: give data of the right kind "
                       r"\(sft: messages; rl: prompt, expected_output; preference: prompt, chosen, rejected\)"):
        check_config(load("dpo", data=[sft_catalog], output_dir=str(tmp_path / "b")))
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: sft\nname: x\nsourcez: []\n")
    with pytest.raises(RufusError, match=r"bad\.yaml.*unknown key 'sourcez'"):
        check_config(load("sft", data=[str(bad)], output_dir=str(tmp_path / "c")))


def test_accelerate_configs_parse_with_accelerate():
    from accelerate.commands.config.config_args import ClusterConfig
    from conftest import REPO

    folder = REPO / "catalogs" / "accelerate"
    kinds = {}
    for name in ("ddp", "zero2", "zero3", "fsdp2"):
        config = ClusterConfig.from_yaml_file(str(folder / f"{name}.yaml"))
        kinds[name] = (config.distributed_type.name, (config.deepspeed_config or {}).get("zero_stage"),
                       (config.fsdp_config or {}).get("fsdp_version"))
    assert kinds == {
        "ddp": ("MULTI_GPU", None, None),
        "zero2": ("DEEPSPEED", 2, None),
        "zero3": ("DEEPSPEED", 3, None),
        "fsdp2": ("FSDP", None, 2),
    }


def test_every_stage_attaches_checkpoint_eval_when_asked(sft_shards, tmp_path, monkeypatch):
    """`eval.eval_on_checkpoint` gives every stage runner the rufus-eval callback; an empty
    `devices.eval` is refused at start-up, an overlap with the trainer's GPUs is a loud warning."""
    from rufus_eval.checkpoint_eval.callback import CheckpointEvalCallback
    from rufus_train.runner import checkpoint_eval_callback

    base = {"data": [str(sft_shards["sft"])], "output_dir": str(tmp_path / "o")}
    assert checkpoint_eval_callback(load("sft", **base)) is None
    for stage in ("sft", "dpo", "reasoning_rl"):
        data = {"sft": sft_shards["sft"], "dpo": sft_shards["pref"], "reasoning_rl": sft_shards["rl"]}[stage]
        config = load(stage, **{**base, "data": [str(data)], "eval.eval_on_checkpoint": True, "eval.backend": "hf"})
        assert isinstance(checkpoint_eval_callback(config), CheckpointEvalCallback)
    with pytest.raises(RufusError, match="devices.eval is empty"):
        check_config(load("sft", **base, **{"eval.eval_on_checkpoint": True, "devices.eval": ""}))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    with pytest.warns(UserWarning, match="overlap the trainer's on GPU 0"):
        check_config(load("sft", **base, **{"eval.eval_on_checkpoint": True, "devices.eval": "0,1"}))


def test_sft_refuses_wrapped_packing_with_assistant_only_loss():
    """Wrapped packing cuts conversations mid-turn: refused for assistant-only SFT, the default for midtrain."""
    sft = get_stage("sft")
    config = load_stage_config("sft", sft.config_class, overrides={"packing": True, "packing_strategy": "wrapped"})
    with pytest.raises(RufusError, match="packing_strategy wrapped cuts conversations mid-turn"):
        sft.check(config)
    midtrain = get_stage("midtrain")
    assert load_stage_config("midtrain", midtrain.config_class).trl_kwargs()["packing_strategy"] == "wrapped"


def test_online_dpo_keeps_the_generation_cache_under_a_users_generation_kwargs(tmp_path):
    """TRL drops the KV cache for sampling under gradient checkpointing; the stage asks for it, and a
    user's own trainer.generation_kwargs merges over the stage's, key by key."""
    from rufus_train.trl_args import trl_kwargs_for

    online_dpo = get_stage("online_dpo").config_class
    assert load_stage_config("online_dpo", online_dpo).trl_kwargs()["generation_kwargs"] == {"use_cache": True}
    mine = load_stage_config("online_dpo", online_dpo, overrides={"trainer": {"generation_kwargs": {"top_k": 5}}})
    assert trl_kwargs_for(mine, tmp_path)["generation_kwargs"] == {"use_cache": True, "top_k": 5}
    off = load_stage_config("online_dpo", online_dpo, overrides={"trainer": {"generation_kwargs": {"use_cache": False}}})
    assert trl_kwargs_for(off, tmp_path)["generation_kwargs"] == {"use_cache": False}


# ------------------------------------------------------------------ TRL keys outside `trainer:`


def test_a_trl_key_at_the_top_level_is_taken_into_trainer(sft_shards, tmp_path, capsys):
    """`--warmup_steps 0.1` as `trl sft` takes it: a field of the TRL config Rufus leaves open is
    taken as trainer.warmup_steps, typed by TRL's field, with a note; in a stage YAML and a
    pipeline's stage entry too."""
    sft = get_stage("sft").config_class
    config = load_stage_config("sft", sft, overrides=parse_cli_overrides(["--warmup_steps", "0.1", "--no_disable_tqdm"]))
    assert config.trainer == {"warmup_steps": 0.1, "disable_tqdm": False}
    said = " ".join(capsys.readouterr().err.split())
    assert "note: command line --warmup_steps is a TRL key: taken as trainer.warmup_steps" in said
    mine = tmp_path / "sft.yaml"
    mine.write_text("max_steps: 2\nlr_scheduler_type: cosine\ntrainer:\n  max_grad_norm: 0.5\n")
    assert load_stage_config("sft", sft, mine).trainer == {"max_grad_norm": 0.5, "lr_scheduler_type": "cosine"}
    assert f"note: {mine}:2: lr_scheduler_type is a TRL key: taken as trainer.lr_scheduler_type" in " ".join(
        capsys.readouterr().err.split())

    result = CliRunner().invoke(app, ["stage", "sft", "--dry_run", "--data", str(sft_shards["sft"]),
                                      "--warmup_steps", "0.1", "--output_dir", str(tmp_path / "never")])
    assert result.exit_code == 0, result.output
    assert "trainer:\n  warmup_steps: 0.1\n" in result.stdout

    from rufus_train.pipeline import load_pipeline, stage_configs

    pipeline = tmp_path / "p.yaml"
    pipeline.write_text(f"name: p\nstages:\n  - {{stage: sft, data: [{sft_shards['sft']}], warmup_steps: 0.05}}\n")
    assert stage_configs(load_pipeline(pipeline))[0].trainer == {"warmup_steps": 0.05}
    assert f"note: {pipeline} stages[0] (sft) key warmup_steps is a TRL key" in " ".join(capsys.readouterr().err.split())


def test_a_trl_key_rufus_sets_is_refused_with_the_key_to_use(tmp_path):
    """bf16/fp16 come from dtype, activation_checkpointing from gradient_checkpointing, ... at the top
    level and in `trainer:` alike, each named where it was written."""
    sft = get_stage("sft").config_class

    def refused(stage, *args, config_file=None):
        with pytest.raises(RufusError) as err:
            load_stage_config(stage, get_stage(stage).config_class, config_file, overrides=parse_cli_overrides(list(args)))
        return " ".join(str(err.value).split())

    assert "command line --bf16: 'bf16' is a field of SFTConfig that Rufus sets itself: use the top-level key " \
           "'dtype' (auto, float32, bfloat16, float16) instead" in refused("sft", "--bf16")
    assert "use the top-level key 'gradient_checkpointing'" in refused("sft", "--activation_checkpointing")
    assert "use the top-level key 'save_steps'" in refused("sft", "--save_strategy", "epoch")
    assert "use the top-level key 'push_to_hub'" in refused("sft", "--hub_model_id", "org/x")
    assert "CUDA_VISIBLE_DEVICES=" in refused("sft", "--use_cpu")
    assert "use the top-level key 'adv_norm' (std, centered, batch_std)" in refused("reasoning_rl", "--scale_rewards", "none")
    assert "'trainer.fp16' is set by Rufus: use the top-level key 'dtype'" in refused("sft", "--trainer.fp16")
    mine = tmp_path / "sft.yaml"
    mine.write_text("max_steps: 2\nactivation_checkpointing: true\n")
    assert f"{mine}:2: 'activation_checkpointing' is a field of SFTConfig" in refused("sft", config_file=mine)
    mine.write_text("max_steps: 2\nfp16: true\n")  # TRL's spelling, refused as on the command line
    assert f"{mine}:2: --fp16: Rufus picks the precision from --dtype" in refused("sft", config_file=mine)
    mine.write_text("trainer:\n  bf16: true\n")
    assert f"{mine}: 'trainer.bf16' is set by Rufus: use the top-level key 'dtype'" in refused("sft", config_file=mine)
    assert "warmup_steps is given twice" in refused("sft", "--warmup_steps", "0.1", "--trainer.warmup_steps", "0.2")
    # a key neither Rufus's nor TRL's keeps its did-you-mean, and one near a TRL key says so
    assert "unknown key 'max_step'; did you mean 'max_steps'?" in refused("sft", "--max_step", "2")
    assert "'warmup_stepz' is close to the TRL key 'warmup_steps'" in refused("sft", "--warmup_stepz", "1")
    assert load_stage_config("sft", sft, overrides={"trainer": {"run_name": "mine"}}).trainer == {"run_name": "mine"}


def test_the_trl_fields_rufus_sets_are_the_ones_trl_args_passes(tmp_path, monkeypatch):
    """trl_keys' list of what common_trl_kwargs sets is that function's, field for field; every
    stage's own trl_kwargs are managed too (the mapping it sets stays open)."""
    from rufus_train import trl_keys
    from rufus_train.trl_args import common_trl_kwargs

    monkeypatch.setenv("WANDB_PROJECT", "rufus")  # tracker_settings sets it otherwise
    declared = set(trl_keys.COMMON_TRL_FIELDS) | set(trl_keys.RUFUS_DEFAULTS) | {"use_cpu", "logging_nan_inf_filter"}
    assert set(common_trl_kwargs(load("sft"), tmp_path)) == declared
    for name, stage in all_stages().items():
        config = load_stage_config(name, stage.config_class, overrides={"teacher": "x"} if name == "distill" else None)
        managed = trl_keys.managed_fields(config)
        open_mappings = {k for k, v in config.trl_kwargs().items() if isinstance(v, dict)}
        assert set(config.trl_kwargs()) - open_mappings <= set(managed), name
        assert "warmup_steps" not in managed and "generation_kwargs" not in managed, name

"""catalogs/data/mbpp_learnable.yaml, coding_rl's default data: MBPP tasks chosen by measurement
(rufus-data filter) from the real rows in $RUFUS_DATA_ROOT, by task id, never a test task."""

from __future__ import annotations

from rufus_data.base.catalog_files import resolve_entry
from rufus_data.mix.plan import mix_plan
from rufus_data.sources.catalog import load_catalog
from rufus_train.config_loading import load_stage_config, stage_file
from rufus_train.stages import get_stage

CATALOG = "catalogs/data/mbpp_learnable.yaml"
MBPP_TEST_TASKS = (11, 510)
TEST_TASK_REPEATED = 569  # its text repeats test task 104


def test_the_learnable_catalog_names_train_tasks_only_and_finds_each_one(data_root):
    (source,) = load_catalog(resolve_entry(CATALOG)).sources
    ids = [task for first, last in source.ids.within for task in range(first, last + 1)]
    low, high = MBPP_TEST_TASKS
    assert ids and not [task for task in ids if low <= task <= high or task == TEST_TASK_REPEATED]
    (planned,) = mix_plan(resolve_entry(CATALOG), check_out=False).sources
    assert planned["rows_out"] == len(ids)


def test_coding_rl_trains_on_the_learnable_catalog_by_default():
    config = load_stage_config("coding_rl", get_stage("coding_rl").config_class, stage_file("coding_rl"))
    assert config.data == [CATALOG]

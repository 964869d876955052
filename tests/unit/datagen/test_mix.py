"""target_mix against what a run can supply (datagen.mix): the rule, check-mix on the labels read where the existing
set lives (the dataset_labels_info module's reading is tested with the collection's module_utils), and prepare
refusing a typo."""

from __future__ import annotations

import json

import pytest

from datagen.cli import main as cli_main
from datagen.config import ConfigError, load_config
from datagen.existing import categories_from_labels
from datagen.mix import mix_findings, source_categories
from datagen.prepare import run_prepare
from tests.support import datagen_rows as fx

pytestmark = pytest.mark.processes


def test_source_categories_come_from_the_config_the_adapter_or_its_per_row_choice(tmp_path):
    cfg = load_config(fx.write_config(tmp_path, fx.six_sources(tmp_path, 2)), check_inputs=False)
    supply = source_categories(cfg.sources)
    # infinity_instruct decides per row (coding, math, general); the others have a fixed category
    assert {"coding", "math", "general", "science", "tool_use", "agent"} <= set(supply)
    assert any("infinity" in name or name.startswith("ii") for name in supply["general"]), supply


def test_a_typo_is_an_error_naming_the_closest_category():
    errors, warnings = mix_findings({"codng": 0.5, "general": 0.5}, {"general": ["lab"]}, {"coding", "general"})
    assert errors == ["target_mix.codng: no source supplies it and the existing set does not have it (categories "
                      "there are: coding, general) (did you mean coding?); fix the name, or add a source with "
                      "category: codng"]
    assert warnings == ["target_mix leaves out coding, a category of the existing set: its rows pass through the "
                        "merge as they are, neither grown nor cut; add it to target_mix to steer its share"]


def test_a_category_only_the_existing_set_has_is_fine_and_an_unread_set_judges_nothing():
    assert mix_findings({"coding": 0.5, "general": 0.5}, {"general": ["lab"]}, {"coding"}) == ([], [])
    assert mix_findings({"codng": 1.0}, {"general": ["lab"]}, None) == ([], [])


def test_labels_map_through_category_map_and_unlabelled_rows_get_the_default_or_the_guess(tmp_path):
    spec = load_config(fx.write_config(tmp_path, fx.six_sources(tmp_path, 2), existing_dataset={
        "path": str(tmp_path / "e.jsonl"), "category_map": {"code": "coding"}}), check_inputs=False).existing
    assert categories_from_labels(spec, ["code", "math"], unlabelled=False) == {"coding", "math"}
    assert categories_from_labels(spec, ["code"], unlabelled=True) == {"coding", "math", "general"}
    spec.default_category = "general"
    assert categories_from_labels(spec, [], unlabelled=True) == {"general"}


def one_source(tmp_path) -> list:
    path = fx.write_jsonl(tmp_path / "src.jsonl", [{"messages": [{"role": "user", "content": "Tell me a long story"}]}])
    return [{"name": "lab", "adapter": "messages", "category": "general", "path": path}]


def test_check_mix_reads_the_labels_file_and_refuses_a_typo(tmp_path, capsys):
    config = fx.write_config(tmp_path, one_source(tmp_path), existing_dataset=str(tmp_path / "e.jsonl"),
                             target_mix={"coding": 0.4, "general": 0.3, "legal": 0.3})
    labels = tmp_path / "labels.json"
    labels.write_text(json.dumps({"read": True, "values": ["coding", "legl"], "unlabelled": False}))
    assert cli_main(["check-mix", "--config", config, "--existing-labels", str(labels)]) == 2
    err = capsys.readouterr().err
    assert "target_mix.legal: no source supplies it" in err and "(did you mean legl?)" in err, err
    labels.write_text(json.dumps({"read": False, "reason": "a Parquet file, and no pyarrow in this Python"}))
    assert cli_main(["check-mix", "--config", config, "--existing-labels", str(labels)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["existing_categories"] is None
    assert "could not be read (a Parquet file, and no pyarrow in this Python)" in out["warnings"][0]


def test_prepare_refuses_a_target_mix_category_nothing_supplies(tmp_path):
    existing = fx.write_jsonl(tmp_path / "existing.jsonl", [{"category": "coding", "messages": [
        {"role": "user", "content": "Existing coding task"}, {"role": "assistant", "content": "ok"}]}])
    cfg = load_config(fx.write_config(tmp_path, one_source(tmp_path), existing_dataset={"path": existing},
                                      target_mix={"coding": 0.3, "general": 0.3, "sciense": 0.4}))
    with pytest.raises(ConfigError) as raised:
        run_prepare(cfg)
    assert "target_mix.sciense: no source supplies it" in str(raised.value)
    # the categories there: the source's general and the existing set's coding; nothing close to sciense
    assert "(categories there are: coding, general); fix the name" in str(raised.value)

"""Config validation: every bad key reported, each naming its key path and the fix."""

from __future__ import annotations

import os

import pytest
import yaml

from datagen.config import ConfigError, load_config, validate
from tests.support import datagen_rows as fx
from tests.support.paths import DATAGEN_FILES


def errors_of(tmp_path, sources=None, **top):
    path = fx.write_config(tmp_path, sources or fx.six_sources(tmp_path, 2), **top)
    with pytest.raises(ConfigError) as e:
        load_config(path)
    return e.value.errors


def test_valid_config_resolves_paths(tmp_path):
    path = fx.write_config(tmp_path, fx.six_sources(tmp_path, 2), work_dir="work")
    cfg = load_config(path)
    assert cfg.work_dir == str(tmp_path / "work")
    assert [s.adapter for s in cfg.sources][0] == "infinity_instruct"
    assert cfg.sources[0].files == [str(tmp_path / "src" / "ii.parquet")]
    assert cfg.tokenize.supervise == "all" and cfg.merge.allow_downsample is False
    assert isinstance(ConfigError("x"), ValueError)


def test_missing_source_file_names_the_index(tmp_path):
    sources = fx.six_sources(tmp_path, 2)
    sources[2]["path"] = str(tmp_path / "nope.jsonl")
    path = fx.write_config(tmp_path, sources)
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert e.value.errors == [f"sources[2].path: file not found: {tmp_path / 'nope.jsonl'}"]


def test_unreadable_source_file(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root reads any file; permission errors cannot be produced")
    sources = fx.six_sources(tmp_path, 2)
    os.chmod(sources[1]["path"], 0)
    errs = errors_of(tmp_path, sources=sources)
    assert any(e.startswith("sources[1].path: file not readable") for e in errs)


def test_many_errors_at_once(tmp_path):
    sources = fx.six_sources(tmp_path, 2)
    sources[0]["adapter"] = "infinity"
    sources[1]["pathh"] = "typo"
    sources[3]["category"] = "poetry"
    sources[4]["hub"] = {"repo": "x/y"}
    errs = errors_of(tmp_path, sources=sources, target_mix={"coding": 0.5, "math": 0.2}, max_length="long",
                     bogus=1, tokenize={"supervise": "everything"}, merge={"allow_downsample": "yes"})
    text = "\n".join(errs)
    assert "bogus: unknown key" in text
    assert "sources[0].adapter: must be one of" in text
    assert "sources[1].pathh: unknown key" in text
    assert "sources[3].category: 'poetry' is not in target_mix" in text
    assert "sources[4]: set exactly one of path" in text
    assert "sources[4].hub.revision: is required" in text
    assert "target_mix: fractions sum to 0.7" in text
    assert "max_length: must be an integer" in text
    assert "tokenize.supervise: must be one of all, last" in text
    assert "merge.allow_downsample: must be true or false" in text


def test_adapter_category_must_be_targeted(tmp_path):
    errs = errors_of(tmp_path, target_mix={"coding": 0.5, "math": 0.5})
    assert any(e.startswith("sources[1].category: adapter webinstruct files rows under 'science'") for e in errs)


def test_required_keys_and_types():
    with pytest.raises(ConfigError) as e:
        validate({"sources": "x"})
    text = "\n".join(e.value.errors)
    for key in ("work_dir: is required", "target_total: is required", "target_mix: must be",
                "sources: must be a non-empty list"):
        assert key in text
    assert "model" not in text  # the generate settings judge it (parse_model), by one rule
    with pytest.raises(ConfigError):
        validate(["not", "a", "mapping"])


def test_yaml_errors(tmp_path):
    p = tmp_path / "bad.yml"
    p.write_text("work_dir: [unclosed\n")
    with pytest.raises(ConfigError, match="--config: not valid YAML"):
        load_config(str(p))
    with pytest.raises(ConfigError, match="--config: file not found"):
        load_config(str(tmp_path / "missing.yml"))


def test_generate_section_passes_through(tmp_path):
    path = fx.write_config(tmp_path, fx.six_sources(tmp_path, 2), generate={"anything": {"nested": 1}},
                           sampling={"temperature": 0.7})
    cfg = load_config(path)  # the generate stage's settings judge them (test_generate_settings.py)
    assert cfg.raw["generate"] == {"anything": {"nested": 1}} and cfg.raw["sampling"] == {"temperature": 0.7}


def test_example_config_is_valid_apart_from_missing_files():
    example = str(DATAGEN_FILES / "datagen.example.yml")
    with open(example) as fh:
        raw = yaml.safe_load(fh)
    cfg = validate(raw, example, check_inputs=False)
    assert abs(sum(cfg.target_mix.values()) - 1) < 1e-9 and len(cfg.sources) >= 6


def test_example_config_generate_side_accepts_it():
    from datagen.generate import settings_from_config

    example = str(DATAGEN_FILES / "datagen.example.yml")
    with open(example) as fh:
        settings = settings_from_config(yaml.safe_load(fh))
    assert settings is not None

"""The stage registry (roctune.stages): every row names a reader and a recipe that exist, the settings take their
stage names and capability checks from it, and a flag a stage does not implement is refused in one line."""
from __future__ import annotations

import inspect

import pytest

from roctune import stages
from roctune.config import STAGES, TrainConfig
from roctune.errors import ConfigError


@pytest.mark.parametrize("row", stages.ROWS, ids=lambda r: r.name)
def test_each_row_names_a_reader_and_a_recipe_that_exist(row):
    assert callable(row.load_reader())
    run = row.load_recipe().run
    assert list(inspect.signature(run).parameters)[:4] == ["cfg", "records", "eval_records", "base_model"]


def test_settings_web_ui_and_help_take_the_names_from_the_registry():
    from roctune.webui.train_form import form_specs

    assert STAGES == tuple(r.name for r in stages.ROWS)
    choices = next(s for s in form_specs() if s["name"] == "stage")["choices"]
    assert tuple(choices) == STAGES
    for row in stages.ROWS:
        assert f"{row.name} (" in stages.help_text() and f"{row.name}（" in stages.help_text(zh=True)


FLAG_SETTINGS = {"streaming": dict(streaming=True), "truncation": dict(truncation="split"),
                 "sequence_parallel": dict(sequence_parallel=2, nproc=2), "fsdp": dict(fsdp=True, nproc=2)}
MISSING = [(row.name, cap) for row in stages.ROWS for cap, _ in stages.CAPABILITIES if not getattr(row, cap)]


def _cfg(tmp_path, stage, **kw):
    extra = {"grpo": dict(rewards=["json"])}.get(stage, {})
    return TrainConfig(data=[str(tmp_path / "d.jsonl")], output=str(tmp_path / "run"), stage=stage, **extra, **kw)


@pytest.mark.parametrize("stage, capability", MISSING)
def test_a_flag_the_stage_lacks_is_refused_naming_the_stages_that_have_it(tmp_path, stage, capability):
    with pytest.raises(ConfigError) as e:
        _cfg(tmp_path, stage, **FLAG_SETTINGS[capability]).validate()
    msg = str(e.value)
    assert f"does not support --stage {stage}" in msg and "\n" not in msg
    named = msg.split(" is for --stage ")[1].split(" (")[0].replace(" or ", ", ").split(", ")
    assert named == list(stages.able(capability)) and named and msg.endswith(f"drop {msg.split()[0]}")


@pytest.mark.parametrize("stage, capability", [(r.name, c) for r in stages.ROWS for c, _ in stages.CAPABILITIES
                                               if getattr(r, c)])
def test_a_flag_the_stage_has_passes_the_stage_check(tmp_path, stage, capability):
    _cfg(tmp_path, stage, **FLAG_SETTINGS[capability])._check_stage()  # raises nothing

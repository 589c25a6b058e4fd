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


def test_sections_are_one_tuple_that_builds_the_settings():
    """TrainConfig's bases, the YAML aliases and the settings --resume keeps all come from SECTIONS; a stage's own
    section is named by its row, and every section file's dataclass is in the tuple."""
    import dataclasses
    import importlib
    import pkgutil

    import roctune.config as config_pkg
    from roctune.config import ALIASES, RESUME_FIXED, SECTIONS

    for row in stages.ROWS:
        assert row.settings is None or row.load_settings() in SECTIONS
    held = {base for s in SECTIONS for base in s.__mro__[1:-1]}  # a section's own bases (GRPO's ToolSettings)
    assert set(TrainConfig.__mro__[1:-1]) - held == set(SECTIONS)
    assert TrainConfig.field_names() == [f.name for s in SECTIONS for f in dataclasses.fields(s)]
    declared = {obj for m in pkgutil.iter_modules(config_pkg.__path__)
                for obj in vars(importlib.import_module(f"roctune.config.{m.name}")).values()
                if isinstance(obj, type) and obj.__name__.endswith("Settings") and dataclasses.is_dataclass(obj)
                and obj is not TrainConfig and obj not in held}
    assert declared == set(SECTIONS)
    # the names users and old config files use, and the settings a resume kept, from when these lists were written
    # by hand: all still there (a new stage may add its own)
    assert ALIASES.items() >= {"lora_target": "target_modules", "pref_beta": "beta", "finetuning_type": "method",
                               "dpo_label_smoothing": "label_smoothing", "kto_chosen_weight": "desirable_weight",
                               "kto_rejected_weight": "undesirable_weight"}.items()
    assert set(RESUME_FIXED) >= set(
        ("stage", "method", "model", "adapter", "data", "lora_r", "lora_alpha", "target_modules", "use_dora",
         "use_rslora", "modules_to_save", "freeze_trainable_layers", "freeze_trainable_modules", "max_length",
         "rope_scaling", "truncation", "pref_loss", "label_smoothing", "simpo_gamma", "desirable_weight",
         "undesirable_weight", "seed", "batch_size", "grad_accum", "num_generations"))


@pytest.mark.parametrize("kw, says", [(dict(stage="sft", desirable_weight=2.0), "--desirable-weight"),
                                      (dict(stage="sft", pref_loss="ipo"), "--pref-loss"),
                                      (dict(stage="sft", reward_model="r"), "--reward-model"),
                                      (dict(load_best=True), "--load-best"),
                                      (dict(truncation="split", max_length=1), "--truncation split")])
def test_every_sections_check_runs(tmp_path, kw, says):
    with pytest.raises(ConfigError, match=says):
        _cfg(tmp_path, kw.pop("stage", "sft"), **kw).validate()

"""The training stages, one row each: what a stage reads, which recipe runs it and what it can do.

A stage is a recipe file (roctune/recipes/NAME.py with `run(cfg, records, eval_records, base_model, log,
progress)`), a data reader, its settings section if it has settings of its own (roctune/config/NAME.py), and a row
here. The settings layer (roctune.config) takes the stage names and the stages' sections from this table, and builds
its capability checks from it (`--streaming` on a stage that cannot stream is refused in one line naming
the flag and the stages that can), and roctune.recipes dispatches through it; nothing else lists the stages.

The reader, recipe and settings section are named as "module:name" / "module" strings, imported where they are
used (the reader and recipe when a run needs them, the sections when roctune.config builds TrainConfig): this table
sits in the facts layer, below the data readers, recipes and settings it names (tests/test_layers.py), and importing
it costs nothing.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass

# What a run of a stage is (Stage.produces), which decides who takes it: chat, generate, serve, merge, export and
# train --adapter take a language model; a scorer (a scalar head) is refused there and used by eval and GRPO's
# --reward-model (roctune.rundir.run.refuse_scorer).
LANGUAGE_MODEL = "a language model"
SCORER = "a reward model"
# How `roctune eval` measures a run (Stage.evaluated): its answers against reference answers (a report), the loss and
# perplexity of held-out text, or its accuracy on held-out preference pairs.
EVALUATIONS = ("answers", "text", "pairs")


@dataclass(frozen=True)
class Stage:
    """One training stage. `reader(paths) -> records` reads --data and --eval-data; the capabilities are the
    settings the stage's recipe implements (a flag for a capability the stage lacks is refused by the settings)."""
    name: str
    help: str
    zh: str
    reader: str  # "module:function": the records this stage learns from
    recipe: str  # the module whose run() trains it
    settings: str | None = None  # "module:Class": the stage's own settings section (roctune.config), if any
    chat: bool = True  # renders conversations through a chat template (--template, reasoning settings)
    streaming: bool = False  # --streaming: tokenize into the data cache while reading
    truncation: bool = False  # --truncation left|split (the others keep prompts and answers whole)
    sequence_parallel: bool = False  # --sequence-parallel N
    fsdp: bool = True  # --fsdp (GRPO samples with the whole model in each process)
    samples: bool = False  # generates token by token while training (--compile auto leaves such a stage eager)
    produces: str = LANGUAGE_MODEL  # what its run is: LANGUAGE_MODEL or SCORER
    evaluated: str = "answers"  # how roctune eval measures its run (EVALUATIONS)
    shares: tuple[str, ...] = ()  # settings of another stage's section its recipe uses too (kto: dpo's --beta)
    images: bool = False  # trains a vision-language model on records with images (roctune.vision)

    def owns(self, section) -> bool:
        """Whether `section` (a settings class) is this stage's own (its row names it)."""
        return self.settings == f"{section.__module__}:{section.__qualname__}"

    def load_reader(self):
        return _load(self.reader)

    def load_settings(self):
        return _load(self.settings) if self.settings else None

    def load_recipe(self):
        return importlib.import_module(self.recipe)


ROWS = (
    Stage("sft", "supervised answers", "监督学习回答", "roctune.data.records:load_records", "roctune.recipes.sft",
          streaming=True, truncation=True, sequence_parallel=True, images=True),
    Stage("pt", "continued pretraining on raw text: .txt files or a 'text' column, packed into --max-length blocks",
          "继续预训练：原始文本，.txt 文件或 'text' 列，打包成“最大长度”长的块",
          "roctune.data.text:load_documents", "roctune.recipes.pt", chat=False, evaluated="text"),
    Stage("dpo", "preference pairs: prompt/chosen/rejected, or LLaMA-Factory ranking data",
          "偏好对：prompt/chosen/rejected，或 LLaMA-Factory 的排序数据",
          "roctune.data.preference:load_pairs", "roctune.recipes.dpo", settings="roctune.config.pref:PrefSettings"),
    Stage("kto", "single answers marked desirable or not: label true/false, or LLaMA-Factory's kto_tag",
          "单个回答，标为好或不好：label true/false，或 LLaMA-Factory 的 kto_tag",
          "roctune.data.kto:load_examples", "roctune.recipes.kto", settings="roctune.config.kto:KtoSettings",
          shares=("beta",)),
    Stage("rm", "a reward model: one score per answer, trained on the same pairs as dpo",
          "奖励模型：给每个回答打一个分，用与 dpo 相同的偏好对训练",
          "roctune.data.preference:load_pairs", "roctune.recipes.rm", fsdp=False, produces=SCORER,
          evaluated="pairs"),
    Stage("grpo", "RL from rewards on prompts", "基于奖励的强化学习，只需提示词",
          "roctune.data.prompts:load_prompts", "roctune.recipes.grpo", fsdp=False, samples=True,
          settings="roctune.config.grpo:GrpoSettings"),
)
STAGES = {s.name: s for s in ROWS}
NAMES = tuple(STAGES)
DEFAULT = NAMES[0]  # --stage's default, and the stage of a folder that does not say (a plain PEFT adapter)

# The capabilities a flag needs, for the settings' checks: (Stage field, the flag as users write it).
CAPABILITIES = (("streaming", "--streaming"), ("truncation", "--truncation"),
                ("sequence_parallel", "--sequence-parallel"), ("fsdp", "--fsdp"))


def _load(spec: str):
    """'module:name' -> the object."""
    module, name = spec.split(":")
    return getattr(importlib.import_module(module), name)


def able(capability: str) -> tuple[str, ...]:
    """The stages that implement `capability` (a Stage field), for messages naming where a flag works."""
    return tuple(s.name for s in ROWS if getattr(s, capability))


def owner(section) -> str:
    """The stage whose row names `section` (a settings class) as its own."""
    return next(s.name for s in ROWS if s.owns(section))


def producing(what: str) -> tuple[str, ...]:
    """The stages whose runs are `what` (LANGUAGE_MODEL or SCORER)."""
    return tuple(s.name for s in ROWS if s.produces == what)


def help_text(zh: bool = False) -> str:
    """--stage's help: each stage and what it learns from, from the rows."""
    return ("、" if zh else ", ").join(f"{s.name}（{s.zh}）" if zh else f"{s.name} ({s.help})" for s in ROWS)

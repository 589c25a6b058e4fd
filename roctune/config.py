"""Training settings, declared once.

Each setting is one dataclass field made by `setting()`: its type, default, help, choices and bounds. From those
declarations come the `roctune train` flags (`add_flags`), the YAML file and `key=value` overrides (`apply`, with
LLaMA-Factory's names as aliases), the web UI's form (`form_fields`) and the range checks (`TrainConfig.validate`).
Order of precedence: defaults, then --config FILE.yaml, then flags, then key=value overrides.

`trust_remote_code` is taken only from the command line: a YAML file or an override that sets it is refused, so
a config file someone sent you cannot make roctune run a model repository's code.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import os
from dataclasses import dataclass, field
from typing import Any

from roctune import strict_yaml
from roctune.errors import ConfigError

DEFAULT_TARGET_MODULES = ["auto"]
METHODS = ("lora", "qlora", "freeze", "full")
STAGES = ("sft", "dpo", "grpo")
LOSS_TYPES = ("dapo", "grpo", "dr_grpo", "bnpo")  # roctune.training.grpo_loss
REWARDS = ("answer", "format", "length", "json")  # roctune.eval.rewards
TRACKERS = ("tensorboard", "wandb", "mlflow", "trackio", "swanlab", "none")

# Other names users know a setting by (LLaMA-Factory's spelling).
ALIASES = {"lora_target": "target_modules", "pref_beta": "beta", "finetuning_type": "method"}


def setting(default: Any, help: str, *, choices: tuple | None = None, ge: float | None = None,
            gt: float | None = None, le: float | None = None, lt: float | None = None, repeat: bool = False,
            metavar: str | None = None, group: str = "training", cli_only: bool = False,
            aliases: tuple[str, ...] = ()) -> Any:
    """One setting. `ge/gt/le/lt` bound numbers (NaN and infinity are always refused); `repeat` makes a list
    flag repeatable (--data a --data b) instead of taking several values; `cli_only` settings cannot come from a
    file; `aliases` are extra flag names; `group` places the flag in --help and the web UI."""
    meta = {"help": help, "choices": choices, "ge": ge, "gt": gt, "le": le, "lt": lt, "repeat": repeat,
            "metavar": metavar, "group": group, "cli_only": cli_only, "aliases": aliases}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class TrainConfig:
    # ---- what to train on, and where the run goes
    data: list[str] = setting([], "training data files (repeatable; DIR:name reads LLaMA-Factory's dataset_info.json; "
                              "PATH:W mixes the files by weights W in a seeded order)",
                              repeat=True, metavar="PATH", group="data")
    output: str = setting("", "run directory for the adapter, logs and checkpoints", metavar="DIR", group="data")
    eval_data: list[str] = setting([], "evaluation data files (repeatable)", repeat=True, metavar="PATH", group="data")
    eval_ratio: float = setting(0.0, "hold out this fraction of the training data for evaluation", ge=0, lt=1,
                                group="data")
    max_length: int = setting(512, "tokens per example; longer ones are truncated", gt=0, group="data")
    learn_reasoning: bool = setting(True, "learn the reasoning of answers (<think> blocks, reasoning_content); "
                                    "off: it stays in the context but is not learned", group="data")
    empty_think: str = setting("learn", "an empty <think></think> block in an answer: learn it (answer without "
                               "thinking), mask it (context only) or drop it", choices=("learn", "mask", "drop"),
                               group="data")
    data_cache: bool = setting(True, "keep tokenized data in $ROCTUNE_HOME/cache/tokenized, so a restart or "
                               "--resume does not tokenize again", group="data")
    streaming: bool = setting(False, "read and tokenize the data a chunk at a time straight into the on-disk cache "
                              "and train from it memory-mapped: for datasets larger than memory (sft)", group="data")
    # ---- model and method
    model: str | None = setting(None, "base model: local dir or hub id (default: bundled SmolLM2-135M-Instruct)",
                                metavar="NAME", group="model")
    method: str = setting("lora", "lora; qlora: LoRA on a 4-bit NF4 base (bitsandbytes); freeze: train only the "
                          "last N layers; full: every parameter", choices=METHODS, group="model")
    stage: str = setting("sft", "sft (supervised answers), dpo (preference pairs: prompt/chosen/rejected, or "
                         "LLaMA-Factory ranking data) or grpo (RL from rewards on prompts)", choices=STAGES,
                         group="model")
    adapter: str | None = setting(None, "start from this LoRA adapter (e.g. the SFT run before dpo)", metavar="DIR",
                                  group="model")
    beta: float = setting(0.1, "dpo: how far the policy may move from the reference", gt=0, group="model")
    trust_remote_code: bool = setting(False, "run code from the model repository (off by default; command line only)",
                                      group="model", cli_only=True)
    # ---- reinforcement learning (grpo); defaults are TRL's GRPOConfig's unless said
    num_generations: int = setting(8, "grpo: completions sampled per prompt (the group its advantages compare)",
                                   ge=2, le=1024, group="rl")
    max_completion_length: int = setting(256, "grpo: tokens per completion at most (TRL: 512; 256 keeps CPU "
                                         "rollouts short)", gt=0, le=1_000_000, group="rl")
    temperature: float = setting(1.0, "grpo: sampling temperature of the rollouts (log-probs use the same)", gt=0,
                                 le=100, group="rl")
    top_p: float = setting(1.0, "grpo: nucleus sampling of the rollouts", gt=0, le=1, group="rl")
    kl_beta: float = setting(0.0, "grpo: weight of the KL penalty to the reference (TRL's beta; the reference is "
                             "the base model, the adapter switched off: lora/qlora only)", ge=0, group="rl")
    epsilon: float = setting(0.2, "grpo: clip the importance ratio below at 1 - epsilon (and above, unless "
                             "--epsilon-high)", gt=0, lt=1, group="rl")
    epsilon_high: float | None = setting(None, "grpo: upper clip 1 + epsilon_high (DAPO uses 0.28; default: "
                                         "--epsilon)", gt=0, group="rl")
    loss_type: str = setting("dapo", "grpo: averaging of per-token terms: dapo (over the step's tokens), grpo (per "
                             "completion, then over completions), dr_grpo (by completions x max length), bnpo "
                             "(per micro-batch tokens)", choices=LOSS_TYPES, group="rl")
    scale_rewards: str = setting("group", "grpo: divide advantages by the reward std of the group, the batch, or "
                                 "none (Dr. GRPO)", choices=("group", "batch", "none"), group="rl")
    importance_sampling_level: str = setting("token", "grpo: importance ratio per token, or per sequence (GSPO)",
                                             choices=("token", "sequence"), group="rl")
    rewards: list[str] = setting([], "grpo: built-in rewards: answer (equals --answer-column), format "
                                 "(--format-regex matches), length (soft overlong penalty), json (parses)",
                                 choices=REWARDS, metavar="NAME", group="rl", aliases=("--reward",))
    reward_weights: list[str] = setting([], "grpo: one weight per reward function: the built-ins in order, then "
                                        "the --reward-file functions (default: all 1)", metavar="W", group="rl")
    reward_file: list[str] = setting([], "grpo: your reward functions with TRL's convention, FILE.py or "
                                     "FILE.py:NAME,... (code that runs here: command line only)", repeat=True,
                                     metavar="FILE", group="rl", cli_only=True)
    answer_column: str = setting("answer", "grpo: the data column the answer reward compares with", group="rl")
    format_regex: str = setting("", "grpo: the regular expression the format reward looks for (re.search; anchor "
                                "with ^...$)", metavar="REGEX", group="rl")
    length_penalty_window: int = setting(0, "grpo: the length reward falls from 0 to -1 over the last N tokens "
                                         "before --max-completion-length (0: a quarter of it)", ge=0, group="rl")
    completion_samples_steps: int = setting(0, "grpo: every N steps, write the step's first completions with their "
                                            "rewards to DIR/completions.jsonl (0: never)", ge=0, group="rl")
    # ---- optimisation
    # the upper bounds: far beyond any real run, low enough that the step plan (a list per step) is built at once
    max_steps: int = setting(-1, "optimizer steps (overrides --epochs when > 0)", le=10_000_000)
    epochs: float = setting(1.0, "passes over the training data", ge=0, le=100_000)
    lr: float = setting(2e-4, "peak learning rate", gt=0)
    lr_scheduler: str = setting("linear", "learning-rate schedule after warm-up", choices=("linear", "cosine", "constant"))
    warmup_ratio: float = setting(0.0, "fraction of steps spent warming up the learning rate", ge=0, le=1)
    weight_decay: float = setting(0.0, "AdamW weight decay", ge=0)
    max_grad_norm: float = setting(1.0, "gradient clipping norm (0 turns it off)", ge=0)
    batch_size: int = setting(2, "examples per micro-batch", gt=0)
    grad_accum: int = setting(4, "micro-batches per optimizer step", gt=0)
    seed: int = setting(42, "random seed (data order, LoRA init, dropout)", ge=0, lt=2**63)
    group_by_length: bool = setting(True, "batch examples of similar length together (less padding)")
    packing: str = setting("auto", "padding-free micro-batches", choices=("auto", "on", "off"))
    loss_on_supervised_only: bool = setting(True, "compute the output layer only where labels are trained")
    grad_checkpointing: bool = setting(False, "recompute activations in backward: less memory, ~30% slower")
    auto_batch: bool = setting(False, "after an out-of-memory error, retry with half the micro-batch and twice the "
                               "accumulation (same examples per step)")
    # ---- LoRA and freeze
    lora_r: int = setting(8, "LoRA rank", gt=0, group="lora")
    lora_alpha: float = setting(16, "LoRA alpha (scale = alpha / r)", gt=0, group="lora")
    lora_dropout: float = setting(0.05, "LoRA dropout", ge=0, lt=1, group="lora")
    target_modules: list[str] = setting(DEFAULT_TARGET_MODULES, "modules to adapt: auto (the model family's attention "
                                        "projections: q/k/v/o_proj, Phi-3's qkv_proj/o_proj), all-linear, or names",
                                        metavar="NAME",
                                        group="lora", aliases=("--lora-target",))
    use_dora: bool = setting(False, "DoRA: weight-decomposed LoRA (slower, often better at low rank)", group="lora")
    use_rslora: bool = setting(False, "rank-stabilized LoRA (scale = alpha / sqrt(r))", group="lora")
    modules_to_save: list[str] = setting([], "modules trained in full next to LoRA (e.g. lm_head)", metavar="NAME",
                                         group="lora")
    freeze_trainable_layers: int = setting(2, "freeze: train the last N layers (N < 0: the first |N|)", group="lora")
    freeze_trainable_modules: list[str] = setting(["all"], "freeze: modules inside those layers to train (e.g. mlp), "
                                                  "or all", metavar="NAME", group="lora")
    freeze_extra_modules: list[str] = setting([], "freeze: modules outside the layers to train too (e.g. norm)",
                                              metavar="NAME", group="lora")
    # ---- logging, evaluation, checkpoints
    save_steps: int = setting(0, "save a checkpoint every N steps (0: only at the end)", ge=0, group="run")
    save_total_limit: int = setting(2, "checkpoints to keep (0: all)", ge=0, group="run")
    logging_steps: int = setting(1, "log every N steps", gt=0, group="run")
    eval_steps: int = setting(0, "evaluate every N steps (0: at the end only)", ge=0, group="run")
    early_stopping_patience: int = setting(0, "stop when eval loss has not improved for K evaluations (0: never); "
                                           "the best adapter is kept in DIR/best", ge=0, metavar="K", group="run")
    load_best: bool = setting(False, "make the final adapter the one with the best eval loss (kept in DIR/best)",
                              group="run")
    report_to: list[str] = setting(["none"], "also log to these trackers (comma-separated; metrics.jsonl and "
                                   "loss.png always)", choices=TRACKERS, metavar="NAME", group="run")
    resume: bool = setting(False, "continue from the last checkpoint in --output", group="run")
    overwrite: bool = setting(False, "replace a previous roctune run in --output", group="run")
    # ---- hardware
    device: str = setting("auto", "cuda means NVIDIA or AMD ROCm", choices=("auto", "cuda", "cpu"), group="hardware")
    dtype: str = setting("auto", "auto: bf16/fp16 on GPU, fp32 on CPU", choices=("auto", "bf16", "fp16", "fp32"),
                         group="hardware")
    attn: str = setting("auto", "attention kernel", choices=("auto", "eager", "sdpa", "flash_attention_2"),
                        group="hardware")
    selftest: bool = setting(False, "before loading the model, train a tiny model on this path (device, dtype, "
                             "attention, 4-bit) and compare with float64 on the CPU; stop on wrong numbers",
                             group="hardware")
    # ---- several processes
    nproc: int = setting(1, "processes on this machine: one per GPU (DDP), or with --device cpu N CPU processes "
                         "(gloo)", ge=1, metavar="N", group="processes")
    fsdp: bool = setting(False, "shard the model over the processes (FSDP) instead of a full copy in each",
                         group="processes")
    nnodes: int = setting(1, "machines taking part; run the same command on each with its own --node-rank", ge=1,
                          metavar="N", group="processes")
    node_rank: int = setting(0, "this machine's number, 0..nnodes-1 (0 writes the outputs)", ge=0, metavar="I",
                             group="processes")
    master_addr: str = setting("", "address of node 0, reachable from every node", metavar="HOST", group="processes")
    master_port: int = setting(0, "free TCP port on node 0 (0: 29500, or any free port on one machine)", ge=0,
                               le=65535, metavar="PORT", group="processes")

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def validate(self) -> "TrainConfig":
        """Bounds and choices of every field, then the settings that conflict with each other."""
        for f in dataclasses.fields(self):
            check_value(f, getattr(self, f.name))
            _check_utf8(f.name, getattr(self, f.name))
        if not self.data:
            raise ConfigError("no training data: pass --data FILE (alpaca, messages, sharegpt or prompt/completion JSON/JSONL)")
        if not self.output:
            raise ConfigError("no output directory: pass --output DIR")
        self._check_conflicts()
        return self

    def _check_conflicts(self) -> None:
        if self.max_steps <= 0 and self.epochs <= 0:
            raise ConfigError("set --epochs > 0 or --max-steps > 0")
        if self.streaming and (not self.data_cache or self.stage != "sft"):
            raise ConfigError("--streaming tokenizes into the data cache for sft; drop --no-data-cache "
                              "(or --streaming for dpo)")
        if self.resume and self.overwrite:
            raise ConfigError("--resume continues a run and --overwrite replaces it; pass one of them")
        if self.method == "qlora" and self.fsdp:
            raise ConfigError("--fsdp cannot shard a 4-bit (qlora) base model; use --method lora with --fsdp, "
                              "or qlora without --fsdp")
        if self.resume and self.method in ("freeze", "full"):
            raise ConfigError(f"--resume is not supported with --method {self.method} yet (checkpoints of a "
                              "whole model are saved but not reloaded); start a new run")
        if self.adapter and not os.path.isdir(self.adapter):
            raise ConfigError(f"--adapter {self.adapter}: no such directory")
        if self.use_dora and self.method not in ("lora", "qlora"):
            raise ConfigError(f"--use-dora is a LoRA variant; it does not apply to --method {self.method}")
        if not self.freeze_trainable_modules:
            raise ConfigError("freeze-trainable-modules is empty; name modules (e.g. mlp self_attn) or all")
        if self.node_rank >= self.nnodes:
            raise ConfigError(f"--node-rank must be in 0..{self.nnodes - 1} for --nnodes {self.nnodes} (got {self.node_rank})")
        if self.fsdp and self.nproc * self.nnodes < 2:
            raise ConfigError("--fsdp shards the model over several processes; add --nproc N (N >= 2)")
        if not self.target_modules:
            raise ConfigError("target-modules is empty; name modules (e.g. q_proj v_proj), auto or all-linear")
        self._check_best()
        self.check_grpo()

    def check_grpo(self) -> None:
        import re

        if self.stage != "grpo":
            return
        if not self.rewards and not self.reward_file:
            raise ConfigError("--stage grpo needs a reward: --reward answer|format|length|json and/or "
                              "--reward-file FILE.py")
        if "format" in self.rewards:
            if not self.format_regex:
                raise ConfigError("--reward format needs --format-regex REGEX (e.g. '^<answer>.*</answer>$')")
            try:
                re.compile(self.format_regex)
            except re.error as e:
                raise ConfigError(f"--format-regex {self.format_regex!r}: not a regular expression ({e})") from None
        for w in self.reward_weights:
            check_number("--reward-weights", _number("--reward-weights", w, float))
        if self.kl_beta > 0 and self.method not in ("lora", "qlora"):
            raise ConfigError(f"--kl-beta needs the reference that LoRA gives for free (the adapter switched off); "
                              f"with --method {self.method} use --kl-beta 0")
        if self.fsdp:
            raise ConfigError("--stage grpo samples with the whole model in each process; drop --fsdp")

    def _check_best(self) -> None:
        has_eval = bool(self.eval_data) or self.eval_ratio > 0
        for name, on in (("--early-stopping-patience", self.early_stopping_patience > 0),
                         ("--load-best", self.load_best)):
            if on and not has_eval:
                raise ConfigError(f"{name} needs evaluation data: add --eval-data FILE or --eval-ratio 0.1")
        if self.early_stopping_patience > 0 and not self.eval_steps:
            raise ConfigError("--early-stopping-patience needs --eval-steps N (evaluations during training)")
        if "none" in self.report_to and len(self.report_to) > 1:
            raise ConfigError(f"--report-to {','.join(self.report_to)}: 'none' cannot be combined with trackers; "
                              "drop it")


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def check_value(f: dataclasses.Field, value: Any) -> None:
    """The field's own rules: choices, finite numbers, bounds; the error names the flag."""
    meta = f.metadata
    for one in value if isinstance(value, list) and meta.get("choices") else [value]:
        if meta.get("choices") and one not in meta["choices"]:
            raise ConfigError(f"{flag(f.name)} must be one of {', '.join(meta['choices'])} (got {one!r})")
    check_number(flag(f.name), value, **{b: meta.get(b) for b in ("ge", "gt", "le", "lt")})


def check_number(name: str, value: Any, ge: float | None = None, gt: float | None = None, le: float | None = None,
                 lt: float | None = None) -> None:
    """A number from a flag: finite and within the bounds, or a ConfigError naming `name` (e.g. --top-p).
    Commands whose flags are not training settings check theirs with this, so every number is refused the
    same way (None and non-numbers pass: argparse has typed them)."""
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return
    if not math.isfinite(value):
        raise ConfigError(f"{name} must be a finite number (got {value})")
    for bound, ok, word in ((ge, lambda v, b: v >= b, ">="), (gt, lambda v, b: v > b, ">"),
                            (le, lambda v, b: v <= b, "<="), (lt, lambda v, b: v < b, "<")):
        if bound is not None and not ok(value, bound):
            raise ConfigError(f"{name} must be {word} {bound:g} (got {value:g})")


def check_settings(args: Any, names: tuple[str, ...]) -> None:
    """Check the attributes `names` of `args` (a command's parsed flags named as training settings, e.g. bench's
    --lr) by the settings' own declared rules, so the same number is refused the same way in every command."""
    by_name = {f.name: f for f in fields()}
    for name in names:
        check_value(by_name[name], getattr(args, name))


def fields() -> list[dataclasses.Field]:
    return list(dataclasses.fields(TrainConfig))


def kind(f: dataclasses.Field) -> str:
    """'bool', 'int', 'float', 'list' or 'str' (optional strings too)."""
    t = str(f.type)
    for k in ("list", "bool", "int", "float"):
        if t.startswith(k):
            return k
    return "str"


# ------------------------------------------------------------------------------ values from text and files
def _check_utf8(name: str, value: Any) -> None:
    """A setting (a file name, mostly) that is not valid UTF-8 (a file named in a legacy encoding such as GBK reaches
    Python as surrogate escapes) is refused here: run.yaml, logs and the data cache are UTF-8 and could not hold it."""
    for v in value if isinstance(value, list) else [value]:
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                shown = v.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
                raise ConfigError(f"{flag(name)} {shown}: the name is not valid UTF-8 (a legacy encoding such as GBK);"
                                  " rename the file, e.g. convmv -f gbk -t utf8 --notest FILE") from None


def coerce(name: str, value: Any, f: dataclasses.Field) -> Any:
    """A YAML, flag or `key=value` value as the field's type, with an error naming the key."""
    k = kind(f)
    if value is None and str(f.type).endswith("| None"):  # an optional setting left at its default
        return None
    if k == "list":
        if isinstance(value, str):
            return [v for v in value.replace(",", " ").split() if v]
        if isinstance(value, list):
            # a list with choices (--report-to tensorboard,wandb) also takes comma-separated words; other lists
            # (file paths) keep their commas
            if f.metadata.get("choices"):
                return [w for v in value for w in str(v).replace(",", " ").split() if w]
            return [str(v) for v in value]
        raise ConfigError(f"{name}: expected a list, got {value!r}")
    if k == "bool":
        if isinstance(value, bool):
            return value
        s = str(value).strip().lower()
        if s in ("1", "true", "yes", "on"):
            return True
        if s in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"{name}: expected true or false, got {value!r}")
    if k in ("int", "float"):
        return _number(name, value, int if k == "int" else float)
    return None if value is None else str(value)


def _number(name: str, value: Any, typ: type) -> Any:
    if isinstance(value, bool):
        raise ConfigError(f"{name}: expected a number, got {value!r}")
    try:
        out = typ(value) if typ is float or not isinstance(value, float) else None
    except (TypeError, ValueError, OverflowError):
        out = None
    if out is None or (typ is int and isinstance(value, str) and not value.strip().lstrip("+-").isdigit()):
        raise ConfigError(f"{name}: expected {'an integer' if typ is int else 'a number'}, got {value!r}")
    return out


def apply(cfg: TrainConfig, values: dict[str, Any], origin: str, from_cli: bool = False) -> TrainConfig:
    """Set `values` (names with - or _, or an alias) on `cfg`. `origin` names the source in errors."""
    by_name = {f.name: f for f in fields()}
    given: dict[str, str] = {}
    for raw_key, value in values.items():
        key = ALIASES.get(str(raw_key).replace("-", "_"), str(raw_key).replace("-", "_"))
        if key in given:  # max-length and max_length, or an alias and its setting: which one is meant?
            raise ConfigError(f"{origin}: '{given[key]}' and '{raw_key}' both set {key}; keep one")
        given[key] = str(raw_key)
        if key not in by_name:
            close = [k for k in by_name if key[:4] in k]
            hint = f"; did you mean {', '.join(close[:3])}?" if close else ""
            raise ConfigError(f"{origin}: unknown setting '{raw_key}'{hint}")
        f = by_name[key]
        if f.metadata.get("cli_only") and not from_cli:
            raise ConfigError(f"{origin}: '{raw_key}' can only be given on the command line ({flag(key)}), "
                              "never from a file or override")
        setattr(cfg, key, coerce(f"{origin}: {raw_key}", value, f))
    return cfg


def load_yaml(path: str) -> dict[str, Any]:
    import yaml

    if not os.path.isfile(path):
        raise ConfigError(f"{path}: no such config file")
    try:
        with open(path, encoding="utf-8") as f:
            data = strict_yaml.load(f) or {}
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text; save the config file as UTF-8") from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply to be a config file") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f":{mark.line + 1}" if mark else ""
        raise ConfigError(f"{path}{where}: invalid YAML ({getattr(e, 'problem', e)})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of settings (key: value)")
    return data


def parse_overrides(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"override {item!r}: expected key=value (e.g. lr=1e-4)")
        k, v = item.split("=", 1)
        out[k.strip()] = v.strip()
    return out


def from_sources(yaml_path: str | None = None, flags: dict[str, Any] | None = None,
                 overrides: list[str] | None = None) -> TrainConfig:
    """Defaults, then the YAML file, then flags (the command line's), then key=value overrides."""
    cfg = TrainConfig()
    if yaml_path:
        apply(cfg, load_yaml(yaml_path), yaml_path)
    apply(cfg, flags or {}, "flag", from_cli=True)
    apply(cfg, parse_overrides(overrides or []), "override")
    return cfg


# ---------------------------------------------------------------------------------------- CLI flags
GROUP_TITLES = {"data": "data", "model": "model and method", "training": "optimisation", "lora": "LoRA and freeze",
                "run": "logging, evaluation and checkpoints", "hardware": "hardware",
                "processes": "several processes (effective batch = batch-size x grad-accum x processes)",
                "rl": "reinforcement learning (--stage grpo)"}


def add_flags(parser: argparse.ArgumentParser, names: tuple[str, ...] | None = None) -> None:
    """One flag per setting, generated from the declarations (use with argument_default=SUPPRESS, so only the
    flags given reach `from_sources`). `names`: only those settings (another command reusing them, e.g. eval's
    rewards; their defaults are left to `from_sources`)."""
    groups = {k: parser.add_argument_group(title) for k, title in GROUP_TITLES.items()}
    for f in fields():
        if names is not None and f.name not in names:
            continue
        meta, k = f.metadata, kind(f)
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        help_text = meta["help"] + ("" if default in (None, "", [], False) or k == "bool" else f" (default {_show(default)})")
        kw: dict[str, Any] = {"dest": f.name, "help": help_text}
        if k == "bool":
            kw["action"] = argparse.BooleanOptionalAction if default else "store_true"
        elif k == "list":
            kw.update(action="append" if meta["repeat"] else None, nargs=None if meta["repeat"] else "+",
                      metavar=meta["metavar"])
            kw = {a: b for a, b in kw.items() if b is not None}
        else:
            kw.update(type=_flag_type(f), metavar=meta["metavar"] or (None if meta["choices"] else k.upper()),
                      choices=meta["choices"])
        if k == "list" and meta["choices"]:
            kw["help"] += f" (any of {', '.join(meta['choices'])})"
        if names is not None:
            kw["default"] = argparse.SUPPRESS
        groups[meta["group"]].add_argument(flag(f.name), *meta["aliases"], **kw)


def _show(value: Any) -> str:
    return " ".join(value) if isinstance(value, list) else str(value)


def _flag_type(f: dataclasses.Field):
    def parse(text: str):
        try:
            return coerce(flag(f.name), text, f)
        except ConfigError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    parse.__name__ = kind(f)
    return parse


# -------------------------------------------------------------------------------------------- web UI
def form_fields(groups: tuple[str, ...] | None = None) -> list[dict[str, Any]]:
    """The settings as plain descriptions for a form: name, kind, default, help, choices, bounds, group."""
    out = []
    for f in fields():
        meta = f.metadata
        if groups and meta["group"] not in groups:
            continue
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        out.append({"name": f.name, "kind": kind(f), "default": default, "help": meta["help"],
                    "choices": meta["choices"], "group": meta["group"],
                    "bounds": {b: meta[b] for b in ("ge", "gt", "le", "lt") if meta[b] is not None}})
    return out

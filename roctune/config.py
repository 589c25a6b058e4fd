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
# --pref-loss's names, and those --label-smoothing changes; roctune.training.pref_losses implements one function per
# name (its table must cover exactly these: tests/test_pref_losses.py). Declared here because the settings layer sits
# below the training engine and may not import it.
PREF_LOSSES = ("sigmoid", "ipo", "hinge", "robust", "orpo", "simpo")
SMOOTHED = ("sigmoid", "robust", "simpo")
STAGES = ("sft", "pt", "dpo", "grpo")  # roctune.recipes: one recipe each
LOSS_TYPES = ("dapo", "grpo", "dr_grpo", "bnpo")  # roctune.training.grpo_loss
REWARDS = ("answer", "format", "length", "json")  # roctune.eval.rewards
ROLLOUT_ENGINES = ("roctune", "vllm")  # roctune.decoding, roctune.recipes.grpo_vllm
TRUNCATIONS = ("right", "left", "split")  # roctune.data.render.truncate
ROPE_TYPES = ("linear", "dynamic", "yarn", "llama3")  # transformers' rope_type names (modeling_rope_utils)
TRACKERS = ("tensorboard", "wandb", "mlflow", "trackio", "swanlab", "none")

# Other names users know a setting by (LLaMA-Factory's spelling).
ALIASES = {"lora_target": "target_modules", "pref_beta": "beta", "finetuning_type": "method",
           "dpo_label_smoothing": "label_smoothing"}


def setting(default: Any, help: str, *, choices: tuple | None = None, ge: float | None = None,
            gt: float | None = None, le: float | None = None, lt: float | None = None, repeat: bool = False,
            metavar: str | None = None, group: str = "training", cli_only: bool = False,
            aliases: tuple[str, ...] = (), zh: tuple[str, str], unset: Any = None) -> Any:
    """One setting. `ge/gt/le/lt` bound numbers (NaN and infinity are always refused); `repeat` makes a list
    flag repeatable (--data a --data b) instead of taking several values; `cli_only` settings cannot come from a
    file; `aliases` are extra flag names; `group` places the flag in --help and the web UI; `zh` is its Chinese
    (label, help) for the web UI (the CLI stays English); `unset` is a default that means "not set" (the web UI
    shows it as an empty box)."""
    meta = {"help": help, "zh": zh, "unset": unset, "choices": choices, "ge": ge, "gt": gt, "le": le, "lt": lt, "repeat": repeat,
            "metavar": metavar, "group": group, "cli_only": cli_only, "aliases": aliases}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class TrainConfig:
    # ---- what to train on, and where the run goes
    data: list[str] = setting([], "training data files (repeatable; DIR:name reads LLaMA-Factory's dataset_info.json; "
                              "PATH:W mixes the files by weights W in a seeded order)",
                              repeat=True, metavar="PATH", group="data",
                zh=("训练数据", "训练数据文件（可多个；DIR:name 读取 LLaMA-Factory 的 dataset_info.json；PATH:W 按权重 W 以固定种子的顺序混合）"))
    output: str = setting("", "run directory for the adapter, logs and checkpoints", metavar="DIR", group="data",
                zh=("输出目录", "保存适配器、日志和检查点的运行目录"))
    eval_data: list[str] = setting([], "evaluation data files (repeatable)", repeat=True, metavar="PATH", group="data",
                zh=("评估数据", "评估数据文件（可多个）"))
    eval_ratio: float = setting(0.0, "hold out this fraction of the training data for evaluation", ge=0, lt=1,
                                group="data",
                zh=("评估比例", "从训练数据中留出这一比例用于评估"))
    max_length: int = setting(512, "tokens per example; longer ones are truncated", gt=0, group="data",
                zh=("最大长度", "每个样本的 token 数；更长的会被截断"))
    learn_reasoning: bool = setting(True, "learn the reasoning of answers (<think> blocks, reasoning_content); "
                                    "off: it stays in the context but is not learned", group="data",
                zh=("学习推理过程", "学习回答中的推理（<think> 块、reasoning_content）；关闭时它只作为上下文，不参与学习"))
    empty_think: str = setting("learn", "an empty <think></think> block in an answer: learn it (answer without "
                               "thinking), mask it (context only) or drop it", choices=("learn", "mask", "drop"),
                               group="data",
                zh=("空的思考块", "回答中空的 <think></think> 块：学习它（不思考直接回答）、遮蔽它（仅作上下文）或删除它"))
    # ---- chat template (roctune/data/templates.py holds the rows and checks the name before a model loads)
    template: str | None = setting(None, "chat template by name (chatml, llama3, qwen2.5, qwen3, gemma, mistral, phi3, "
                                   "deepseek-r1, ...) for a model without one, or to override its own; default: the "
                                   "model's own, else its family's", metavar="NAME", group="data",
                zh=("对话模板", "按名称选择对话模板（chatml、llama3、qwen2.5、qwen3、gemma、mistral、phi3、deepseek-r1 等），"
                    "用于没有模板的模型或替换它自带的；默认：模型自带的，否则用其系列的模板"))
    data_cache: bool = setting(True, "keep tokenized data in $ROCTUNE_HOME/cache/tokenized, so a restart or "
                               "--resume does not tokenize again", group="data",
                zh=("数据缓存", "把分词后的数据保存在 $ROCTUNE_HOME/cache/tokenized，重启或“继续训练”时不必重新分词"))
    streaming: bool = setting(False, "read and tokenize the data a chunk at a time straight into the on-disk cache "
                              "and train from it memory-mapped: for datasets larger than memory (sft)", group="data",
                zh=("流式读取", "分块读取并分词，直接写入磁盘缓存，训练时内存映射读取：用于比内存还大的数据集（sft）"))
    # ---- model and method
    model: str | None = setting(None, "base model: local dir or hub id (default: bundled SmolLM2-135M-Instruct)",
                                metavar="NAME", group="model",
                zh=("基础模型", "基础模型：本地目录或 Hub ID（默认：自带的 SmolLM2-135M-Instruct）"))
    method: str = setting("lora", "lora; qlora: LoRA on a 4-bit NF4 base (bitsandbytes); freeze: train only the "
                          "last N layers; full: every parameter", choices=METHODS, group="model",
                zh=("微调方法", "lora；qlora：在 4 位 NF4 基础模型上做 LoRA（bitsandbytes）；freeze：只训练最后 N 层；full：训练全部参数"))
    stage: str = setting("sft", "sft (supervised answers), pt (continued pretraining on raw text: .txt files or a "
                         "'text' column, packed into --max-length blocks), dpo (preference pairs: "
                         "prompt/chosen/rejected, or LLaMA-Factory ranking data) or grpo (RL from rewards on prompts)",
                         choices=STAGES, group="model",
                zh=("训练阶段", "sft（监督学习回答）、pt（继续预训练：原始文本，.txt 文件或 'text' 列，打包成“最大长度”长的块）、dpo（偏好对：prompt/chosen/rejected，或 LLaMA-Factory 的排序数据）或 grpo（基于奖励的强化学习，只需提示词）"))
    adapter: str | None = setting(None, "start from this LoRA adapter (e.g. the SFT run before dpo)", metavar="DIR",
                                  group="model",
                zh=("起始适配器", "从这个 LoRA 适配器开始训练（例如 dpo 之前的 SFT 运行）"))
    beta: float = setting(0.1, "dpo: how far the policy may move from the reference", gt=0, group="model",
                zh=("β 系数", "dpo：策略可以偏离参考模型多远"))
    # ---- dpo's loss (roctune.training.pref_losses declares the choices and implements them)
    pref_loss: str = setting("sigmoid", "dpo: preference loss: sigmoid (DPO), ipo, hinge, robust (label-flip "
                             "noise), or without a reference model (no reference pass): orpo (odds ratio + SFT "
                             "loss of the chosen answer), simpo (length-normalised margin; try --beta 2)",
                             choices=PREF_LOSSES, group="model",
                zh=("偏好损失", "dpo：偏好损失：sigmoid（DPO）、ipo、hinge、robust（标签翻转噪声），或不需要参考模型（省去参考打分）："
                    "orpo（几率比 + 选中回答的 SFT 损失）、simpo（按长度归一化的差距；可试把“β 系数”设为 2）"))
    label_smoothing: float = setting(0.0, "dpo: probability in [0, 0.5) that a preference label is flipped "
                                     "(--pref-loss robust, simpo, and sigmoid as conservative DPO)", ge=0, lt=0.5,
                                     group="model",
                zh=("标签平滑", "dpo：偏好标签被翻转的概率，取值 [0, 0.5)（“偏好损失”robust、simpo，以及 sigmoid 即保守 DPO）"))
    simpo_gamma: float = setting(0.5, "dpo: --pref-loss simpo's target reward margin (TRL's simpo_gamma)", ge=0,
                                 group="model",
                zh=("SimPO gamma", "dpo：“偏好损失”simpo 的目标奖励差距（TRL 的 simpo_gamma）"))
    trust_remote_code: bool = setting(False, "run code from the model repository (off by default; command line only)",
                                      group="model", cli_only=True,
                zh=("信任远程代码", "运行模型仓库中的代码（默认关闭；只能在命令行开启）"))
    # ---- reinforcement learning (grpo); defaults are TRL's GRPOConfig's unless said
    num_generations: int = setting(8, "grpo: completions sampled per prompt (the group its advantages compare)",
                                   ge=2, le=1024, group="rl",
                zh=("每个提示的生成数", "grpo：每个提示采样的回答数（优势在这一组内比较）"))
    max_completion_length: int = setting(256, "grpo: tokens per completion at most (TRL: 512; 256 keeps CPU "
                                         "rollouts short)", gt=0, le=1_000_000, group="rl",
                zh=("最大生成长度", "grpo：每个回答最多的 token 数（TRL：512；256 让 CPU 上的采样更快）"))
    temperature: float = setting(1.0, "grpo: sampling temperature of the rollouts (log-probs use the same)", gt=0,
                                 le=100, group="rl",
                zh=("采样温度", "grpo：采样回答时的温度（对数概率也用同一温度）"))
    top_p: float = setting(1.0, "grpo: nucleus sampling of the rollouts", gt=0, le=1, group="rl",
                zh=("top-p", "grpo：采样回答时的核采样阈值"))
    kl_beta: float = setting(0.0, "grpo: weight of the KL penalty to the reference (TRL's beta; the reference is "
                             "the base model, the adapter switched off: lora/qlora only)", ge=0, group="rl",
                zh=("KL 系数", "grpo：到参考模型的 KL 惩罚权重（TRL 的 beta；参考模型是关闭适配器的基础模型：仅 lora/qlora）"))
    epsilon: float = setting(0.2, "grpo: clip the importance ratio below at 1 - epsilon (and above, unless "
                             "--epsilon-high)", gt=0, lt=1, group="rl",
                zh=("裁剪范围 epsilon", "grpo：重要性比率下限裁剪到 1 - epsilon（未设“上限裁剪 epsilon_high”时上限同理）"))
    epsilon_high: float | None = setting(None, "grpo: upper clip 1 + epsilon_high (DAPO uses 0.28; default: "
                                         "--epsilon)", gt=0, group="rl",
                zh=("上限裁剪 epsilon_high", "grpo：上限裁剪到 1 + epsilon_high（DAPO 用 0.28；默认等于“裁剪范围 epsilon”）"))
    loss_type: str = setting("dapo", "grpo: averaging of per-token terms: dapo (over the step's tokens), grpo (per "
                             "completion, then over completions), dr_grpo (by completions x max length), bnpo "
                             "(per micro-batch tokens)", choices=LOSS_TYPES, group="rl",
                zh=("损失类型", "grpo：逐 token 项的平均方式：dapo（按本步全部 token）、grpo（先按回答再跨回答）、dr_grpo（除以回答数 × 最大长度）、bnpo（按微批次的 token）"))
    scale_rewards: str = setting("group", "grpo: divide advantages by the reward std of the group, the batch, or "
                                 "none (Dr. GRPO)", choices=("group", "batch", "none"), group="rl",
                zh=("奖励缩放", "grpo：优势除以组内、整批的奖励标准差，或不缩放（Dr. GRPO）"))
    importance_sampling_level: str = setting("token", "grpo: importance ratio per token, or per sequence (GSPO)",
                                             choices=("token", "sequence"), group="rl",
                zh=("重要性采样级别", "grpo：按 token 或按整条序列（GSPO）计算重要性比率"))
    rewards: list[str] = setting([], "grpo: built-in rewards: answer (equals --answer-column), format "
                                 "(--format-regex matches), length (soft overlong penalty), json (parses)",
                                 choices=REWARDS, metavar="NAME", group="rl", aliases=("--reward",),
                zh=("内置奖励", "grpo：内置奖励：answer（等于“答案列”）、format（匹配“格式正则”）、length（超长软惩罚）、json（可解析）"))
    reward_weights: list[str] = setting([], "grpo: one weight per reward function: the built-ins in order, then "
                                        "the --reward-file functions (default: all 1)", metavar="W", group="rl",
                zh=("奖励权重", "grpo：每个奖励函数一个权重：先按顺序给内置奖励，再给 --reward-file 中的函数（默认都为 1）"))
    reward_file: list[str] = setting([], "grpo: your reward functions with TRL's convention, FILE.py or "
                                     "FILE.py:NAME,... (code that runs here: command line only)", repeat=True,
                                     metavar="FILE", group="rl", cli_only=True,
                zh=("奖励函数文件", "grpo：你自己的奖励函数（TRL 约定），FILE.py 或 FILE.py:NAME,…（会在本机运行的代码：只能在命令行指定）"))
    answer_column: str = setting("answer", "grpo: the data column the answer reward compares with", group="rl",
                zh=("答案列", "grpo：answer 奖励用来比较的数据列"))
    format_regex: str = setting("", "grpo: the regular expression the format reward looks for (re.search; anchor "
                                "with ^...$)", metavar="REGEX", group="rl",
                zh=("格式正则", "grpo：format 奖励查找的正则表达式（re.search；用 ^...$ 锚定）"))
    length_penalty_window: int = setting(0, "grpo: the length reward falls from 0 to -1 over the last N tokens "
                                         "before --max-completion-length (0: a quarter of it)", ge=0, group="rl",
                zh=("长度惩罚窗口", "grpo：在“最大生成长度”之前的最后 N 个 token 内，length 奖励从 0 降到 -1（0：取其四分之一）"))
    completion_samples_steps: int = setting(0, "grpo: every N steps, write the step's first completions with their "
                                            "rewards to DIR/completions.jsonl (0: never)", ge=0, group="rl",
                zh=("回答样例间隔", "grpo：每 N 步把本步的前几个回答及其奖励写入 DIR/completions.jsonl（0：从不）"))
    rollout_engine: str = setting("roctune", "grpo: what samples the rollouts: roctune (the model being trained, "
                                  "in this process) or vllm (a vLLM server started for the run and given the "
                                  "adapter each step; --method lora only; vLLM from `make vllm` or "
                                  "$ROCTUNE_VLLM_PYTHON)", choices=ROLLOUT_ENGINES, group="rl",
                zh=("采样引擎", "grpo：由谁采样回答：roctune（本进程中正在训练的模型）或 vllm（为本次运行启动的 vLLM 服务，每步载入适配器；仅“微调方法”lora；vLLM 来自 `make vllm` 或 $ROCTUNE_VLLM_PYTHON）"))
    # ---- optimisation
    # the upper bounds: far beyond any real run, low enough that the step plan (a list per step) is built at once
    max_steps: int = setting(-1, "optimizer steps (overrides --epochs when > 0)", le=10_000_000, unset=-1,
                zh=("最大步数", "优化器步数（大于 0 时覆盖“训练轮数”）"))
    epochs: float = setting(1.0, "passes over the training data", ge=0, le=100_000,
                zh=("训练轮数", "遍历训练数据的次数"))
    lr: float = setting(2e-4, "peak learning rate", gt=0,
                zh=("学习率", "峰值学习率"))
    lr_scheduler: str = setting("linear", "learning-rate schedule after warm-up", choices=("linear", "cosine", "constant"),
                zh=("学习率调度", "预热之后的学习率变化方式"))
    warmup_ratio: float = setting(0.0, "fraction of steps spent warming up the learning rate", ge=0, le=1,
                zh=("预热比例", "用于预热学习率的步数比例"))
    weight_decay: float = setting(0.0, "AdamW weight decay", ge=0,
                zh=("权重衰减", "AdamW 权重衰减"))
    max_grad_norm: float = setting(1.0, "gradient clipping norm (0 turns it off)", ge=0,
                zh=("梯度裁剪", "梯度裁剪的范数（0 表示关闭）"))
    batch_size: int = setting(2, "examples per micro-batch", gt=0,
                zh=("批大小", "每个微批次的样本数"))
    grad_accum: int = setting(4, "micro-batches per optimizer step", gt=0,
                zh=("梯度累积", "每个优化器步骤累积的微批次数"))
    seed: int = setting(42, "random seed (data order, LoRA init, dropout)", ge=0, lt=2**63,
                zh=("随机种子", "随机种子（数据顺序、LoRA 初始化、dropout）"))
    group_by_length: bool = setting(True, "batch examples of similar length together (less padding)",
                zh=("按长度分组", "把长度相近的样本放在同一批（更少填充）"))
    packing: str = setting("auto", "padding-free micro-batches", choices=("auto", "on", "off"),
                zh=("序列打包", "无填充的微批次"))
    loss_on_supervised_only: bool = setting(True, "compute the output layer only where labels are trained",
                zh=("只在监督位置计算输出层", "只在需要学习的标签位置计算输出层"))
    grad_checkpointing: bool = setting(False, "recompute activations in backward: less memory, ~30% slower",
                zh=("梯度检查点", "反向传播时重新计算激活：更省内存，约慢 30%"))
    auto_batch: bool = setting(False, "after an out-of-memory error, retry with half the micro-batch and twice the "
                               "accumulation (same examples per step)",
                zh=("自动批大小", "显存不足后，以一半的微批次和两倍的累积重试（每步样本数不变）"))
    # ---- LoRA and freeze
    lora_r: int = setting(8, "LoRA rank", gt=0, group="lora",
                zh=("LoRA 秩", "LoRA 秩"))
    lora_alpha: float = setting(16, "LoRA alpha (scale = alpha / r)", gt=0, group="lora",
                zh=("LoRA alpha", "LoRA alpha（缩放 = alpha / r）"))
    lora_dropout: float = setting(0.05, "LoRA dropout", ge=0, lt=1, group="lora",
                zh=("LoRA dropout", "LoRA 的 dropout 比例"))
    target_modules: list[str] = setting(DEFAULT_TARGET_MODULES, "modules to adapt: auto (the model family's attention "
                                        "projections: q/k/v/o_proj, Phi-3's qkv_proj/o_proj), all-linear, or names",
                                        metavar="NAME",
                                        group="lora", aliases=("--lora-target",),
                zh=("目标模块", "要适配的模块：auto（该模型家族的注意力投影：q/k/v/o_proj，Phi-3 的 qkv_proj/o_proj）、all-linear 或模块名"))
    use_dora: bool = setting(False, "DoRA: weight-decomposed LoRA (slower, often better at low rank)", group="lora",
                zh=("使用 DoRA", "DoRA：权重分解的 LoRA（更慢，低秩时常常更好）"))
    use_rslora: bool = setting(False, "rank-stabilized LoRA (scale = alpha / sqrt(r))", group="lora",
                zh=("使用 rsLoRA", "秩稳定的 LoRA（缩放 = alpha / sqrt(r)）"))
    modules_to_save: list[str] = setting([], "modules trained in full next to LoRA (e.g. lm_head)", metavar="NAME",
                                         group="lora",
                zh=("完整训练的模块", "在 LoRA 之外完整训练的模块（例如 lm_head）"))
    freeze_trainable_layers: int = setting(2, "freeze: train the last N layers (N < 0: the first |N|)", group="lora",
                zh=("可训练层数", "freeze：训练最后 N 层（N < 0：最前面的 |N| 层）"))
    freeze_trainable_modules: list[str] = setting(["all"], "freeze: modules inside those layers to train (e.g. mlp), "
                                                  "or all", metavar="NAME", group="lora",
                zh=("可训练模块", "freeze：这些层中要训练的模块（例如 mlp），或 all"))
    freeze_extra_modules: list[str] = setting([], "freeze: modules outside the layers to train too (e.g. norm)",
                                              metavar="NAME", group="lora",
                zh=("额外可训练模块", "freeze：这些层之外也要训练的模块（例如 norm）"))
    # ---- logging, evaluation, checkpoints
    save_steps: int = setting(0, "save a checkpoint every N steps (0: only at the end)", ge=0, group="run",
                zh=("保存间隔", "每 N 步保存一个检查点（0：只在结束时）"))
    save_total_limit: int = setting(2, "checkpoints to keep (0: all)", ge=0, group="run",
                zh=("保留检查点数", "保留的检查点数量（0：全部）"))
    logging_steps: int = setting(1, "log every N steps", gt=0, group="run",
                zh=("日志间隔", "每 N 步记录一次日志"))
    eval_steps: int = setting(0, "evaluate every N steps (0: at the end only)", ge=0, group="run",
                zh=("评估间隔", "每 N 步评估一次（0：只在结束时）"))
    early_stopping_patience: int = setting(0, "stop when eval loss has not improved for K evaluations (0: never); "
                                           "the best adapter is kept in DIR/best", ge=0, metavar="K", group="run",
                zh=("早停耐心", "评估损失连续 K 次没有改善就停止（0：从不）；最好的适配器保存在 DIR/best"))
    load_best: bool = setting(False, "make the final adapter the one with the best eval loss (kept in DIR/best)",
                              group="run",
                zh=("加载最佳", "让最终适配器成为评估损失最低的那个（保存在 DIR/best）"))
    report_to: list[str] = setting(["none"], "also log to these trackers (comma-separated; metrics.jsonl and "
                                   "loss.png always)", choices=TRACKERS, metavar="NAME", group="run",
                zh=("记录到", "同时记录到这些跟踪工具（逗号分隔；metrics.jsonl 和 loss.png 总会写）"))
    resume: bool = setting(False, "continue from the last checkpoint in --output", group="run",
                zh=("继续训练", "从“输出目录”中最后一个检查点继续"))
    overwrite: bool = setting(False, "replace a previous roctune run in --output", group="run",
                zh=("覆盖", "替换“输出目录”中以前的 roctune 运行"))
    # ---- hardware
    device: str = setting("auto", "cuda means NVIDIA or AMD ROCm", choices=("auto", "cuda", "cpu"), group="hardware",
                zh=("设备", "cuda 表示 NVIDIA 或 AMD ROCm"))
    dtype: str = setting("auto", "auto: bf16/fp16 on GPU, fp32 on CPU", choices=("auto", "bf16", "fp16", "fp32"),
                         group="hardware",
                zh=("数据类型", "auto：GPU 上 bf16/fp16，CPU 上 fp32"))
    attn: str = setting("auto", "attention kernel", choices=("auto", "eager", "sdpa", "flash_attention_2"),
                        group="hardware",
                zh=("注意力实现", "注意力内核"))
    # ---- compiled layers and fused kernels (roctune.training.compiled, issue 38)
    compile: str = setting("auto", "torch.compile the decoder layers (one compile serves every layer); auto: on a "
                           "GPU for runs long enough to earn the compile time", choices=("auto", "on", "off"),
                           group="hardware",
                zh=("编译", "用 torch.compile 编译解码层（一次编译供所有层使用）；auto：在 GPU 上且训练足够长时开启"))
    fused_kernels: str = setting("auto", "Liger-Kernel's fused RMSNorm/RoPE/SwiGLU where the model's family opts in "
                                 "and Triton runs (a GPU, pip install 'roctune[fused]')", choices=("auto", "off"),
                                 group="hardware",
                zh=("融合内核", "在模型家族支持且 Triton 可运行时（GPU，pip install 'roctune[fused]'）使用 Liger-Kernel 的融合 RMSNorm/RoPE/SwiGLU"))
    selftest: bool = setting(False, "before loading the model, train a tiny model on this path (device, dtype, "
                             "attention, 4-bit) and compare with float64 on the CPU; stop on wrong numbers",
                             group="hardware",
                zh=("自检", "加载模型之前，在这条路径上（设备、数据类型、注意力、4 位）训练一个极小模型并与 CPU 上的 float64 比较；数值不对就停止"))
    # ---- several processes
    nproc: int = setting(1, "processes on this machine: one per GPU (DDP), or with --device cpu N CPU processes "
                         "(gloo)", ge=1, metavar="N", group="processes",
                zh=("进程数", "本机的进程数：每个 GPU 一个（DDP），或配合“设备”cpu 使用 N 个 CPU 进程（gloo）"))
    fsdp: bool = setting(False, "shard the model over the processes (FSDP) instead of a full copy in each",
                         group="processes",
                zh=("FSDP 分片", "把模型分片到各进程（FSDP），而不是每个进程一份完整副本"))
    nnodes: int = setting(1, "machines taking part; run the same command on each with its own --node-rank", ge=1,
                          metavar="N", group="processes",
                zh=("机器数", "参与的机器数；在每台机器上运行同一条命令并给出各自的 --node-rank"))
    node_rank: int = setting(0, "this machine's number, 0..nnodes-1 (0 writes the outputs)", ge=0, metavar="I",
                             group="processes",
                zh=("机器编号", "这台机器的编号，0..nnodes-1（0 号写输出）"))
    master_addr: str = setting("", "address of node 0, reachable from every node", metavar="HOST", group="processes",
                zh=("主节点地址", "0 号节点的地址，所有节点都要能访问"))
    master_port: int = setting(0, "free TCP port on node 0 (0: 29500, or any free port on one machine)", ge=0,
                               le=65535, metavar="PORT", group="processes",
                zh=("主节点端口", "0 号节点上空闲的 TCP 端口（0：29500，或单机时任意空闲端口）"))
    # ---- long sequences (issue 36): one example over several processes, positions past the native context
    sequence_parallel: int = setting(1, "split each example's tokens over N processes (Ulysses: an all-to-all over "
                                     "attention heads); N divides --nproc x --nnodes and the model's heads; the "
                                     "other factor is data parallelism (sft)", ge=1, metavar="N", group="processes",
                zh=("序列并行", "把每个样本的 token 分到 N 个进程（Ulysses：按注意力头做 all-to-all）；N 须整除进程总数和模型的头数；剩下的倍数是数据并行（sft）"))
    truncation: str = setting("right", "an example longer than --max-length: right cuts its end, left its start "
                              "(keeps the latest turns), split makes it several examples of --max-length tokens "
                              "(documents, long answers; the prompt is not repeated) (sft)", choices=TRUNCATIONS,
                              group="data",
                zh=("截断方式", "超过最大长度的样本：right 截掉结尾，left 截掉开头（保留最近几轮），split 切成多个最大长度的样本（文档、长回答；不重复提示词）（sft）"))
    rope_scaling: str = setting("", "stretch the rotary positions past the model's native context, TYPE:FACTOR "
                                f"with TYPE one of {', '.join(ROPE_TYPES)} (e.g. yarn:4); kept in run.yaml and the "
                                "merged/exported model", metavar="TYPE:FACTOR", group="data",
                zh=("RoPE 缩放", "把旋转位置编码拉伸到模型原生上下文之外，TYPE:FACTOR，TYPE 为 linear、dynamic、yarn、llama3（例如 yarn:4）；记录在 run.yaml 和合并/导出的模型中"))

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
            raise ConfigError("no training data: pass --data FILE (alpaca, messages, sharegpt or prompt/completion "
                              "JSON/JSONL)", key="no_data", field="data")
        if not self.output:
            raise ConfigError("no output directory: pass --output DIR", key="no_output", field="output")
        self._check_conflicts()
        return self

    def _check_conflicts(self) -> None:
        if self.max_steps <= 0 and self.epochs <= 0:
            raise ConfigError("set --epochs > 0 or --max-steps > 0", key="no_steps", field="max_steps")
        if self.streaming and (not self.data_cache or self.stage != "sft"):
            raise ConfigError("--streaming tokenizes into the data cache for sft; drop --no-data-cache "
                              "(or --streaming for dpo)")
        if self.resume and self.overwrite:
            raise ConfigError("--resume continues a run and --overwrite replaces it; pass one of them",
                              key="resume_and_overwrite", field="overwrite")
        if self.method == "qlora" and self.fsdp:
            raise ConfigError("--fsdp cannot shard a 4-bit (qlora) base model; use --method lora with --fsdp, "
                              "or qlora without --fsdp")
        if self.resume and self.method in ("freeze", "full"):
            raise ConfigError(f"--resume is not supported with --method {self.method} yet (checkpoints of a "
                              "whole model are saved but not reloaded); start a new run")
        if self.adapter and not os.path.isdir(self.adapter):
            raise ConfigError(f"--adapter {self.adapter}: no such directory", key="no_such_dir", field="adapter",
                              path=self.adapter)
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
        self._check_pref()
        self.check_grpo()
        self._check_pt()
        self._check_long()

    def _check_pref(self) -> None:
        """--pref-loss and its settings are --stage dpo's; --label-smoothing changes only some of the losses."""
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        changed = [n for n in ("pref_loss", "label_smoothing", "simpo_gamma") if getattr(self, n) != defaults[n]]
        if changed and self.stage != "dpo":
            raise ConfigError(f"{flag(changed[0])} sets the preference loss of --stage dpo; drop it for "
                              f"--stage {self.stage}")
        if self.label_smoothing and self.pref_loss not in SMOOTHED:
            raise ConfigError(f"--label-smoothing applies to --pref-loss {', '.join(SMOOTHED)}, not "
                              f"{self.pref_loss}; drop it")
        if self.simpo_gamma != defaults["simpo_gamma"] and self.pref_loss != "simpo":
            raise ConfigError(f"--simpo-gamma is the margin of --pref-loss simpo; drop it for --pref-loss "
                              f"{self.pref_loss}")

    def _check_long(self) -> None:
        """--sequence-parallel and --rope-scaling against the other settings (the model's heads and context are
        checked before it loads, in roctune.training.sequence_parallel and roctune.models)."""
        rope_scaling_parts(self.rope_scaling)
        if self.truncation != "right" and self.stage != "sft":
            raise ConfigError(f"--truncation {self.truncation} is for --stage sft; {self.stage} keeps prompts and "
                              "answers whole (use --truncation right)")
        if self.truncation == "split" and self.max_length < 2:
            raise ConfigError("--truncation split needs --max-length 2 or more (windows overlap by one token)")
        p, world = self.sequence_parallel, self.nproc * self.nnodes
        if p == 1:
            return
        if world % p:
            raise ConfigError(f"--sequence-parallel {p} must divide the {world} processes (--nproc x --nnodes); "
                              f"use --nproc {p} (or a multiple of it)")
        for on, what, fix in ((self.stage != "sft", f"--stage {self.stage}", "use --stage sft"),
                              (self.fsdp, "--fsdp", "drop --fsdp (it composes with DDP: each group keeps a copy)"),
                              (self.packing == "on", "--packing on", "use --packing off or auto")):
            if on:
                raise ConfigError(f"--sequence-parallel does not support {what} yet; {fix}")

    def _check_pt(self) -> None:
        """--stage pt learns raw text: the chat template and the settings of answers have nothing to act on."""
        if self.stage != "pt":
            return
        for on, name in ((self.template is not None, f"--template {self.template}"),
                         (not self.learn_reasoning, "--no-learn-reasoning"),
                         (self.empty_think != "learn", f"--empty-think {self.empty_think}")):
            if on:
                raise ConfigError(f"{name} acts on chat conversations; --stage pt learns raw text without a "
                                  f"chat template: drop {name.split()[0]}")
        if self.truncation != "right":
            raise ConfigError(f"--truncation {self.truncation}: --stage pt cuts the text into --max-length blocks "
                              "itself (nothing is truncated); drop --truncation")

    def check_grpo(self) -> None:
        import re

        if self.stage != "grpo":
            if self.rollout_engine != "roctune":
                raise ConfigError(f"--rollout-engine {self.rollout_engine} samples GRPO's rollouts; use it with "
                                  "--stage grpo")
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
        if self.rollout_engine == "vllm":
            self._check_vllm_rollouts()

    def _check_vllm_rollouts(self) -> None:
        """What vLLM rollouts need (roctune.recipes.grpo_vllm): a plain LoRA adapter vLLM can load each step."""
        if self.method != "lora":
            raise ConfigError(f"--rollout-engine vllm needs --method lora (not {self.method}): vLLM samples from "
                              "the policy as it is each step, and with LoRA only the small adapter is sent to it; "
                              f"with {self.method} the model's weights would be copied into vLLM every step. Use "
                              "--method lora or --rollout-engine roctune")
        for on, name in ((self.use_dora, "--use-dora"), (self.modules_to_save, "--modules-to-save")):
            if on:
                raise ConfigError(f"--rollout-engine vllm: vLLM cannot load an adapter trained with {name}; drop "
                                  f"{name} or use --rollout-engine roctune")
        embedded = [t for t in self.target_modules if any(k in t for k in ("embed", "lm_head", "wte"))]
        if embedded:
            raise ConfigError(f"--rollout-engine vllm: vLLM cannot load LoRA on the embedding or output layer "
                              f"(--target-modules {' '.join(embedded)}); drop them or use --rollout-engine roctune")
        if self.nproc * self.nnodes > 1:
            raise ConfigError("--rollout-engine vllm runs one vLLM server for one training process; drop --nproc/"
                              "--nnodes or use --rollout-engine roctune")
        from roctune.hardware.vllm import VLLM_LORA_RANKS

        if self.lora_r > VLLM_LORA_RANKS[-1]:
            raise ConfigError(f"--rollout-engine vllm: --lora-r {self.lora_r} is above vLLM's largest LoRA rank "
                              f"({VLLM_LORA_RANKS[-1]}); lower it or use --rollout-engine roctune")

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


def rope_scaling_parts(text: str) -> tuple[str, float] | None:
    """--rope-scaling TYPE:FACTOR as (type, factor), None when empty; a ConfigError naming the fix otherwise."""
    if not text:
        return None
    kind_, _, factor = text.partition(":")
    try:
        value = float(factor)
    except ValueError:
        value = float("nan")
    if kind_ not in ROPE_TYPES or not math.isfinite(value) or value <= 1:
        raise ConfigError(f"--rope-scaling {text!r}: expected TYPE:FACTOR with TYPE one of {', '.join(ROPE_TYPES)} "
                          "and FACTOR > 1 (e.g. yarn:4 for four times the native context)")
    return kind_, value


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def check_value(f: dataclasses.Field, value: Any) -> None:
    """The field's own rules: choices, finite numbers, bounds; the error names the flag."""
    meta = f.metadata
    for one in value if isinstance(value, list) and meta.get("choices") else [value]:
        if meta.get("choices") and one not in meta["choices"]:
            raise ConfigError(f"{flag(f.name)} must be one of {', '.join(meta['choices'])} (got {one!r})",
                              key="choice", field=f.name, choices=", ".join(meta["choices"]), got=repr(one))
    check_number(flag(f.name), value, **{b: meta.get(b) for b in ("ge", "gt", "le", "lt")}, field=f.name)


def check_number(name: str, value: Any, ge: float | None = None, gt: float | None = None, le: float | None = None,
                 lt: float | None = None, field: str | None = None) -> None:
    """A number from a flag: finite and within the bounds, or a ConfigError naming `name` (e.g. --top-p).
    Commands whose flags are not training settings check theirs with this, so every number is refused the
    same way (None and non-numbers pass: argparse has typed them)."""
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return
    if not math.isfinite(value):
        raise ConfigError(f"{name} must be a finite number (got {value})", key="not_finite", field=field,
                          got=value)
    for bound, ok, word in ((ge, lambda v, b: v >= b, ">="), (gt, lambda v, b: v > b, ">"),
                            (le, lambda v, b: v <= b, "<="), (lt, lambda v, b: v < b, "<")):
        if bound is not None and not ok(value, bound):
            raise ConfigError(f"{name} must be {word} {bound:g} (got {value:g})", key="bound", field=field,
                              op=word, limit=f"{bound:g}", got=f"{value:g}")


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
        return _number(name, value, int if k == "int" else float, f.name)
    return None if value is None else str(value)


def _number(name: str, value: Any, typ: type, field: str | None = None) -> Any:
    if isinstance(value, bool):
        raise ConfigError(f"{name}: expected a number, got {value!r}", key="not_number", field=field, got=repr(value))
    try:
        out = typ(value) if typ is float or not isinstance(value, float) else None
    except (TypeError, ValueError, OverflowError):
        out = None
    if out is None or (typ is int and isinstance(value, str) and not value.strip().lstrip("+-").isdigit()):
        raise ConfigError(f"{name}: expected {'an integer' if typ is int else 'a number'}, got {value!r}",
                          key="not_integer" if typ is int else "not_number", field=field,
                          got=repr(value))
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
        raise ConfigError(strict_yaml.error_line(path, e)) from None
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
GROUP_TITLES_ZH = {"data": "数据", "model": "模型与方法", "training": "优化", "lora": "LoRA 与冻结",
                   "run": "日志、评估与检查点", "hardware": "硬件",
                   "processes": "多进程（有效批大小 = 批大小 × 梯度累积 × 进程数）",
                   "rl": "强化学习（训练阶段 grpo）"}
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
    """The settings as plain descriptions for a form: name, kind, default, help (and its Chinese label_zh and
    help_zh), choices, bounds, group."""
    out = []
    for f in fields():
        meta = f.metadata
        if groups and meta["group"] not in groups:
            continue
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        out.append({"name": f.name, "kind": kind(f), "default": default, "help": meta["help"],
                    "label_zh": meta["zh"][0], "help_zh": meta["zh"][1], "unset": meta["unset"],
                    "choices": meta["choices"], "group": meta["group"],
                    "bounds": {b: meta[b] for b in ("ge", "gt", "le", "lt") if meta[b] is not None}})
    return out

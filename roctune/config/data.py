"""What to train on and where the run goes: data files, lengths, the chat template and the data cache."""
from __future__ import annotations

from dataclasses import dataclass

from roctune import stages
from roctune.config.schema import setting
from roctune.errors import ConfigError


@dataclass
class DataSettings:
    # ---- what to train on, and where the run goes
    data: list[str] = setting([], "training data files (repeatable; DIR:name reads LLaMA-Factory's dataset_info.json; "
                              "PATH:W mixes the files by weights W in a seeded order)",
                              repeat=True, metavar="PATH", group="data",
                resume_fixed=True,
                zh=("训练数据", "训练数据文件（可多个；DIR:name 读取 LLaMA-Factory 的 dataset_info.json；PATH:W 按权重 W 以固定种子的顺序混合）"))
    output: str = setting("", "run directory for the adapter, logs and checkpoints", metavar="DIR", group="data",
                zh=("输出目录", "保存适配器、日志和检查点的运行目录"))
    eval_data: list[str] = setting([], "evaluation data files (repeatable)", repeat=True, metavar="PATH", group="data",
                zh=("评估数据", "评估数据文件（可多个）"))
    eval_ratio: float = setting(0.0, "hold out this fraction of the training data for evaluation", ge=0, lt=1,
                                group="data",
                zh=("评估比例", "从训练数据中留出这一比例用于评估"))
    max_length: int = setting(512, "tokens per example; longer ones are truncated", gt=0, group="data",
                resume_fixed=True,
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
                                   "model's own, else its family's", metavar="NAME", shape="name", group="data",
                zh=("对话模板", "按名称选择对话模板（chatml、llama3、qwen2.5、qwen3、gemma、mistral、phi3、deepseek-r1 等），"
                    "用于没有模板的模型或替换它自带的；默认：模型自带的，否则用其系列的模板"))
    data_cache: bool = setting(True, "keep tokenized data in $ROCTUNE_HOME/cache/tokenized, so a restart or "
                               "--resume does not tokenize again", group="data",
                zh=("数据缓存", "把分词后的数据保存在 $ROCTUNE_HOME/cache/tokenized，重启或“继续训练”时不必重新分词"))
    streaming: bool = setting(False, "read and tokenize the data a chunk at a time straight into the on-disk cache "
                              "and train from it memory-mapped: for datasets larger than memory (sft)", group="data",
                zh=("流式读取", "分块读取并分词，直接写入磁盘缓存，训练时内存映射读取：用于比内存还大的数据集（sft）"))

    def check(self) -> None:
        """Data and an output folder given; --streaming's cache; the chat settings on a stage that learns raw text."""
        if not self.data:
            raise ConfigError("no training data: pass --data FILE (alpaca, messages, sharegpt or prompt/completion "
                              "JSON/JSONL)", key="no_data", field="data")
        if not self.output:
            raise ConfigError("no output directory: pass --output DIR", key="no_output", field="output")
        if self.streaming and not self.data_cache:
            raise ConfigError("--streaming tokenizes into the data cache; drop --no-data-cache (or --streaming)")
        if stages.STAGES[self.stage].chat:
            return
        for on, name in ((self.template is not None, f"--template {self.template}"),
                         (not self.learn_reasoning, "--no-learn-reasoning"),
                         (self.empty_think != "learn", f"--empty-think {self.empty_think}")):
            if on:  # a stage that learns raw text (its row: chat False): nothing for them to act on
                raise ConfigError(f"{name} acts on chat conversations; --stage {self.stage} learns raw text "
                                  f"without a chat template: drop {name.split()[0]}")

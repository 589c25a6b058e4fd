"""--stage grpo's settings (defaults are TRL's GRPOConfig's unless said) and their checks."""
from __future__ import annotations

from dataclasses import dataclass

from roctune.config.agents import ToolSettings
from roctune.config.schema import LOSS_SCALE_LIMIT, _number, check_number, flag, setting
from roctune.errors import ConfigError, either
from roctune.method_rows import METHODS, able
from roctune.stages import STAGES

# The choices of GRPO's settings, declared here (the settings layer sits below the engine, which imports them):
LOSS_TYPES = ("dapo", "grpo", "dr_grpo", "bnpo")  # roctune.training.grpo_loss
SCALE_REWARDS = ("group", "batch", "none")
IS_LEVELS = ("token", "sequence")  # importance sampling per token or per sequence (GSPO)
REWARDS = ("answer", "format", "length", "json")  # roctune.eval.rewards
ROLLOUT_ENGINES = ("roctune", "vllm")  # roctune.decoding, roctune.recipes.grpo_vllm


@dataclass
class GrpoSettings(ToolSettings):  # the tools' settings (roctune.config.agents) are GRPO's too
    DOES = "is a setting of GRPO: use it with"  # for the refusal on another stage (config/model.py)
    # ---- reinforcement learning (grpo); defaults are TRL's GRPOConfig's unless said
    num_generations: int = setting(8, "grpo: completions sampled per prompt (the group its advantages compare)",
                                   ge=2, le=1024, group="rl",
                resume_fixed=True,
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
                             "the base model, the adapter switched off: lora/qlora only)", ge=0,
                             le=LOSS_SCALE_LIMIT, group="rl",
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
                                 "none (Dr. GRPO)", choices=SCALE_REWARDS, group="rl",
                zh=("奖励缩放", "grpo：优势除以组内、整批的奖励标准差，或不缩放（Dr. GRPO）"))
    importance_sampling_level: str = setting("token", "grpo: importance ratio per token, or per sequence (GSPO)",
                                             choices=IS_LEVELS, group="rl",
                zh=("重要性采样级别", "grpo：按 token 或按整条序列（GSPO）计算重要性比率"))
    rewards: list[str] = setting([], "grpo: built-in rewards: answer (equals --answer-column), format "
                                 "(--format-regex matches), length (soft overlong penalty), json (parses)",
                                 choices=REWARDS, metavar="NAME", group="rl", aliases=("--reward",),
                zh=("内置奖励", "grpo：内置奖励：answer（等于“答案列”）、format（匹配“格式正则”）、length（超长软惩罚）、json（可解析）"))
    reward_weights: list[str] = setting([], "grpo: one weight per reward function: the built-ins in order, then "
                                        "the --reward-file functions, then --reward-model (default: all 1)", metavar="W",
                                        group="rl",
                zh=("奖励权重", "grpo：每个奖励函数一个权重：先按顺序给内置奖励，再给“奖励函数文件”中的函数，最后给“奖励模型”（默认都为 1）"))
    reward_file: list[str] = setting([], "grpo: your reward functions with TRL's convention, FILE.py or "
                                     "FILE.py:NAME,... (code that runs here: command line only)", repeat=True,
                                     metavar="FILE", group="rl", cli_only=True,
                zh=("奖励函数文件", "grpo：你自己的奖励函数（TRL 约定），FILE.py 或 FILE.py:NAME,…（会在本机运行的代码：只能在命令行指定）"))
    reward_model: str | None = setting(None, "grpo: a reward model (the run directory of a --stage rm training) "
                                       "whose score of each completion is one more reward", metavar="RUN",
                                       group="rl", does="scores GRPO's completions: use it with",
                zh=("奖励模型", "grpo：奖励模型（“训练阶段”为 rm 的运行目录），它给每个回答的分数作为又一个奖励"))
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
                                  does="samples GRPO's rollouts: use it with",
                zh=("采样引擎", "grpo：由谁采样回答：roctune（本进程中正在训练的模型）或 vllm（为本次运行启动的 vLLM 服务，每步载入适配器；仅“微调方法”lora；vLLM 来自 `make vllm` 或 $ROCTUNE_VLLM_PYTHON）"))

    def check(self) -> None:
        import re

        if not STAGES[self.stage].owns(GrpoSettings):  # its settings there: refused by ModelSettings.check
            return
        self.check_tools()
        if not self.rewards and not self.reward_file and not self.reward_model and not self.environment:
            raise ConfigError("--stage grpo needs a reward: --reward answer|format|length|json, --reward-file "
                              "FILE.py, --reward-model RUN and/or an --environment with get_reward()")
        if "format" in self.rewards:
            if not self.format_regex:
                raise ConfigError("--reward format needs --format-regex REGEX (e.g. '^<answer>.*</answer>$')")
            try:
                re.compile(self.format_regex)
            except re.error as e:
                raise ConfigError(f"--format-regex {self.format_regex!r}: not a regular expression ({e})") from None
        for w in self.reward_weights:
            check_number("--reward-weights", _number("--reward-weights", w, float))
        if self.kl_beta > 0 and not METHODS[self.method].adapter:
            raise ConfigError(f"--kl-beta needs the reference that LoRA gives for free (the adapter switched off); "
                              f"with --method {self.method} use --kl-beta 0")
        if self.rollout_engine == "vllm":
            self._check_vllm_rollouts()

    def _check_vllm_rollouts(self) -> None:
        """What vLLM rollouts need (roctune.recipes.grpo_vllm): a plain LoRA adapter vLLM can load each step."""
        if not METHODS[self.method].vllm_loadable:
            loadable = either(able("vllm_loadable"))
            raise ConfigError(f"--rollout-engine vllm needs --method {loadable} (not {self.method}): vLLM samples "
                              "from the policy as it is each step, and with LoRA only the small adapter is sent to "
                              f"it; with {self.method} the model's weights would be copied into vLLM every step. Use "
                              f"--method {loadable} or --rollout-engine roctune")
        from roctune.hardware import vllm

        found = vllm.unloadable({n: getattr(self, n) for n in ("use_dora", "modules_to_save", "target_modules")})
        if found:  # the adapter these settings train, as vLLM would be given it each step
            name, values, why = found
            shown = " ".join([flag(name)] + (values or []))
            raise ConfigError(f"--rollout-engine vllm: vLLM cannot load the adapter {shown} trains: {why}; drop "
                              f"{flag(name)} or use --rollout-engine roctune")
        if self.nproc * self.nnodes > 1:
            raise ConfigError("--rollout-engine vllm runs one vLLM server for one training process; drop --nproc/"
                              "--nnodes or use --rollout-engine roctune")
        vllm.lora_rank(self.lora_r, "--rollout-engine vllm: --lora-r", "lower it or use --rollout-engine roctune")

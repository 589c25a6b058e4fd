"""Tools for agent episodes (GRPO's tool rollouts, `roctune eval --tools`, `roctune chat --tools`): the user's tool
and environment files, TRL's conventions, and the limits their calls run under (roctune.agents). The files are code
that runs on this machine: command line only, like --reward-file and --trust-remote-code."""
from __future__ import annotations

from dataclasses import dataclass

from roctune.config.schema import setting
from roctune.errors import ConfigError

# the refusal of --tools/--environment on another stage (roctune.config.model): "--tools {RUNS_EPISODES} --stage grpo"
RUNS_EPISODES = "runs GRPO's agent episodes (roctune chat --tools and eval --tools try them on any run): use it with"
TOOL_SETTINGS = ("tools", "environment", "max_tool_turns", "tool_timeout", "tool_memory_mb")


@dataclass
class ToolSettings:
    tools: list[str] = setting([], "grpo: your tools, TRL's convention: every public function with type hints and "
                               "a docstring in FILE.py (or FILE.py:NAME,...) is a tool the model may call; they run "
                               "in a separate process with the limits below (code that runs here: command line "
                               "only)", repeat=True, metavar="FILE", group="rl", cli_only=True,
                does=RUNS_EPISODES,
                zh=("工具文件", "grpo：你的工具（TRL 约定）：FILE.py 中每个带类型注解和文档字符串的公开函数（或 FILE.py:NAME,…）都是模型可调用的工具；在单独的进程中按下列限制运行（会在本机运行的代码：只能在命令行指定）"))
    environment: str | None = setting(None, "grpo: an environment class, TRL's convention, FILE.py:Class: a fresh "
                                      "instance per episode, reset(**row) gives the first observation, its public "
                                      "methods are tools, an optional get_reward() is one more reward (command "
                                      "line only)", metavar="FILE:CLASS", group="rl", cli_only=True,
                does=RUNS_EPISODES,
                zh=("环境类", "grpo：环境类（TRL 约定），FILE.py:Class：每个回合一个新实例，reset(**row) 给出第一条观察，公开方法是工具，可选的 get_reward() 是又一个奖励（只能在命令行指定）"))
    max_tool_turns: int = setting(5, "grpo: rounds of tool calls per episode at most (TRL's "
                                  "max_tool_calling_iterations); the whole episode, tool results included, counts "
                                  "against --max-completion-length", ge=1, le=1000, group="rl",
                zh=("最多工具轮数", "grpo：每个回合最多的工具调用轮数（TRL 的 max_tool_calling_iterations）；整个回合（含工具结果）计入“最大生成长度”"))
    tool_timeout: float = setting(10.0, "grpo: seconds of wall-clock and of CPU time one tool call may take; past it "
                                  "the call ends with an error the model reads", gt=0, le=3600, group="rl",
                zh=("工具超时", "grpo：一次工具调用可用的墙钟时间和 CPU 时间（秒）；超过则以模型可读的错误结束"))
    tool_memory_mb: int = setting(2048, "grpo: address space of the tool process in MB (a tool that allocates more "
                                  "gets a MemoryError, reported to the model)", ge=128, le=1 << 22, group="rl",
                zh=("工具内存上限", "grpo：工具进程的地址空间上限（MB）；超出的工具得到 MemoryError，并告知模型"))

    @property
    def uses_tools(self) -> bool:
        return bool(self.tools or self.environment)

    def check_tools(self) -> None:
        """The flags' form (on a stage that does not own them they are refused by ModelSettings.check, naming the
        stage whose row does); the files are looked at later, by roctune.agents.sandbox.describe, before the model
        loads."""
        if self.environment and ":" not in self.environment:
            raise ConfigError(f"--environment {self.environment}: give FILE.py:Class")

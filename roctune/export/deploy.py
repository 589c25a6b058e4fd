"""The files beside an exported GGUF: an Ollama `Modelfile` and a `DEPLOY.md` with the commands for llama.cpp,
Ollama, vLLM and SGLang.

Ollama does not run Jinja chat templates, so the model's template is turned into a Go TEMPLATE: it is rendered
with marker messages to find each role's text before and after the content, and the result is checked by
rendering a multi-turn conversation both ways; a template that cannot be expressed this way gets a bare Modelfile (export says so). The
end-of-turn token becomes `PARAMETER stop` (without it Ollama generates past the answer). A default system
prompt the template inserts (SmolLM2 has one) becomes SYSTEM, so Ollama prompts the model as training did."""
from __future__ import annotations

import os
from shlex import quote  # every path and name pasted into a shell is quoted: a file named x$(...).gguf stays a name

from roctune.errors import ConfigError
from roctune.hardware.vllm import vllm_lora_rank

MARK = {"system": "SYSTEMMARKQ", "user": "USERMARKQ", "assistant": "ANSWERMARKQ", "user2": "USERTWOMARKQ"}


def _render(tok, msgs, gen: bool) -> str:
    from roctune.data.render import render_chat

    return render_chat(tok, msgs, gen)  # a vision model's tokenizer takes content parts (data/render.py)


def _special_tokens(tok) -> list[str]:
    found = [t.content for t in tok.added_tokens_decoder.values() if t.special]
    return found + [t for t in (tok.eos_token,) if t and t not in found]


def _added_bos(tok) -> str:
    """The BOS text when the tokenizer adds BOS itself (then llama.cpp and Ollama do too: it stays out of the
    TEMPLATE); '' when the chat template is the only source of its first token."""
    ids = tok("a")["input_ids"]
    return tok.bos_token if tok.bos_token and ids and ids[0] == tok.bos_token_id else ""


def role_wrappers(tok) -> dict:
    """{role: (before, after)}, 'generation' (the text that opens an answer), 'stop', 'default_system', 'lead' (text
    before the first turn) and 'folded' (the system prompt is written inside the first user turn, as Gemma's and
    Mistral's templates do, between system's before and after)."""
    m = MARK
    s, u, a = ({"role": r, "content": m[r]} for r in ("system", "user", "assistant"))
    one = _render(tok, [s, u], False)
    gen = _render(tok, [s, u], True)
    two = _render(tok, [s, u, a, {"role": "user", "content": m["user2"]}], False)
    between = two[two.index(m["assistant"]) + len(m["assistant"]):two.index(m["user2"])]  # a_after + u_before
    ends = [(between.find(t), t) for t in _special_tokens(tok) if t in between]
    if not ends or not gen.startswith(one):
        raise ConfigError("the chat template has no end-of-turn token between turns; cannot write an Ollama "
                          "TEMPLATE for it; use the GGUF with llama.cpp, whose --jinja runs the embedded template")
    stop = min(ends)[1]
    cut = between.index(stop) + len(stop)
    while cut < len(between) and between[cut] in "\n ":
        cut += 1
    a_after, u_before = between[:cut], between[cut:]
    plain = _render(tok, [u], False)
    sys_tail = one[one.index(m["system"]) + len(m["system"]):one.index(m["user"])]
    w = (_separate_system if sys_tail.endswith(u_before) else _folded_system)(one, plain, u_before, _added_bos(tok))
    w.update(assistant=(gen[len(one):], a_after), generation=gen[len(one):], stop=stop)
    _check(tok, w)
    return w


def _strip_bos(text: str, bos: str) -> str:
    return text[len(bos):] if bos and text.startswith(bos) else text


def _separate_system(one: str, plain: str, u_before: str, bos: str) -> dict:
    """A system turn of its own (ChatML, Llama 3); a default system prompt the template writes when none is given
    (SmolLM2's) becomes 'default_system'."""
    m = MARK
    sys_tail = one[one.index(m["system"]) + len(m["system"]):one.index(m["user"])]
    s_before = _strip_bos(one[:one.index(m["system"])], bos)
    w = {"system": (s_before, sys_tail[:len(sys_tail) - len(u_before)]), "lead": "", "folded": False,
         "user": (u_before, one[one.index(m["user"]) + len(m["user"]):])}
    lead = plain[:plain.index(u_before + m["user"])] if u_before + m["user"] in plain else ""
    lead = _strip_bos(lead, bos)
    sb, sa = w["system"]
    w["default_system"] = lead[len(sb):len(lead) - len(sa)] if lead.startswith(sb) and lead.endswith(sa) and lead else ""
    return w


def _folded_system(one: str, plain: str, u_before: str, bos: str) -> dict:
    """The system prompt written inside the first user turn, before its text (Gemma's '<start_of_turn>user\\n' +
    system + '\\n\\n' + question): a conversation without one must be the same text with the system part left out."""
    m = MARK
    head = plain[:plain.index(m["user"])]
    at_s, at_u = one.index(m["system"]), one.index(m["user"])
    if not (head.endswith(u_before) and one.startswith(head) and at_s < at_u
            and one[at_u:] == plain[len(head):]):
        raise ConfigError("the chat template does not open user turns the same way each time; cannot write an "
                          "Ollama TEMPLATE for it")
    return {"system": (one[len(head):at_s], one[at_s + len(m["system"]):at_u]), "folded": True, "default_system": "",
            "lead": _strip_bos(head[:len(head) - len(u_before)], bos), "user": (u_before, plain[len(head) + len(m["user"]):])}


def render_like_ollama(w: dict, msgs: list[dict]) -> str:
    """What the TEMPLATE `modelfile` writes from `w` renders for `msgs` (its Go template, step by step in Python)."""
    out, system = [w["lead"]], ""
    for i, msg in enumerate(msgs):
        role, text = msg["role"], msg["content"]
        if w["folded"] and role == "system" and i == 0:
            system = text
        elif w["folded"] and role == "user":
            out += [w["user"][0], w["system"][0] + system + w["system"][1] if system else "", text, w["user"][1]]
            system = ""
        elif role in ("system", "user", "assistant"):
            out += [w[role][0], text, w[role][1]]
    return "".join(out) + w["generation"]


def _check(tok, w: dict) -> None:
    """The wrappers must reproduce the Jinja template on conversations of several turns."""
    turns = [{"role": "user", "content": "Q1"}, {"role": "assistant", "content": "A1"}, {"role": "user", "content": "Q2"}]
    bos = _added_bos(tok)
    for msgs in ([{"role": "system", "content": "S"}, *turns], turns):
        theirs = _strip_bos(_render(tok, msgs, True), bos)
        mine = render_like_ollama(w, msgs)
        if msgs is turns and w["default_system"]:
            mine = render_like_ollama(w, [{"role": "system", "content": w["default_system"]}, *turns])
        if mine != theirs:
            raise ConfigError("the chat template cannot be expressed as an Ollama TEMPLATE (role texts depend on "
                              "more than the role); use the GGUF with llama.cpp, whose --jinja runs the embedded "
                              "template")


def _go(text: str) -> str:
    if "{{" in text or '"""' in text:
        raise ConfigError("the chat template's role texts contain '{{' or '\"\"\"'; cannot quote them in a Modelfile")
    return text


def go_template(w: dict) -> str:
    """Ollama's Go TEMPLATE from the wrappers (render_like_ollama is the same in Python). Folded: the first
    message, when it is the system prompt, is kept in $system and written inside the first user turn."""
    def branch(role: str, content: str = "{{ .Content }}", word: str = "else if") -> str:
        return f'{{{{ {word} eq .Role "{role}" }}}}{_go(w[role][0])}{content}{_go(w[role][1])}'

    if w["folded"]:
        system = (f'{{{{ if $system }}}}{_go(w["system"][0])}{{{{ $system }}}}{_go(w["system"][1])}'
                  '{{ $system = "" }}{{ end }}{{ .Content }}')
        body = ('{{ $system := "" }}{{ range $i, $_ := .Messages }}{{ if and (eq $i 0) (eq .Role "system") }}'
                '{{ $system = .Content }}' + branch("user", system) + branch("assistant"))
    else:
        body = "{{ range .Messages }}" + branch("system", word="if") + branch("user") + branch("assistant")
    return _go(w["lead"]) + body + "{{ end }}{{ end }}" + _go(w["generation"])


def modelfile(gguf_name: str, tok, system: str | None) -> tuple[str, dict]:
    """The Modelfile text and the wrappers it was built from."""
    w = role_wrappers(tok)
    lines = [f"FROM ./{gguf_name}", f'TEMPLATE """{go_template(w)}"""']
    stops = [w["stop"]] + [t for t in (tok.eos_token,) if t and t != w["stop"]]
    lines += [f'PARAMETER stop "{t}"' for t in stops]
    system = system or w["default_system"]
    if system:
        lines.append(f'SYSTEM """{_go(system)}"""')
    return "\n".join(lines) + "\n", w


def bare_modelfile(gguf_name: str, tok, system: str | None) -> str:
    """A Modelfile without TEMPLATE (for a chat template that cannot be expressed as one): the weights and the
    stop tokens the tokenizer names."""
    lines = [f"FROM ./{gguf_name}"]
    stops = [t for t in dict.fromkeys(_special_tokens(tok)) if t == tok.eos_token or "end" in t.lower()]
    lines += [f'PARAMETER stop "{t}"' for t in stops if '"' not in t]
    if system and "{{" not in system and '"""' not in system:
        lines.append(f'SYSTEM """{system}"""')
    return "\n".join(lines) + "\n"


def best_modelfile(gguf_name: str, tok, log) -> tuple[str, bool]:
    """The Modelfile, best effort: a chat template Ollama's TEMPLATE cannot express leaves it without one (the
    GGUF is still good), and one line says what to do."""
    from roctune.data.template_limits import TemplateFailed

    try:
        return modelfile(gguf_name, tok, None)[0], True
    except (ConfigError, TemplateFailed) as e:
        why = str(e) if isinstance(e, ConfigError) else f"the chat template refuses a probe conversation ({e.reason})"
        log(f"Modelfile without TEMPLATE: {why}; Ollama will guess the template from the GGUF - check `ollama show "
            "--template`, or serve it with `llama-server --jinja`, which runs the template inside the GGUF")
        return bare_modelfile(gguf_name, tok, None), False


def adapter_modelfile(text: str, lora_name: str, base: str, base_gguf: str | None = None) -> str:
    """A Modelfile for a LoRA GGUF: FROM the base model's GGUF (the file the base was converted from, else its path
    to fill in), ADAPTER this file."""
    body = text.split("\n", 1)[1]
    if base_gguf:
        return f"# FROM: the GGUF file the base model was converted from\nFROM {base_gguf}\nADAPTER ./{lora_name}\n{body}"
    return (f"# FROM: the GGUF of the base model ({base}), unquantized or q8_0, e.g. written by\n"
            f"#   roctune export --adapter {quote(base)} --quant q8_0 --output base-gguf\n"
            f"FROM ./base-gguf/base-q8_0.gguf\nADAPTER ./{lora_name}\n{body}")


def lora_deploy_md(lora_name: str, name: str, base: str, base_gguf: str | None = None) -> str:
    if base_gguf:  # trained from a GGUF file (--model FILE.gguf): the adapter goes back onto that same file
        return "\n".join([
            f"# Deploying the {name} adapter\n", "Written by `roctune export --format lora-gguf`: the LoRA adapter "
            f"alone (see roctune_export.json for its check in llama.cpp), for the GGUF file the base model was "
            f"converted from ({base_gguf}), keeping that file's own quantization.\n",
            "## llama.cpp\n", f"```\nllama-server -m {quote(base_gguf)} --lora {quote(lora_name)} --jinja --port 8080\n```",
            "## Ollama\n", f"```\nollama create {quote(name)} -f Modelfile\nollama run {quote(name)}\n```\n"])
    return "\n".join([
        f"# Deploying the {name} adapter\n", "Written by `roctune export --format lora-gguf`: the LoRA adapter alone "
        "(see roctune_export.json for its check in llama.cpp). It needs a GGUF of the base model it was trained "
        f"on ({base}), e.g. `roctune export --adapter {quote(base)} --quant q8_0 --output base-gguf`.\n",
        "## llama.cpp\n",
        f"```\nllama-server -m base-gguf/base-q8_0.gguf --lora {quote(lora_name)} --jinja --port 8080\n```",
        "## Ollama\n", f"```\nollama create {quote(name)} -f Modelfile\nollama run {quote(name)}\n```",
        "Edit the Modelfile's FROM line to the base GGUF first.\n"])


def deploy_md(output: str, gguf_name: str, name: str, run: str, base: str, rank: int | None,
              full_model: bool) -> str:
    gguf_path = os.path.join(os.path.abspath(output), gguf_name)
    run = os.path.abspath(run)
    vllm_rank = vllm_lora_rank(rank) if rank else None
    lora = f"--max-lora-rank {vllm_rank}" if vllm_rank else ""
    parts = [f"# Deploying {name}\n", "Written by `roctune export`; the GGUF was read back and compared with the merged "
             "model (see roctune_export.json).\n",
             "## llama.cpp\n", f"```\nllama-server -m {quote(gguf_path)} --jinja --port 8080\n```",
             "An OpenAI-compatible API on http://localhost:8080/v1; `--jinja` uses the chat template inside the "
             "GGUF.\n", "## Ollama\n", f"```\ncd {quote(os.path.abspath(output))}\nollama create {quote(name)} -f "
             f"Modelfile\nollama run {quote(name)}\n```", "The Modelfile holds the chat TEMPLATE and the end-of-turn stop token.\n"]
    if full_model:
        parts += ["## vLLM\n", f"```\nvllm serve {quote(run)}\n```\n", "## SGLang\n",
                  f"```\npython -m sglang.launch_server --model-path {quote(run)}\n```\n"]
    else:
        parts += ["## vLLM (the unmerged adapter; a GPU, or vLLM's CPU build)\n",
                  f"```\nroctune serve --engine vllm --model {quote(base)} --adapter {quote(f'{name}={run}')}\n```",
                  "roctune checks that vLLM can load the adapter, then starts vLLM's OpenAI server with it, the "
                  "chat template the run was trained with (tool calls included) and the matching tool-call parser. "
                  "`make vllm` installs vLLM's CPU build in the repository. vLLM by hand:\n",
                  f"```\nvllm serve {quote(base)} --enable-lora --lora-modules {quote(f'{name}={run}')} {lora}\n```",
                  f"Ask for model `{name}` in the OpenAI API.\n", "## SGLang (the unmerged adapter, on a GPU)\n",
                  f"```\npython -m sglang.launch_server --model-path {quote(base)} --enable-lora "
                  f"--lora-paths {quote(f'{name}={run}')} {lora}\n```\n"]
    return "\n".join(parts)

"""Chat templates by name (`--template NAME`): one row each, for models without a chat template of their own (base
models) or to override the one they have.

Each row is the Jinja text (written as the model family's own template writes turns), the markers it needs as
single tokens of the vocabulary, and its end-of-turn tokens (generation stops there). Which template a tokenizer
gets (`choose_template`):
- `--template NAME`: that row, refused when a marker is not one token of the vocabulary (the model could not
  learn to write it, nor stop on it);
- otherwise the model's own chat template;
- a base model without one: its family's template (families.Family.template) when the vocabulary has its
  markers, else ChatML when it has those, else refused naming --template. (Before, every base model silently got
  ChatML, which e.g. Gemma's vocabulary writes as 7 text pieces: the trained model never stopped.)
- ... except a base model whose embedding is tied to its output layer (Gemma, small Llamas and Qwens): first a
  template without special markers (`PLAIN_TURNS`: turns as text, answers ending with EOS, a token every base
  model has learned to write). A family template's markers may be rows the base never trained (Gemma 3 270M ranks
  <end_of_turn> ~260,000th of 262,144 after an answer), so LoRA has to train those rows too
  (methods.turn_token_rows), and a llama.cpp LoRA GGUF cannot carry rows of a tied embedding (export/lora_gguf.py):
  the fine-tune could only be exported merged, not put back onto the original GGUF file. Measured on Gemma 3 270M
  (identity set, 12 LoRA steps): gemma template with trained rows 30 s, final loss 0.169; plain turns 14 s, 0.139;
  both answer and stop.
BOS: the rows that write `bos_token` do so as the family's tokenizer does (Gemma's, Llama 3's, Mistral's); text is
always tokenized without added special tokens, so the template alone decides.

Nothing here imports torch or transformers: a tokenizer is passed in.
"""
from __future__ import annotations

from dataclasses import dataclass

from roctune.errors import ConfigError
from roctune.families import Family

_CHATML_TURNS = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
                 "'<|im_end|>' + '\n' }}{% endfor %}")
_CHATML_PROMPT = "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"

# Qwen3's rule: reasoning is written only in the assistant turns after the last user message (earlier turns lose
# it, as the model sees them at inference), from `reasoning_content` or a <think> block in the content.
_QWEN3 = (
    "{%- set ns = namespace(last=-1) %}{%- for m in messages %}{%- if m['role'] == 'user' %}"
    "{%- set ns.last = loop.index0 %}{%- endif %}{%- endfor %}"
    "{%- for m in messages %}{%- if m['role'] == 'assistant' %}"
    "{%- set content = m['content'] %}{%- set reasoning = m.get('reasoning_content') or '' %}"
    "{%- if '</think>' in content %}{%- set reasoning = content.split('</think>')[0].split('<think>')[-1] %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\n') %}{%- endif %}"
    "{{ '<|im_start|>assistant\n' }}{%- if loop.index0 > ns.last and reasoning.strip() %}"
    "{{ '<think>\n' + reasoning.strip('\n') + '\n</think>\n\n' }}{%- endif %}{{ content + '<|im_end|>\n' }}"
    "{%- else %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{%- endif %}{%- endfor %}"
    + _CHATML_PROMPT)

# Gemma's: no system role (the system prompt opens the first user turn), the assistant is "model", <bos> first.
_GEMMA = (
    "{{ bos_token }}{%- if messages and messages[0]['role'] == 'system' %}"
    "{%- set first = messages[0]['content'] + '\n\n' %}{%- set loop_messages = messages[1:] %}"
    "{%- else %}{%- set first = '' %}{%- set loop_messages = messages %}{%- endif %}"
    "{%- for m in loop_messages %}{{ '<start_of_turn>' + ('model' if m['role'] == 'assistant' else m['role']) + "
    "'\n' + (first if loop.first else '') + m['content'] | trim + '<end_of_turn>\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{%- endif %}")

_LLAMA3 = (
    "{{ bos_token }}{% for m in messages %}{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\n\n' + "
    "m['content'] | trim + '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")

_MISTRAL = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'system' %}"
    "{% elif m['role'] == 'user' %}{{ '[INST] ' }}"
    "{% if loop.index0 == 1 and messages[0]['role'] == 'system' %}{{ messages[0]['content'] + '\n\n' }}{% endif %}"
    "{{ m['content'] + ' [/INST]' }}{% else %}{{ m['content'] + eos_token }}{% endif %}{% endfor %}")

_PHI3 = ("{% for m in messages %}{{ '<|' + m['role'] + '|>\n' + m['content'] + '<|end|>\n' }}{% endfor %}"
         "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}")

# DeepSeek-R1 (and its Qwen/Llama distills) as released: an assistant turn keeps only the text after </think>.
_DEEPSEEK_R1 = (
    "{% set ns = namespace(system='') %}{% for m in messages %}{% if m['role'] == 'system' %}"
    "{% set ns.system = m['content'] %}{% endif %}{% endfor %}{{ bos_token }}{{ ns.system }}"
    "{% for m in messages %}{% if m['role'] == 'user' %}{{ '<｜User｜>' + m['content'] }}"
    "{% elif m['role'] == 'assistant' %}{% set content = m['content'] %}"
    "{% if '</think>' in content %}{% set content = content.split('</think>')[-1] %}{% endif %}"
    "{{ '<｜Assistant｜>' + content + '<｜end▁of▁sentence｜>' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<｜Assistant｜>' }}{% endif %}")


@dataclass(frozen=True)
class Template:
    name: str
    title: str                       # for people: which models write their turns this way
    jinja: str
    markers: tuple[str, ...]         # must each be one token of the vocabulary
    end_of_turn: tuple[str, ...]     # generation stops on these (also markers)
    aliases: tuple[str, ...] = ()
    bos: bool = False                # writes the tokenizer's bos_token first (the tokenizer must have one)


TEMPLATES: tuple[Template, ...] = (
    Template("chatml", "ChatML (SmolLM2, OpenHermes, ...)", _CHATML_TURNS + _CHATML_PROMPT,
             ("<|im_start|>",), ("<|im_end|>",)),
    Template("qwen2.5", "Qwen2, Qwen2.5 (ChatML with Qwen's default system prompt)",
             "{% if not messages or messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are Qwen, created "
             "by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}{% endif %}"
             + _CHATML_TURNS + _CHATML_PROMPT, ("<|im_start|>",), ("<|im_end|>",), aliases=("qwen2", "qwen")),
    Template("qwen3", "Qwen3 (ChatML, <think> reasoning kept after the last user turn)", _QWEN3,
             ("<|im_start|>", "<think>", "</think>"), ("<|im_end|>",)),
    Template("llama3", "Llama 3.x", _LLAMA3, ("<|start_header_id|>", "<|end_header_id|>"), ("<|eot_id|>",),
             aliases=("llama-3",), bos=True),
    Template("gemma", "Gemma 2, Gemma 3", _GEMMA, ("<start_of_turn>",), ("<end_of_turn>",),
             aliases=("gemma2", "gemma3"), bos=True),
    # [INST] is one token in Mistral's v3 vocabulary and plain text in v1's (which Mistral 7B v0.1 was taught):
    # both write it, so only BOS/EOS are required
    Template("mistral", "Mistral, Mixtral ([INST] ... [/INST])", _MISTRAL, (), (), bos=True),
    Template("phi3", "Phi-3, Phi-3.5", _PHI3, ("<|user|>", "<|assistant|>"), ("<|end|>",), aliases=("phi-3",)),
    Template("deepseek-r1", "DeepSeek-R1 and its distills (<｜User｜>/<｜Assistant｜>)", _DEEPSEEK_R1,
             ("<｜User｜>", "<｜Assistant｜>"), ("<｜end▁of▁sentence｜>",), aliases=("r1",), bos=True),
)
BY_NAME = {n: t for t in TEMPLATES for n in (t.name, *t.aliases)}
# the row a base model with tied embeddings gets first (see the module docstring): no special markers, answers end
# with the tokenizer's EOS
PLAIN_TURNS = "mistral"


def names() -> str:
    return ", ".join(t.name for t in TEMPLATES)


def get(name: str) -> Template:
    t = BY_NAME.get(name.strip().lower())
    if t is None:
        raise ConfigError(f"--template {name}: unknown; choose one of {names()}", key="choice", field="template",
                          choices=names(), got=repr(name))
    return t


def template_of(tokenizer) -> Template | None:
    """The row whose text is this tokenizer's chat template (one roctune set, saved with a run), else None."""
    tpl = getattr(tokenizer, "chat_template", None)
    return next((t for t in TEMPLATES if t.jinja == tpl), None)


def turn_token_ids(tokenizer, name: str | None) -> dict[str, int]:
    """{token: id} of the markers and end-of-turn tokens of the row `name` (None, the model's own template: {}).
    A base model that never saw a chat may have left their embedding and output rows untrained (Gemma 3 270M's
    <end_of_turn> is among its least likely tokens after any answer), so training has to teach these rows too."""
    if not name:
        return {}
    vocab = tokenizer.get_vocab()
    t = get(name)
    return {m: vocab[m] for m in dict.fromkeys((*t.markers, *t.end_of_turn)) if m in vocab}


def missing_markers(tokenizer, t: Template) -> list[str]:
    """The markers (and end-of-turn tokens, and BOS where written) that are not one token of the vocabulary."""
    vocab = tokenizer.get_vocab()
    missing = [m for m in (*t.markers, *t.end_of_turn) if m not in vocab
               or len(tokenizer(m, add_special_tokens=False)["input_ids"]) != 1]
    if t.bos and getattr(tokenizer, "bos_token", None) is None:
        missing.append("a BOS token")
    if "eos_token" in t.jinja and getattr(tokenizer, "eos_token", None) is None:
        missing.append("an EOS token")
    return missing


def _refusal(t: Template, missing: list[str], how: str) -> str:
    return (f"{how} chat template {t.name} needs {', '.join(missing)} as single tokens, which this model's "
            f"vocabulary does not have; choose a template it can write with --template ({names()})")


def choose_template(tokenizer, requested: str | None, family: Family | None,
                    tied: bool = False) -> tuple[Template | None, str]:
    """The template to render with and why: None keeps the tokenizer's own. Raises ConfigError (naming
    --template) when the requested or default template cannot be written in this vocabulary. `tied`: the model's
    embedding is its output layer (see the module docstring)."""
    if requested:
        t = get(requested)
        missing = missing_markers(tokenizer, t)
        if missing:
            raise ConfigError(_refusal(t, missing, f"--template {requested}:"))
        own = " instead of the model's own" if getattr(tokenizer, "chat_template", None) else ""
        return t, f"--template {requested}{own}"
    if getattr(tokenizer, "chat_template", None):
        t = template_of(tokenizer)
        return None, (f"the run's template {t.name}" if t else "the model's own chat template")
    own = [get(family.template)] if family and family.template else []
    plain = get(PLAIN_TURNS)
    if tied and not missing_markers(tokenizer, plain) and not (own and not own[0].markers):
        theirs = f"; {family.title}'s {own[0].name} would need its markers' rows trained" if own else ""
        return plain, (f"the model has no chat template and its embedding is tied to its output layer: template "
                       f"{plain.name}, plain-text turns whose answers end with {tokenizer.eos_token} (no marker rows "
                       f"to train, so a LoRA GGUF can go back onto the original file{theirs}; --template to choose "
                       "another)")
    candidates = own + [get("chatml")]
    for t in candidates:
        if not missing_markers(tokenizer, t):
            why = f"{family.title}'s" if family and t.name == family.template else "ChatML, whose markers it has,"
            return t, f"the model has no chat template: {why} template {t.name} (--template to choose another)"
    t = candidates[0]
    raise ConfigError(_refusal(t, missing_markers(tokenizer, t), "this base model has no chat template; the default"))


def apply_template(tokenizer, requested: str | None, family: Family | None, tied: bool = False) -> str:
    """Set the chosen template on the tokenizer (see `choose_template`); returns the reason, also kept on the
    tokenizer as `roctune_template_reason` for `data preview` and the run's log."""
    t, reason = choose_template(tokenizer, requested, family, tied)
    if t is not None:
        tokenizer.chat_template = t.jinja
    tokenizer.roctune_template_reason = reason
    return reason

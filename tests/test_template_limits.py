"""Chat templates rendered with limits (roctune/data/template_limits.py, issue 46): the same text as transformers'
apply_chat_template for real templates, and each way a hostile template could hang, flood memory or leave the
sandbox stopped inside the render with a reason, which the caller turns into one line naming the template's file
(a record's failure names the record too; serve answers 400)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from roctune.data import template_limits as tl

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
CONVERSATIONS = [
    ([{"role": "user", "content": "Hi"}], True, None),
    ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
      {"role": "assistant", "content": "Hello!"}], False, None),
    ([{"role": "user", "content": "weather?"}, {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
      {"role": "tool", "content": "sunny"}], True, TOOLS),
    ([{"role": "user", "content": "think"}, {"role": "assistant", "content": "ok", "reasoning_content": "hmm"}], False,
     None),
]


def _real_templates(tokenizer) -> dict[str, str]:
    import family_models

    from roctune.data.templates import TEMPLATES

    found = {"smollm2": tokenizer.chat_template, **{t.name: t.jinja for t in TEMPLATES}}
    found.update({f"family {n}": v for n, v in vars(family_models).items()
                  if isinstance(v, str) and "{%" in v and "messages" in v})
    return found


def test_real_templates_render_as_transformers_renders_them(tokenizer):
    import copy

    tok = copy.deepcopy(tokenizer)
    compared = 0
    for name, source in _real_templates(tokenizer).items():
        tok.chat_template = source
        for messages, gen, tools in CONVERSATIONS:
            try:
                want = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen, tools=tools)
            except Exception:  # noqa: BLE001 - Gemma 2's refuses a system turn: the limited one must refuse it too
                with pytest.raises(tl.TemplateFailed, match="raised an error"):
                    tl.render(tok, messages, gen, tools)
                continue
            assert tl.render(tok, messages, gen, tools) == want, (name, messages)
            compared += 1
    assert compared >= 50


def test_a_long_conversation_is_no_hostile_template(tokenizer):
    """600 turns through a template that loops over the messages twice (Qwen3's rule) stay inside the limits."""
    from roctune.data.templates import get

    turns = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} " * 20} for i in range(600)]
    text = tl.render_source(get("qwen3").jinja, {"messages": turns, "add_generation_prompt": True})
    assert text.count("<|im_start|>") == 601


NESTED = "{% for a in range(99999) %}{% for b in range(99999) %}{% endfor %}{% endfor %}"
HOSTILE = {  # template: what the refusal says
    NESTED: "loop steps and calls",
    "{% for a in range(99999) %}{% for b in range(99999) %}" + "0123456789abcdef" * 8 + "{% endfor %}{% endfor %}":
        "wrote more",
    "{% macro f(n) %}{{ f(n) }}{{ f(n) }}{% endmacro %}{{ f(1) }}": "recursed too deeply",
    "{% for x in [1] recursive %}{{ loop(range(99999)) }}{% endfor %}": "recursed too deeply",
    "{{ 'x' * 9999999999 }}": "multiplies a value",
    "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}": "with ~",
    "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}": "built a value",
    "{{ 9 ** 99999999 }}": "a number of more than",
    "{{ 'x'.center(99999999999) }}": "the number 99999999999",
    "{{ 'x'|center(99999999999) }}": "the number 99999999999",
    "{% set s = 'x' * 1000000 %}{{ s.replace('x', s) }}": "with replace()",
    "{% set s = 'x' * 1000000 %}{{ s|replace('x', s) }}": "with replace()",
    "{% set s = 'a\n' * 1000000 %}{{ s|indent(1000) }}": "with indent()",
    "{{ '{:>999999999}'.format(1) }}": "a width of 999999999",
    "{{ '%999999999d' % 1 }}": "a width of 999999999",
    "{% set l = [range(9999)|list] * 9999 %}{{ l }}": "more than",
    "{% set l = range(9999)|list %}{{ [l, l, l, l]|tojson(indent=9999) }}": "with tojson",
    "{% set ns = namespace(m=range(9999)|list) %}{% for i in range(13) %}{% set ns.m = [ns.m, ns.m] %}{% endfor %}"
    "{{ ns.m|tojson }}": "built a value of more than",  # 2^13 references to one list: 10^8 numbers in print
    "{% set ns = namespace(m=range(9999)|list) %}{% for i in range(13) %}{% set ns.m = [ns.m, ns.m] %}{% endfor %}"
    "{{ ns.m }}": "built a value of more than",
    "{% set ns = namespace(m=range(9999)|list) %}{% for i in range(13) %}{% set ns.m = [ns.m, ns.m] %}{% endfor %}"
    "{{ ns }}": "built a value of more than",  # a namespace prints its attributes
    "{% set d = dict.fromkeys(range(9999), range(9999)|list) %}{{ d.items() }}": "built a value of more than",
    "{{ lipsum(99) }}": "failed",  # lipsum is not there
    "{{ ''.__class__.__mro__ }}": "sandbox forbids: reads '__class__' of a str",
    "{{ ''.__class__ }}": "sandbox forbids",  # refused although it would render as empty text
    "{{ cycler.__init__.__globals__ }}": "sandbox forbids: reads '__init__'",
    "{{ self._TemplateReference__context }}": "sandbox forbids",
    "{{ messages.append(1) }}": "sandbox forbids: reads 'append'",
    "{{ raise_exception('no system role\nhere') }}": "raised an error: no system role here",
    "{% for %}": "does not parse",
    "{#" + "x" * (tl.MAX_SOURCE + 1) + "#}": "characters long",
}


@pytest.mark.parametrize("source", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_template_is_stopped_with_its_reason(source):
    with pytest.raises(tl.TemplateFailed) as e:
        tl.render_source(source, {"messages": [{"role": "user", "content": "Hi"}], "add_generation_prompt": True})
    assert HOSTILE[source] in e.value.reason, e.value.reason
    assert "\n" not in str(e.value)


def test_failures_name_the_template_the_record_and_the_fix(tokenizer):
    """A template refusing one record's conversation names the record and the template's file; a limit names the
    template only (whatever the record, it is the template's fault). The tokenizer's source is what
    models.load_tokenizer records."""
    import copy

    from roctune.data.render import conversation_segments

    tok = copy.deepcopy(tokenizer)
    tok.roctune_template_source = "/models/m/chat_template.jinja"
    tok.chat_template = ("{% if messages|length > 2 %}{{ raise_exception('one question only') }}{% endif %}"
                         + tokenizer.chat_template)
    long = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"},
            {"role": "assistant", "content": "d"}]
    with pytest.raises(tl.TemplateFailed) as e:
        conversation_segments(tok, long, where="data.jsonl:7")
    assert str(e.value).startswith("data.jsonl:7: the chat template of /models/m/chat_template.jinja raised an "
                                   "error: one question only; fix the record or the template, or render with one of "
                                   "roctune's templates: --template {chatml,")
    tok.chat_template = NESTED + tokenizer.chat_template
    with pytest.raises(tl.TemplateFailed, match=r"^the chat template of /models/m/chat_template.jinja "
                                                r"ran more than 1,000,000 loop steps .*; fix the template, or"):
        conversation_segments(tok, long[:2], where="data.jsonl:2")


def test_serve_answers_400_when_the_template_refuses_the_messages(tokenizer):
    import copy

    from roctune.serve.engine import Engine
    from roctune.serve.errors import ApiError

    tok = copy.deepcopy(tokenizer)
    tok.chat_template = "{{ raise_exception('roles must alternate') }}"
    with pytest.raises(ApiError) as e:
        Engine.render_chat(SimpleNamespace(tokenizer=tok), [{"role": "user", "content": "hi"}])
    assert e.value.status == 400 and "raised an error: roles must alternate" in e.value.message
    assert "/" not in e.value.message  # no server paths to the client

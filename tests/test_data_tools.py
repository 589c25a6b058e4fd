"""Tool-calling and reasoning conversations: every layout that carries them is read, rendered (the model's template
when it handles tools, the documented fallback otherwise) and masked so that the calls and answers are learned and
the tool list and tool results never are; `roctune data preview` shows exactly that; the reasoning switch."""
import copy
import json

import pytest

from roctune.cli import main
from roctune.config import TrainConfig
from roctune.data.formats import to_messages
from roctune.data.preview import preview_conversation, preview_record
from roctune.data.records import load_records
from roctune.data.render import RenderOptions, render_prompt, template_supports_tools, tokenize_conversation
from roctune.errors import DataError

from conftest import write_jsonl

RESULT = "SECRET_RESULT 18C sunny"  # the tool's output: context, never learned
ANSWER = "It is 18C and sunny in Paris."
SCHEMA = {"name": "get_weather", "description": "Weather of a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}

OPENAI = {"tools": [{"type": "function", "function": SCHEMA}],
          "messages": [{"role": "user", "content": "Weather in Paris?"},
                       {"role": "assistant", "content": None, "tool_calls": [
                           {"id": "call_1", "type": "function",
                            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
                       {"role": "tool", "tool_call_id": "call_1", "content": RESULT},
                       {"role": "assistant", "content": ANSWER}]}
SHAREGPT = {"conversations": [{"from": "human", "value": "Weather in Paris?"},
                              {"from": "function_call",
                               "value": json.dumps({"name": "get_weather", "arguments": {"city": "Paris"}})},
                              {"from": "observation", "value": RESULT},
                              {"from": "gpt", "value": ANSWER}],
            "tools": json.dumps([SCHEMA])}  # LLaMA-Factory writes the tools column as a JSON string

# A Qwen2.5-style template that renders tools and tool calls itself.
TOOL_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n# Tools\n<tools>{% for tool in tools %}\n{{ tool | tojson }}{% endfor %}"
    "\n</tools><|im_end|>\n{% endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or message.role == 'system' %}<|im_start|>{{ message.role }}\n"
    "{{ message.content }}<|im_end|>\n"
    "{%- elif message.role == 'assistant' %}<|im_start|>assistant\n{{ message.content or '' }}"
    "{%- for tc in message.tool_calls or [] %}<tool_call>\n{\"name\": \"{{ tc.function.name }}\", \"arguments\": "
    "{{ tc.function.arguments | tojson }}}\n</tool_call>{% endfor %}<|im_end|>\n"
    "{%- elif message.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ message.content }}\n"
    "</tool_response><|im_end|>\n{%- endif %}{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def learned_text(preview) -> str:
    return "".join(s["text"] for s in preview["segments"] if s["train"])


def context_text(preview) -> str:
    return "".join(s["text"] for s in preview["segments"] if not s["train"])


def llamafactory_dir(tmp_path) -> str:
    d = tmp_path / "lf"
    d.mkdir(exist_ok=True)
    (d / "tools.json").write_text(json.dumps([SHAREGPT]))
    (d / "dataset_info.json").write_text(json.dumps({"glaive": {
        "file_name": "tools.json", "formatting": "sharegpt",
        "columns": {"messages": "conversations", "tools": "tools"}}}))
    return f"{d}:glaive"


@pytest.fixture
def tool_tokenizer(default_model_dir):
    from roctune.models import load_tokenizer

    tok = load_tokenizer(default_model_dir)
    tok.chat_template = TOOL_TEMPLATE
    return tok


def sources(tmp_path) -> dict[str, str]:
    return {"openai": write_jsonl(tmp_path / "openai.jsonl", [OPENAI]),
            "sharegpt_file": write_jsonl(tmp_path / "sharegpt.jsonl", [SHAREGPT]),
            "llamafactory": llamafactory_dir(tmp_path)}


@pytest.mark.parametrize("layout", ["openai", "sharegpt_file", "llamafactory"])
@pytest.mark.parametrize("template", ["fallback", "model"])
def test_calls_and_answers_are_learned_never_tool_results(tmp_path, tokenizer, tool_tokenizer, layout, template):
    tok = tokenizer if template == "fallback" else tool_tokenizer
    assert template_supports_tools(tok) == (template == "model")
    src = sources(tmp_path)[layout]
    _, preview = preview_record(src, tok)
    learned, context = learned_text(preview), context_text(preview)
    assert '"name": "get_weather"' in learned and '"city": "Paris"' in learned  # the call
    assert ANSWER in learned
    assert RESULT not in learned and RESULT in context  # the tool result is context only
    assert "Weather of a city" not in learned and "Weather of a city" in context  # so is the tool list
    assert "Weather in Paris?" in context
    # the preview counts exactly the tokens training learns
    rec = load_records(src)[0]
    ids, labels = tokenize_conversation(tok, rec.messages, tools=rec.tools)
    assert preview["tokens"] == len(ids)
    assert preview["learned_tokens"] == sum(1 for x in labels if x != -100)


def test_fallback_format_is_the_inference_prompt(tokenizer):
    """Inference renders a tool conversation the same way training does: the prompt before the answer is
    exactly the context training saw."""
    msgs = to_messages(OPENAI, "r", check_order=True)
    preview = preview_conversation(tokenizer, msgs, OPENAI["tools"])
    prompt = render_prompt(tokenizer, msgs[:-1], OPENAI["tools"])
    assert "".join(s["text"] for s in preview["segments"]).startswith(prompt)
    assert "<tool_response>\n" + RESULT in prompt and "<tools>\n" in prompt


def test_preview_cli_json_shape(tmp_path, capsys):
    path = sources(tmp_path)["openai"]
    assert main(["data", "preview", path, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"segments", "tokens", "learned_tokens", "template"}
    assert out["template"] == {"name": None, "reason": "the model's own chat template", "reasoning": ""}
    assert all(set(s) == {"text", "train"} for s in out["segments"])
    assert 0 < out["learned_tokens"] < out["tokens"]
    assert main(["data", "preview", path, "--index", "3"]) == 2
    assert "--index 3 is past the end" in capsys.readouterr().err
    assert main(["data", "preview", path]) == 0  # the terminal view
    assert ANSWER in capsys.readouterr().out


THINK = {"messages": [{"role": "user", "content": "2+2?"},
                      {"role": "assistant", "reasoning_content": "Two plus two is four.", "content": "4"}]}
INLINE_THINK = {"messages": [{"role": "user", "content": "2+2?"},
                             {"role": "assistant", "content": "<think>\nTwo plus two is four.\n</think>\n\n4"}]}
EMPTY_THINK = {"messages": [{"role": "user", "content": "3+3?"},
                            {"role": "assistant", "content": "<think>\n\n</think>\n\n6"}]}


@pytest.mark.parametrize("record", [THINK, INLINE_THINK], ids=["reasoning_content", "inline"])
def test_reasoning_switch(tokenizer, record):
    msgs = to_messages(record, "r", check_order=True)
    on = preview_conversation(tokenizer, msgs, options=RenderOptions(learn_reasoning=True))
    off = preview_conversation(tokenizer, msgs, options=RenderOptions(learn_reasoning=False))
    assert "<think>\nTwo plus two is four.\n</think>" in learned_text(on)
    assert "Two plus two" not in learned_text(off) and "Two plus two" in context_text(off)
    assert learned_text(off).startswith("4") and learned_text(on).endswith("4<|im_end|>\n")
    assert on["tokens"] == off["tokens"] and off["learned_tokens"] < on["learned_tokens"]


def test_empty_think_block(tokenizer):
    msgs = to_messages(EMPTY_THINK, "r", check_order=True)
    got = {mode: preview_conversation(tokenizer, msgs, options=RenderOptions(empty_think=mode))
           for mode in ("learn", "mask", "drop")}
    assert "<think>\n\n</think>" in learned_text(got["learn"])
    assert "<think>" not in learned_text(got["mask"]) and "<think>" in context_text(got["mask"])
    assert "<think>" not in "".join(s["text"] for s in got["drop"]["segments"])
    assert learned_text(got["drop"]) == learned_text(got["mask"]) == "6<|im_end|>\n"


@pytest.mark.parametrize("turns, message", [
    ([{"role": "user", "content": "q"}, {"role": "tool", "content": "r"}, {"role": "assistant", "content": "a"}],
     "must follow an assistant turn that calls a tool"),
    ([{"role": "user", "content": "q"}, {"role": "assistant", "content": None, "tool_calls": [
        {"function": {"name": "f", "arguments": "{}"}}]}, {"role": "user", "content": "q2"}],
     "must be followed by its result"),
    ([{"role": "user", "content": "q"}, {"role": "assistant", "content": None, "tool_calls": [
        {"function": {"arguments": "{}"}}]}], "with a 'name'"),
    ([{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls": [
        {"name": "f", "arguments": "{not json"}]}], "holds invalid JSON"),
])
def test_bad_tool_conversations_name_the_problem(turns, message):
    with pytest.raises(DataError, match=message):
        to_messages({"messages": turns}, "f.jsonl:line 1", check_order=True)


def test_train_a_few_steps_on_tool_calls(tmp_path, default_model_dir):
    from roctune.recipes import train

    rows = [dict(OPENAI, messages=[dict(m) for m in OPENAI["messages"]]) for _ in range(4)]
    for i, r in enumerate(rows):
        r["messages"][-1]["content"] = f"{ANSWER} ({i})"
    data = write_jsonl(tmp_path / "tools.jsonl", rows)
    cfg = TrainConfig(data=[data], output=str(tmp_path / "run"), model=default_model_dir, max_steps=2,
                      batch_size=1, grad_accum=1, max_length=320, device="cpu", data_cache=False)
    summary = train(cfg, log=lambda s: None, progress=False)
    assert summary["steps"] == 2 and summary["final_loss"] == summary["final_loss"]  # ran, loss not NaN
    # the tool format the calls were written in is recorded, for serve to parse them the same way
    from roctune import rundir

    assert rundir.tool_format(cfg.output) == "hermes" and rundir.read_run(cfg.output)["tool_format"] == "hermes"


def test_tool_format_is_what_the_template_writes(tokenizer):
    from roctune.data.render import detect_tool_format

    assert detect_tool_format(tokenizer) == "hermes"  # no tools in its template: roctune's fallback
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = TOOL_TEMPLATE
    assert detect_tool_format(tok) == "hermes"
    tok.chat_template = TOOL_TEMPLATE.replace("<tool_call>", "<call>").replace("</tool_call>", "</call>")
    assert detect_tool_format(tok) is None  # a format roctune cannot parse
    tok.chat_template = TOOL_TEMPLATE.replace("<tool_call>\n{\"name\"", "{\"name\"").replace(
        "\"arguments\": ", "\"parameters\": ").replace("}\n</tool_call>", "}")
    assert detect_tool_format(tok) == "llama3_json"


def test_web_ui_data_panel_shows_the_same_preview(tmp_path):
    from roctune.webui.data import CONTEXT_STYLE, LEARNED_STYLE, preview_learned

    html = preview_learned(sources(tmp_path)["openai"], 0)
    assert f"<span style='{LEARNED_STYLE}'>It is 18C and sunny in Paris.&lt;|im_end|&gt;" in html
    learned = [part.split("</span>")[0] for part in html.split(f"<span style='{LEARNED_STYLE}'>")[1:]]
    assert not any("SECRET_RESULT" in t for t in learned)
    assert "SECRET_RESULT" in html and CONTEXT_STYLE in html


def test_check_accepts_tool_calls_without_text(tmp_path):
    from roctune.data.check import check_data

    report = check_data([sources(tmp_path)["openai"]], [], None, None)
    assert report["schema_errors"]["count"] == 0 and report["warnings"]["empty_fields"]["count"] == 0

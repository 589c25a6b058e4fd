"""The Chat panel streams its answers (issue 40): the text grows while the model generates and ends as the answer
`generate` gives; a system prompt reaches the model; the sampling numbers are refused in one line as in the CLI."""
from __future__ import annotations

import html
import os
import shutil

import pytest

pytest.importorskip("gradio", reason="the web UI needs the webui extra (make setup installs it)")


@pytest.fixture(scope="module")
def loaded(tiny_model_dir):
    from roctune.generate import load_for_inference

    return load_for_inference(None, tiny_model_dir, device="cpu")


def test_stream_grows_and_ends_as_the_plain_answer(loaded):
    from roctune.generate import generate
    from roctune.webui.chat import stream_answer

    msgs = [{"role": "user", "content": "Tell me a story about a cat."}]
    kw = dict(max_new_tokens=24, temperature=0.0, top_p=1.0)
    parts = list(stream_answer(loaded, msgs, kw))
    assert parts and parts[-1] == generate(loaded, [msgs], **kw)[0]
    assert all(later.startswith(earlier) for earlier, later in zip(parts, parts[1:])), parts


def test_the_stream_raises_the_generation_error_instead_of_hanging(loaded):
    from roctune.webui.chat import stream_answer

    with pytest.raises(ValueError):
        list(stream_answer(loaded, [{"role": "user", "content": "hi"}], dict(max_new_tokens=-3)))


def _handler(tmp_path, tiny_model_dir):
    from roctune.webui.chat import ModelCache, send_handler
    from roctune.webui.workspace import Workspace

    shutil.copytree(tiny_model_dir, tmp_path / "tiny")
    return send_handler(Workspace(str(tmp_path)), ModelCache())


def test_send_streams_steps_with_the_system_prompt(tmp_path, tiny_model_dir, monkeypatch):
    import roctune.webui.chat as chat

    seen = []
    real = chat.stream_answer
    monkeypatch.setattr(chat, "stream_answer", lambda loaded, msgs, kw, use: seen.append(msgs) or real(loaded, msgs,
                                                                                                     kw, use))
    steps = list(_handler(tmp_path, tiny_model_dir)("hi", "", "", "tiny", False, 6, 0, 1.0, "You are Roc.", [], []))
    assert len(steps) >= 2  # at least one partial answer, then the final step
    msg, ft, base, status = steps[-1][:4]
    assert msg == "" and base == [] and "answered in" in status
    assert [m["role"] for m in ft] == ["user", "assistant"]
    assert seen == [[{"role": "system", "content": "You are Roc."}, {"role": "user", "content": "hi"}]]
    assert all(s[3] and "answering" in s[3] for s in steps[:-1])


@pytest.mark.parametrize("max_new, temp, top_p, line, zh", [
    (0, 0, 1.0, "error: max new tokens: must be > 0 (got 0)", "出错：最大新 token 数：必须 > 0（当前为 0）"),
    (8, -1, 1.0, "error: temperature (0: greedy): must be >= 0 (got -1)", "出错：温度（0：贪心）：必须 >= 0（当前为 -1）"),
    (8, 0.7, 1.5, "error: top-p: must be <= 1 (got 1.5)", "出错：核采样阈值：必须 <= 1（当前为 1.5）"),
    # what arrives over the page's HTTP API may be any JSON: a list, a bool, words, an emptied box
    (8, 0, [0.5], "error: top-p: expected a number (got [0.5])", "出错：核采样阈值：应为数字（当前为 [0.5]）"),
    (8, {"t": 1}, 1.0, "error: temperature (0: greedy): expected a number (got {'t': 1})", "应为数字"),
    (True, 0, 1.0, "error: max new tokens: expected a number (got True)", "出错：最大新 token 数：应为数字"),
    ("many", 0, 1.0, "error: max new tokens: expected a whole number (got 'many')", "应为整数"),
    (None, 0, 1.0, "error: max new tokens: expected a whole number (got '')", "应为整数"),
    (8, 0, float("nan"), "error: top-p: must be a finite number (got nan)", "必须是有限的数")],
    ids=["max-new-0", "temperature-negative", "top-p-over-1", "top-p-list", "temperature-dict", "max-new-bool",
         "max-new-words", "max-new-empty", "top-p-nan"])
def test_bad_sampling_inputs_are_one_line_in_the_page_language(tmp_path, tiny_model_dir, max_new, temp, top_p, line,
                                                                 zh):
    """Each sampling input checked before the model loads, whatever its type: one line naming its box, in the
    page's language (nothing loaded, nothing written)."""
    from roctune.webui.i18n import Lang

    on_send = _handler(tmp_path, tiny_model_dir)
    for lang, want in (("en", line), ("zh", zh)):
        steps = list(on_send("hi", "", "", "tiny", False, max_new, temp, top_p, "", [], [], Lang(lang)))
        status = html.unescape(steps[-1][3])
        assert len(steps) == 1 and want in status and "internal error" not in status, status
        assert status.count("<br>") == 0
    assert os.listdir(tmp_path) == ["tiny"]

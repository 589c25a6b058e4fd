"""`roctune eval`: the text metrics, the identity fine-tune judged against its base on held-out questions
(tuned loss below base, ROUGE-L above, the same loss training logged, a report listing every record), the web
UI's Eval panel, and one-line errors before any model loads."""
from __future__ import annotations

import json
import os

import pytest

from conftest import IDENTITY, read_metrics, write_jsonl

HELD_OUT = [  # identity questions that are not in examples/identity.jsonl
    ("Could you tell me who you are?", "I am Roc, an assistant fine-tuned with roctune by the RocTune team."),
    ("What's your name, assistant?", "My name is Roc. The RocTune team fine-tuned me with roctune."),
    ("Who built this assistant?", "My name is Roc. The RocTune team fine-tuned me with roctune."),
    ("Describe who you are.", "I am Roc, an assistant fine-tuned with roctune by the RocTune team."),
    ("你到底是谁？", "我是 Roc，由 RocTune 团队用 roctune 微调的助手。"),
    ("能告诉我你的名字吗？", "我叫 Roc，是 RocTune 团队用 roctune 微调出来的助手。"),
]
KEYS = {"loss", "perplexity", "bleu4", "rouge1", "rouge2", "rougeL", "exact_match"}


def test_metrics():
    from roctune.eval.metrics import mean, score

    same = score("I am Roc.", "I am Roc.")
    assert same == {k: 100.0 for k in KEYS - {"loss", "perplexity"}}
    # Chinese is compared word by word (jieba): a partly right answer is between 0 and 100
    part = score("我是 Roc，一个助手。", "我是 Roc，由 RocTune 团队用 roctune 微调的助手。")
    assert 0 < part["rougeL"] < 100 and 0 < part["bleu4"] < 100 and part["exact_match"] == 0
    assert score("", "I am Roc.")["rougeL"] == 0 and score("...", "I am Roc.")["rouge1"] == 0
    assert mean([same, part])["rougeL"] == pytest.approx((100 + part["rougeL"]) / 2, abs=1e-3)


@pytest.fixture(scope="module")
def identity_eval_run(tmp_path_factory):
    """A short identity fine-tune (as tests/test_integration.py), with the held-out questions as eval data."""
    from roctune.config import TrainConfig
    from roctune.recipes import train

    root = tmp_path_factory.mktemp("eval")
    held = write_jsonl(root / "held_out.jsonl", [{"instruction": q, "input": "", "output": a} for q, a in HELD_OUT])
    out = str(root / "run")
    cfg = TrainConfig(data=[IDENTITY], eval_data=[held], output=out, max_steps=10, batch_size=4, grad_accum=1,
                      lr=3e-3, lora_r=16, lora_alpha=32, max_length=128, device="cpu", seed=1)
    train(cfg, log=lambda s: None, progress=False)
    return root, out, held


@pytest.mark.slow
def test_eval_json_tuned_beats_base_and_report_lists_every_record(identity_eval_run, capsys):
    from roctune.cli import main

    root, out, held = identity_eval_run
    report_dir = root / "report"
    assert main(["eval", "--adapter", out, "--data", held, "--json", "--output", str(report_dir),
                 "--max-new-tokens", "40", "--device", "cpu"]) == 0
    captured = capsys.readouterr()
    result = json.loads(captured.out)  # stdout holds the JSON and nothing else
    assert set(result) == {"n", "base", "tuned"} and result["n"] == len(HELD_OUT)
    assert set(result["base"]) == set(result["tuned"]) == KEYS
    assert result["tuned"]["loss"] < result["base"]["loss"]
    assert result["tuned"]["rougeL"] > result["base"]["rougeL"]
    # the tuned loss is training's own eval loss on the same records (the run evaluated them at its last step)
    assert result["tuned"]["loss"] == pytest.approx(read_metrics(out)[-1]["eval_loss"], rel=1e-4)

    page = (report_dir / "report.html").read_text(encoding="utf-8")
    assert page.count("<tr class='rt-example ") == len(HELD_OUT)
    assert all(q.replace("'", "&#x27;") in page for q, _ in HELD_OUT)
    preds = [json.loads(line) for line in open(report_dir / "predictions.jsonl", encoding="utf-8")]
    assert [p["prompt"] for p in preds] == [q for q, _ in HELD_OUT]
    assert all(p["tuned_answer"] and p["base_answer"] for p in preds)
    md = (report_dir / "report.md").read_text(encoding="utf-8")
    assert md.count("\n| ") == 1 + 7 + 1 + len(HELD_OUT)  # metrics header + 7 rows, examples header + one each
    improvements = [e["improvement"] for e in json.load(open(report_dir / "eval.json"))["examples"]]
    assert improvements == sorted(improvements, reverse=True)


@pytest.mark.slow
def test_webui_eval_panel_shows_the_report(identity_eval_run):
    from roctune.webui.eval import eval_handler, show_handler
    from roctune.webui.workspace import Workspace

    root, out, held = identity_eval_run
    ws = Workspace(str(root))
    status, body = eval_handler(ws)("run", "held_out.jsonl", "", 8)
    assert "rt-ok" in status and body.count("<tr class='rt-example") == len(HELD_OUT)
    assert os.path.isfile(os.path.join(out, "eval", "report.html"))
    status, again = show_handler(ws)("run", "")
    assert again.count("<tr class='rt-example") == len(HELD_OUT)
    status, _ = show_handler(ws)("run", "../elsewhere")
    assert "outside the workspace" in status


@pytest.mark.slow
@pytest.mark.parametrize("extra, message, code", [
    (["--tasks", "hellaswag"], "--tasks needs lm-evaluation-harness: pip install 'roctune[lm-eval]'", 1),
    (["--data", "missing.jsonl"], "missing.jsonl", 2),
    (["--max-new-tokens", "0"], "--max-new-tokens must be > 0 (got 0)", 2),
])
def test_errors_are_one_line_before_loading(identity_eval_run, tmp_path, capsys, monkeypatch, extra, message, code):
    from roctune.cli import main
    from roctune.eval import harness

    monkeypatch.setattr(harness, "installed", lambda: False)
    monkeypatch.setattr("roctune.generate.load_for_inference", lambda *a, **k: pytest.fail("a model loaded"))
    _, out, held = identity_eval_run
    args = ["eval", "--adapter", out, "--data", held, "--output", str(tmp_path / "rep"), *extra]
    assert main(args) == code
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "rep").exists()


def test_output_holding_other_files_and_bad_task_file_are_refused(tmp_path, capsys, monkeypatch):
    from roctune.cli import main
    from roctune.errors import ConfigError
    from roctune.eval import harness

    run = tmp_path / "run"
    run.mkdir()
    (run / "run.yaml").write_text("base_model: x\nconfig: {}\n")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    held = write_jsonl(tmp_path / "h.jsonl", [{"instruction": "q", "input": "", "output": "a"}])
    assert main(["eval", "--adapter", str(run), "--data", held, "--output", str(mine)]) == 2
    assert "holds files that roctune eval did not write" in capsys.readouterr().err
    assert os.listdir(mine) == ["notes.txt"]

    task = tmp_path / "task.yaml"
    task.write_text("dataset_path: json\n")
    with pytest.raises(ConfigError, match="needs a 'task: NAME' key"):
        harness.resolve(f"{task}")
    task.write_text("task: my_local_task\ndataset_path: json\n")
    assert harness.resolve(f"arc_easy,{task}") == (["arc_easy", "my_local_task"], [str(tmp_path)])

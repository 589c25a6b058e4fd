"""--stage pt (continued pretraining): raw text read from .txt files, folders and text columns, packed into blocks
of exactly --max-length tokens with EOS between documents and the remainder dropped, every token learned;
training end to end, resume, and bad input refused in one line before anything is written."""
import functools
import json
import os

import pytest

from conftest import cpu_train_cfg, resume_after_a_kill
from conftest import read_metrics as metrics
from conftest import run_train as run
from conftest import write_jsonl
from roctune.cli import main
from roctune.errors import ConfigError

TEXT = ("The miller walks to the river at dawn. He opens the sluice and the wheel begins to turn. "
        "By noon the sacks of flour stand in a row by the door, and the carts come up the hill to take them. ")


make_cfg = functools.partial(cpu_train_cfg, stage="pt", max_steps=2, max_length=32)


# ------------------------------------------------------------------------------------------- packing
def test_packing_cuts_exact_blocks_with_eos_between_documents_and_drops_the_remainder(tokenizer):
    from roctune.data.text import Document, pack

    docs = [Document(f"d{i}.txt", TEXT * (i + 1)) for i in range(3)]
    ids = [tokenizer(d.text, add_special_tokens=False)["input_ids"] for d in docs]
    stream = [t for one in ids for t in one + [tokenizer.eos_token_id]]
    length = 48
    assert len(stream) % length, "the test needs a remainder to drop"
    blocks, dropped = pack(tokenizer, docs, length)
    assert dropped == 0
    assert len(blocks) == len(stream) // length
    assert all(len(b.input_ids) == length for b in blocks)
    joined = [t for b in blocks for t in b.input_ids]
    assert joined == stream[:len(blocks) * length]  # in order, the remainder (shorter than a block) dropped
    # an EOS right after each document that fits in the kept blocks
    end = 0
    for one in ids[:-1]:
        end += len(one) + 1
        assert joined[end - 1] == tokenizer.eos_token_id
    assert all(b.labels == b.input_ids for b in blocks)  # every token learned
    assert blocks[0].source == "d0.txt" and blocks[-1].source == "d2.txt"


def test_text_shorter_than_one_block_names_the_file_and_the_fix(tokenizer):
    from roctune.data.text import Document, pack
    from roctune.errors import DataError

    with pytest.raises(DataError, match=r"short.txt: \d+ tokens of text, fewer than one block of --max-length 4096"):
        pack(tokenizer, [Document("short.txt", "A few words.")], 4096)


def test_sources_txt_folder_text_column_and_llamafactory(tmp_path):
    from roctune.data.text import load_documents

    (tmp_path / "a.txt").write_text("first document", encoding="utf-8")
    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "2.txt").write_text("two", encoding="utf-8")
    (folder / "1.txt").write_text("one", encoding="utf-8")
    (folder / "notes.md").write_text("not text data", encoding="utf-8")
    col = write_jsonl(tmp_path / "c.jsonl", [{"text": "row one", "id": 1}, {"text": "  "}, {"text": "row three"}])
    lf = tmp_path / "lf"
    lf.mkdir()
    write_jsonl(lf / "wiki.jsonl", [{"content": "from LLaMA-Factory"}])
    (lf / "dataset_info.json").write_text(json.dumps({"wiki": {"file_name": "wiki.jsonl",
                                                               "columns": {"prompt": "content"}}}))
    docs = load_documents([str(tmp_path / "a.txt"), str(folder), col, f"{lf}:wiki"])
    assert [d.text for d in docs] == ["first document", "one", "two", "row one", "row three", "from LLaMA-Factory"]
    assert docs[0].source.endswith("a.txt") and docs[4].source.endswith("c.jsonl:3")


# ------------------------------------------------------------------------------------------- training
@pytest.mark.parametrize("kind", ["txt", "jsonl"])
def test_pt_trains_two_steps_learning_every_token(tiny_model_dir, tmp_path, kind):
    if kind == "txt":
        data = tmp_path / "corpus.txt"
        data.write_text(TEXT * 6, encoding="utf-8")
        data = str(data)
    else:
        data = write_jsonl(tmp_path / "corpus.jsonl", [{"text": TEXT * 2, "meta": i} for i in range(3)])
    out = tmp_path / "run"
    summary, lines = run(make_cfg(data, out, tiny_model_dir, eval_ratio=0.2))
    assert summary["steps"] == 2
    rows = metrics(out)
    assert [r["step"] for r in rows] == [1, 2]
    # all tokens learned: a step's supervised tokens are its blocks' tokens less each row's first (never a target)
    assert all(r["tokens"] % 32 == 0 and r["supervised_tokens"] == r["tokens"] // 32 * 31 for r in rows), rows
    assert 0 < rows[-1]["eval_loss"] < 20
    assert os.path.isfile(out / "adapter_model.safetensors")
    assert any(line.startswith("pt: ") and "block(s) of 32 tokens" in line for line in lines)
    run_yaml = (out / "run.yaml").read_text(encoding="utf-8")
    assert "stage: pt" in run_yaml


@pytest.mark.parametrize("method", ["freeze", "full"])
def test_pt_trains_whole_layers_too(tiny_model_dir, tmp_path, method):
    data = tmp_path / "corpus.txt"
    data.write_text(TEXT * 4, encoding="utf-8")
    out = tmp_path / "run"
    summary, _ = run(make_cfg(str(data), out, tiny_model_dir, method=method, max_steps=1, lr=1e-3))
    assert summary["steps"] == 1 and os.path.isfile(out / "model.safetensors")


def test_pt_resume_gives_the_uninterrupted_run(tiny_model_dir, tmp_path):
    """--save-steps 2 then --resume: the same losses as one uninterrupted run (SFT's checkpoints, reused)."""
    data = tmp_path / "corpus.txt"
    data.write_text(TEXT * 8, encoding="utf-8")
    kw = dict(max_steps=4, lora_dropout=0.1)
    straight, out = tmp_path / "straight", tmp_path / "resumed"
    run(make_cfg(data, straight, tiny_model_dir, **kw))
    resume_after_a_kill(lambda output, **more: make_cfg(data, output, tiny_model_dir, **kw, **more), straight, out)


def test_eval_of_a_pt_run_gives_held_out_perplexity_equal_to_training_eval_loss(tiny_model_dir, tmp_path, capsys):
    import math

    train, held = tmp_path / "train.txt", tmp_path / "held.txt"
    train.write_text(TEXT * 6, encoding="utf-8")
    held.write_text(TEXT[::-1] * 2, encoding="utf-8")  # other text: the base and tuned losses differ
    out = tmp_path / "run"
    run(make_cfg(str(train), out, tiny_model_dir, eval_data=[str(held)]))
    logged = metrics(out)[-1]["eval_loss"]
    assert main(["eval", "--adapter", str(out), "--data", str(held), "--json", "--device", "cpu"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["tuned"]["loss"] == pytest.approx(logged, abs=1e-4)
    assert result["tuned"]["perplexity"] == pytest.approx(math.exp(result["tuned"]["loss"]), rel=1e-4)
    assert result["base"]["loss"] != result["tuned"]["loss"] and result["n"] >= 1
    # the answer-comparison report's options are refused in one line
    assert main(["eval", "--adapter", str(out), "--data", str(held), "--tasks", "x"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--tasks" in err[0] and "--stage pt run" in err[0], err


# ------------------------------------------------------------------------------------------- bad input
def cli(args, capsys):
    code = main(["train", "--stage", "pt", "--device", "cpu", *args])
    return code, capsys.readouterr().err.strip().splitlines()


@pytest.mark.parametrize("case", ["no_text_column", "empty_txt", "empty_column"])
def test_bad_text_data_is_one_line_naming_file_and_column(tiny_model_dir, tmp_path, capsys, case):
    if case == "no_text_column":
        data = write_jsonl(tmp_path / "sft.jsonl", [{"instruction": "Q", "output": "A"}])
        needles = ["sft.jsonl:1", "no 'text' column", "instruction, output"]
    elif case == "empty_txt":
        data = str(tmp_path / "empty.txt")
        open(data, "w").close()
        needles = ["empty.txt", "empty"]
    else:
        data = write_jsonl(tmp_path / "blank.jsonl", [{"text": ""}, {"text": " \n"}])
        needles = ["blank.jsonl", "no text in column 'text'"]
    out = tmp_path / "run"
    code, err = cli(["--data", data, "--output", str(out), "--model", tiny_model_dir], capsys)
    assert code == 2
    assert len(err) == 1 and err[0].startswith("roctune train: error:"), err
    for n in needles:
        assert n in err[0], err[0]
    assert not out.exists()


@pytest.mark.parametrize("kw, named", [({"template": "chatml"}, "--template chatml"),
                                       ({"truncation": "split"}, "--truncation split"),
                                       ({"learn_reasoning": False}, "--no-learn-reasoning"),
                                       ({"empty_think": "drop"}, "--empty-think drop")])
def test_chat_settings_are_refused_for_pt(tmp_path, kw, named):
    cfg = make_cfg(str(tmp_path / "x.txt"), tmp_path / "run", None, **kw)
    with pytest.raises(ConfigError) as e:
        cfg.validate()
    assert str(e.value).startswith(named) and "--stage pt" in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "run").exists()


def test_web_ui_form_offers_pt_with_its_labels():
    from roctune.webui.train_form import form_specs

    stage = next(s for s in form_specs() if s["name"] == "stage")
    assert "pt" in stage["choices"]
    assert "pt (continued pretraining" in stage["help"] and "pt（继续预训练" in stage["help_zh"]

"""--truncation right|left|split for examples longer than --max-length, and `data check`'s length distribution
against --max-length."""
from __future__ import annotations

import json

import pytest

from conftest import run_train, write_jsonl


def _ids_labels(n, prompt):
    ids = list(range(100, 100 + n))
    return ids, [-100] * prompt + ids[prompt:]


def test_right_and_left_keep_one_end():
    from roctune.data.render import truncate

    ids, labels = _ids_labels(10, 3)
    assert truncate(ids, labels, 4, "right") == [(ids[:4], labels[:4])]
    assert truncate(ids, labels, 4, "left") == [(ids[-4:], labels[-4:])]
    assert truncate(ids, labels, 10, "split") == [(ids, labels)]  # short enough: untouched


@pytest.mark.parametrize("n, size", [(10, 4), (11, 4), (100, 7), (8, 2)])
def test_split_learns_every_token_once(n, size):
    from roctune.data.render import truncate

    ids, labels = _ids_labels(n, 3)
    parts = truncate(ids, labels, size, "split")
    assert all(len(i) <= size for i, _ in parts) and all(len(i) == len(lab) for i, lab in parts)
    # each window's first token is context (the last of the window before): the predicted targets are the whole
    # example's, once each, in order
    learned = [x for _, lab in parts for x in lab[1:]]
    assert learned == labels[1:]
    assert [i[0] for i, _ in parts[1:]] == [i[-1] for i, _ in parts[:-1]]


def test_split_makes_several_examples_of_a_long_conversation(tokenizer):
    from roctune.data.records import Record
    from roctune.data.render import RenderOptions, tokenize_conversation, tokenize_records

    answer = " ".join(f"word{i}" for i in range(300))
    msgs = [{"role": "user", "content": "Write it."}, {"role": "assistant", "content": answer}]
    whole, whole_labels = tokenize_conversation(tokenizer, msgs)
    records = [Record("doc.jsonl:1", msgs)]
    split, dropped = tokenize_records(tokenizer, records, 128, RenderOptions(truncation="split"))
    assert dropped == 0 and len(split) == -(-(len(whole) - 1) // 127) > 2
    assert [t for e in split for t in e.labels[1:]] == whole_labels[1:]
    right, _ = tokenize_records(tokenizer, records, 128, RenderOptions())
    left, _ = tokenize_records(tokenizer, records, 128, RenderOptions(truncation="left"))
    assert right[0].input_ids == whole[:128] and left[0].input_ids == whole[-128:]


def test_train_with_split_trains_on_the_windows(tiny_model_dir, tmp_path):
    from roctune.config import TrainConfig

    rows = [{"instruction": f"Write {i}.", "input": "", "output": " ".join(f"w{j}" for j in range(150))}
            for i in range(2)]
    data = write_jsonl(tmp_path / "long.jsonl", rows)
    cfg = TrainConfig(model=tiny_model_dir, data=[data], output=str(tmp_path / "run"), max_steps=1, batch_size=2,
                      grad_accum=1, max_length=64, truncation="split", device="cpu", data_cache=False)
    cfg.validate()
    _, lines = run_train(cfg)
    n = int(next(line for line in lines if line.startswith("examples:")).split()[1])
    assert n > 2 * 4  # each ~300-token record became several 64-token examples


def test_split_is_for_sft(capsys, tmp_path, alpaca_file):
    from roctune.cli import main

    code = main(["train", "--data", alpaca_file, "--output", str(tmp_path / "o"), "--stage", "dpo",
                 "--truncation", "split"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--truncation split is for --stage sft" in err[0]


def test_data_check_reports_lengths_against_max_length(tokenizer, tmp_path, capsys):
    from roctune.cli import main
    from roctune.data.check import check_data

    rows = [{"instruction": "Say it.", "input": "", "output": " ".join(["long"] * n)} for n in (5, 10, 200, 400)]
    path = write_jsonl(tmp_path / "d.jsonl", rows)
    tok = check_data([path], tokenizer=tokenizer, max_length=100)["tokens"]
    assert tok["truncated"] == 2 and tok["truncated_share"] == 0.5
    assert tok["p50"] <= tok["p90"] <= tok["p95"] <= tok["p99"] <= tok["max"] > 400
    assert tok["tokens_cut"] > 400 and 0 < tok["tokens_cut_share"] < 1
    assert tok["split_examples"] >= 2 + 2 + 4  # two short ones, then ~200 and ~400 tokens in windows of 100
    assert main(["data", "check", path, "--max-length", "100"]) == 0
    out = capsys.readouterr().out
    assert "truncates 2 example(s) (50.0%" in out and "--truncation split would make" in out
    assert json.loads(json.dumps(tok)) == tok


def test_train_form_has_the_long_sequence_settings(tmp_path):
    """The length, truncation, rope scaling and sequence-parallel settings are on the web UI's Train form (generated
    from roctune.config) and reach the settings file the page's `roctune train --config` reads; multi-node
    settings are not."""
    from roctune.config import from_sources
    from roctune.webui.jobs import write_settings
    from roctune.webui.train_form import fill_config, form_specs
    from roctune.webui.workspace import Workspace

    names = [s["name"] for s in form_specs()]
    for name in ("max_length", "truncation", "rope_scaling", "sequence_parallel", "nproc"):
        assert name in names, name
    assert not {"nnodes", "node_rank", "master_addr", "master_port"} & set(names)
    write_jsonl(tmp_path / "a.jsonl", [{"instruction": "Hi?", "input": "", "output": "Hello."}])
    cfg, _ = fill_config({"data": ["a.jsonl"], "output": "runs/x", "max_length": 4096, "truncation": "split",
                          "rope_scaling": "yarn:2", "nproc": 2, "sequence_parallel": 2}, Workspace(str(tmp_path)))
    (tmp_path / "job").mkdir()
    back = from_sources(write_settings(cfg, str(tmp_path / "job")), {})
    got = {k: getattr(back, k) for k in ("max_length", "truncation", "rope_scaling", "nproc", "sequence_parallel")}
    assert got == {"max_length": 4096, "truncation": "split", "rope_scaling": "yarn:2", "nproc": 2,
                   "sequence_parallel": 2}, got

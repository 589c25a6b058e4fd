"""`roctune data check`: every check, the summary, --json, exit codes and token statistics."""
import json

import pytest

from roctune.cli import main
from roctune.data.check import check_data
from roctune.data.keys import normalise


def jsonl(path, rows):
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def qa(q, a, **kw):
    return {"instruction": q, "output": a, **kw}


def test_clean_data_has_no_findings(tmp_path):
    r = check_data([jsonl(tmp_path / "a.jsonl", [qa("one", "1"), qa("two", "2")])])
    assert r["records"] == r["valid"] == 2
    assert r["schema_errors"]["count"] == 0
    assert all(f["count"] == 0 for f in r["warnings"].values())
    assert r["tokens"] is None


def test_empty_and_whitespace_fields(tmp_path):
    rows = [qa("   ", "x"), {"messages": [{"role": "system", "content": "\n\t"}, {"role": "user", "content": "q"},
                                           {"role": "assistant", "content": "a"}]}, qa("fine", "ok", input="")]
    w = check_data([jsonl(tmp_path / "a.jsonl", rows)])["warnings"]["empty_fields"]
    assert w["count"] == 2
    assert w["examples"][0].endswith("a.jsonl:1: user turn 0 is empty")
    assert w["examples"][1].endswith("a.jsonl:2: system turn 0 is empty")


def test_exact_and_near_duplicates(tmp_path):
    rows = [qa("Hello, World!", "Hi there."), qa("Hello, World!", "Hi there."),
            qa("hello   world", "hi THERE"), qa("你好，世界！", "好。"), qa("你好 世界", "好"), qa("other", "x")]
    r = check_data([jsonl(tmp_path / "a.jsonl", rows)])["warnings"]
    assert r["duplicates"]["count"] == 1
    assert r["duplicates"]["examples"][0].endswith("a.jsonl:2 repeats " + str(tmp_path / "a.jsonl") + ":1")
    assert r["near_duplicates"]["count"] == 2  # line 3 (of 1) and line 5 (of 4); the exact one is not counted again
    assert ":3 repeats" in r["near_duplicates"]["examples"][0]
    assert ":5 repeats" in r["near_duplicates"]["examples"][1]


def test_normalise_ignores_case_punctuation_and_spacing():
    assert normalise("Hello,  World!") == normalise("hello world") == normalise("HELLO\tWORLD.")
    assert normalise("你好，世界。") == normalise("你好 世界")
    assert normalise("hello") != normalise("help")


def test_conflicts_same_prompt_different_answers(tmp_path):
    rows = [qa("Capital of France?", "Paris"), qa("capital of france", "Lyon"), qa("Capital of France?", "Paris"),
            qa("2+2", "4"), qa("2+2", "4.")]
    r = check_data([jsonl(tmp_path / "a.jsonl", rows)])["warnings"]["conflicts"]
    assert r["count"] == 1
    assert r["examples"][0].startswith("2 different answers")
    assert ":1" in r["examples"][0] and ":2" in r["examples"][0]


def test_answer_identical_to_prompt(tmp_path):
    rows = [qa("Repeat after me", "Repeat after me!"), qa("q", "a")]
    r = check_data([jsonl(tmp_path / "a.jsonl", rows)])["warnings"]["answer_equals_prompt"]
    assert r["count"] == 1 and r["examples"][0].endswith(":1")


def test_eval_overlap_across_formats(tmp_path):
    train = jsonl(tmp_path / "t.jsonl", [qa("one", "1"), qa("two", "2"), qa("three", "3")])
    ev = tmp_path / "e.json"
    ev.write_text(json.dumps([{"messages": [{"role": "user", "content": "Two!"},
                                            {"role": "assistant", "content": "2"}]}]), encoding="utf-8")
    r = check_data([train], [str(ev)])["warnings"]["eval_overlap"]
    assert r["count"] == 1 and r["examples"][0].endswith("t.jsonl:2")


def test_records_from_several_files_are_named_by_file(tmp_path):
    a = jsonl(tmp_path / "a.jsonl", [qa("one", "1")])
    b = tmp_path / "b.json"
    b.write_text(json.dumps([qa("x", "y"), qa("one", "1")]), encoding="utf-8")
    r = check_data([a, str(b)])["warnings"]["duplicates"]
    assert r["examples"] == [f"{b}: record 1 repeats {a}:1"]


def test_cli_summary_json_and_exit_codes(tmp_path, capsys):
    path = jsonl(tmp_path / "a.jsonl", [qa("q", "a"), qa("q", "a")])
    assert main(["data", "check", path]) == 0  # warnings only
    out = capsys.readouterr().out
    assert "2 records read" in out and "duplicates" in out and "no schema errors" in out
    assert main(["data", "check", path, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["warnings"]["duplicates"]["count"] == 1
    bad = jsonl(tmp_path / "b.jsonl", [qa("q", "a"), {"instruction": "q"}])
    assert main(["data", "check", bad, "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["schema_errors"]["first"] == [f"{bad}:2: missing field 'output'; add it, or remove the record"]


@pytest.fixture(scope="module")
def tiny_tokenizer_dir(tmp_path_factory):
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from transformers import PreTrainedTokenizerFast

    words = ["[UNK]", "</s>", "<|im_start|>", "<|im_end|>", "user", "assistant", "system"] + [f"w{i}" for i in range(50)]
    tok = tokenizers.Tokenizer(WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", eos_token="</s>")
    # ChatML's markers as single tokens: a template-less tokenizer gets ChatML only where it can write it
    fast.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    d = tmp_path_factory.mktemp("tok")
    fast.save_pretrained(d)
    return str(d)


def test_token_statistics_and_truncation(tmp_path, tiny_tokenizer_dir, capsys):
    from roctune.data.records import load_records
    from roctune.data.render import tokenize_conversation
    from roctune.models import load_tokenizer

    rows = [qa(" ".join(f"w{i}" for i in range(n)), "w1 w2") for n in (1, 5, 10, 20, 40)]
    path = jsonl(tmp_path / "a.jsonl", rows)
    tok = load_tokenizer(tiny_tokenizer_dir)
    lengths = sorted(len(tokenize_conversation(tok, r.messages)[0]) for r in load_records(path))
    assert main(["data", "check", path, "--model", tiny_tokenizer_dir, "--max-length", str(lengths[2]),
                 "--json"]) == 0
    t = json.loads(capsys.readouterr().out)["tokens"]
    assert t["max"] == lengths[-1] and t["p50"] == lengths[2]
    assert t["truncated"] == 2 and t["max_length"] == lengths[2]
    assert main(["data", "check", path, "--model", tiny_tokenizer_dir]) == 0
    assert "tokens per example: p50" in capsys.readouterr().out


def test_hash_based_counts_match_a_direct_count(tmp_path):
    import random

    rng = random.Random(5)
    rows = []
    for i in range(3000):
        q, a = f"Q{rng.randrange(400)}", f"A{rng.randrange(3)}"
        if rng.random() < 0.2:
            q = q.lower() + "?"  # a near duplicate of the plain form
        rows.append(qa(q, a))
    r = check_data([jsonl(tmp_path / "a.jsonl", rows)])["warnings"]
    seen_exact, seen_near, answers = set(), set(), {}
    n_exact = n_near = 0
    for row in rows:
        exact = (row["instruction"], row["output"])
        near = (row["instruction"].lower().rstrip("?"), row["output"].lower())
        if exact in seen_exact:
            n_exact += 1
        elif near in seen_near:
            n_near += 1
        seen_exact.add(exact)
        seen_near.add(near)
        answers.setdefault(near[0], set()).add(near[1])
    assert r["duplicates"]["count"] == n_exact
    assert r["near_duplicates"]["count"] == n_near
    assert r["conflicts"]["count"] == sum(1 for v in answers.values() if len(v) > 1)

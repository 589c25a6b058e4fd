"""`roctune data split`: de-duplicate first, seeded split, no example in both parts, atomic outputs."""
import json
import os

import pytest

from roctune.cli import main
from roctune.data.keys import normalise
from roctune.data.records import load_records


def jsonl(path, rows):
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def keys(path):
    return {tuple(normalise(m["content"]) for m in r.messages) for r in load_records(str(path))}


def rows_with_duplicates():
    rows = [{"instruction": f"Question {i}?", "output": f"Answer {i}.", "id": i} for i in range(40)]
    rows += [{"instruction": f"question {i}", "output": f"ANSWER {i}", "id": 100 + i} for i in range(0, 40, 3)]
    rows += [{"instruction": f"Question {i}?", "output": f"Answer {i}.", "id": 200 + i} for i in range(0, 40, 4)]
    return rows


def test_split_deduplicates_so_no_example_is_in_both(tmp_path, capsys):
    src = jsonl(tmp_path / "in.jsonl", rows_with_duplicates())
    a, b = tmp_path / "train.jsonl", tmp_path / "eval.jsonl"
    assert main(["data", "split", src, "--eval-ratio", "0.25", "--seed", "3", "--out-train", str(a),
                 "--out-eval", str(b)]) == 0
    assert "24 duplicates dropped" in capsys.readouterr().out
    ta, tb = keys(a), keys(b)
    assert not ta & tb
    assert len(ta) + len(tb) == 40 and len(tb) == 10
    first = [json.loads(line) for line in a.read_text().splitlines()]
    assert all(r["id"] < 100 for r in first)  # the first occurrence is kept, fields as they were


def test_split_is_reproducible_and_seed_dependent(tmp_path):
    src = jsonl(tmp_path / "in.jsonl", rows_with_duplicates())

    def run(seed, tag):
        a, b = tmp_path / f"t{tag}.jsonl", tmp_path / f"e{tag}.jsonl"
        assert main(["data", "split", src, "--eval-ratio", "0.2", "--seed", str(seed), "--out-train", str(a),
                     "--out-eval", str(b), "--overwrite"]) == 0
        return b.read_text()

    assert run(1, "x") == run(1, "y")
    assert run(1, "x") != run(2, "z")


def test_split_output_formats_follow_extensions(tmp_path):
    src = tmp_path / "in.json"
    src.write_text(json.dumps([{"prompt": f"p{i}", "completion": f"c{i}", "n": i} for i in range(10)]))
    assert main(["data", "split", str(src), "--eval-ratio", "0.3", "--seed", "0",
                 "--out-train", str(tmp_path / "t.csv"), "--out-eval", str(tmp_path / "e.json")]) == 0
    assert len(load_records(str(tmp_path / "t.csv"))) == 7
    ev = json.loads((tmp_path / "e.json").read_text())
    assert len(ev) == 3 and set(ev[0]) == {"prompt", "completion", "n"}
    pytest.importorskip("pyarrow")
    assert main(["data", "split", str(src), "--eval-ratio", "0.3", "--seed", "0",
                 "--out-train", str(tmp_path / "t.parquet"), "--out-eval", str(tmp_path / "e.jsonl")]) == 0
    assert len(load_records(str(tmp_path / "t.parquet"))) == 7


def test_split_rejects_bad_arguments(tmp_path, capsys):
    src = jsonl(tmp_path / "in.jsonl", rows_with_duplicates())
    base = ["data", "split", src, "--seed", "1"]
    assert main(base + ["--eval-ratio", "1.5", "--out-train", str(tmp_path / "a.jsonl"),
                        "--out-eval", str(tmp_path / "b.jsonl")]) == 2
    assert "--eval-ratio" in capsys.readouterr().err
    assert main(base + ["--eval-ratio", "0.1", "--out-train", src, "--out-eval", str(tmp_path / "b.jsonl")]) == 2
    assert main(base + ["--eval-ratio", "0.1", "--out-train", str(tmp_path / "nodir" / "a.jsonl"),
                        "--out-eval", str(tmp_path / "b.jsonl")]) == 2
    assert sorted(os.listdir(tmp_path)) == ["in.jsonl"]


def test_split_to_parquet_keeps_every_field_or_refuses(tmp_path, capsys):
    pytest.importorskip("pyarrow")
    src = jsonl(tmp_path / "in.jsonl", [{"prompt": f"p{i}", "completion": f"c{i}", **({"extra": i} if i == 3 else {})}
                                        for i in range(6)])
    assert main(["data", "split", src, "--eval-ratio", "0.2", "--seed", "0", "--out-train",
                 str(tmp_path / "t.parquet"), "--out-eval", str(tmp_path / "e.parquet")]) == 0
    rows = [r.raw for r in load_records(str(tmp_path / "t.parquet"))]
    assert all("extra" in r for r in rows) and {r["extra"] for r in rows} <= {3, None}

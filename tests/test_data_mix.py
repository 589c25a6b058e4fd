"""Mixing datasets by weight (`--data a.jsonl:0.7 --data b.jsonl:0.3`): the proportions, a seeded order that is
the same on every read (so a resumed run sees it again), and `DIR:name` keeping its meaning."""
import json
from collections import Counter

import pytest

from roctune.data.records import load_records
from roctune.data.sources import resolve_sources, split_weight
from roctune.errors import DataError

from conftest import write_jsonl


def rows(tag, n):
    return [{"instruction": f"{tag} {i}", "output": "ok"} for i in range(n)]


def origin(records):
    return Counter(r.source.split(":")[0].rsplit("/", 1)[-1] for r in records)


def test_weights_set_the_proportions_in_a_seeded_order(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", rows("a", 30))
    b = write_jsonl(tmp_path / "b.jsonl", rows("b", 10))
    mixed = load_records([f"{a}:0.25", f"{b}:0.75"])
    assert origin(mixed) == {"a.jsonl": 10, "b.jsonl": 30}  # b's 10 records, each three times
    assert Counter(r.source for r in mixed if "b.jsonl" in r.source).most_common()[-1][1] == 3
    again = load_records([f"{a}:0.25", f"{b}:0.75"])
    assert [r.source for r in again] == [r.source for r in mixed]  # same order on every read
    other = load_records([f"{a}:0.25", f"{b}:0.75"], seed=1)
    assert [r.source for r in other] != [r.source for r in mixed]
    plain = load_records([a, b])  # no weights: both files in the order given
    assert [r.source for r in plain][:1] == [f"{a}:1"] and len(plain) == 40


def test_weight_rules(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", rows("a", 2))
    with pytest.raises(DataError, match="give every --data value a mixing weight"):
        load_records([f"{a}:0.5", a])
    with pytest.raises(DataError, match="must be > 0"):
        split_weight(f"{a}:0")
    assert split_weight(f"{tmp_path}/missing.jsonl:0.5") == (f"{tmp_path}/missing.jsonl:0.5", None)


def test_llamafactory_names_keep_their_meaning(tmp_path):
    d = tmp_path / "lf"
    d.mkdir()
    write_jsonl(d / "x.jsonl", rows("x", 4))
    write_jsonl(d / "y.jsonl", rows("y", 4))
    (d / "dataset_info.json").write_text(json.dumps({"x": {"file_name": "x.jsonl"}, "2024": {"file_name": "y.jsonl"}}))
    assert split_weight(f"{d}:x") == (f"{d}:x", None)
    assert split_weight(f"{d}:2024") == (f"{d}:2024", None)  # a dataset named by a number, not a weight
    assert split_weight(f"{d}:x:0.5") == (f"{d}:x", 0.5)
    assert [s.path for s in resolve_sources(f"{d}:2024:2")] == [str(d / "y.jsonl")]
    mixed = load_records([f"{d}:x:3", f"{d}:2024:1"])
    assert origin(mixed) == {"x.jsonl": 6, "y.jsonl": 2}

"""The tokenized-data cache: a second run with the same data, tokenizer, template and settings reads the examples
back without calling the tokenizer; any change to those makes a new entry; a broken entry is ignored."""
import os
from types import SimpleNamespace

import numpy as np

from roctune.data import cache
from roctune.data.records import load_records
from roctune.data.render import RenderOptions, tokenize_records
from roctune.training.session import tokenize_splits

from conftest import write_jsonl


class CountingTokenizer:
    """The bundled tokenizer, counting how often it tokenizes."""

    def __init__(self, tok):
        self.tok, self.calls = tok, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.tok(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.tok, name)


def run_once(tok, data, **kw):
    cfg = SimpleNamespace(data=[data], eval_data=[], max_length=64, eval_ratio=0.0, seed=0, data_cache=True)
    vars(cfg).update(kw)
    records = load_records(data)
    settings = {"recipe": "sft", **vars(RenderOptions())}
    items, _ = tokenize_splits(tokenize_records, tok, records, [], cfg, lambda s: None, "example", settings)
    return items


def test_second_run_reads_the_cache(tmp_path, monkeypatch, tokenizer):
    monkeypatch.setenv("ROCTUNE_HOME", str(tmp_path / "home"))
    data = write_jsonl(tmp_path / "d.jsonl", [{"instruction": f"Say {i}", "output": f"{i}!"} for i in range(5)])
    tok = CountingTokenizer(tokenizer)
    first = run_once(tok, data)
    assert tok.calls == 5
    second = run_once(tok, data)
    assert tok.calls == 5  # nothing tokenized again
    assert [(e.input_ids, e.labels, e.source) for e in second] == [(e.input_ids, e.labels, e.source) for e in first]
    assert isinstance(second, cache.CachedExamples)  # memory-mapped: built when indexed
    assert second[-1].labels == first[-1].labels and len(second[1:3]) == 2
    entries = os.listdir(tmp_path / "home" / "cache" / "tokenized")
    assert len(entries) == 1 and not entries[0].startswith(".tmp")
    assert np.load(tmp_path / "home" / "cache" / "tokenized" / entries[0] / "input_ids.npy").dtype == np.int32

    run_once(tok, data, max_length=60)  # another setting: another entry
    assert tok.calls == 10
    write_jsonl(tmp_path / "d.jsonl", [{"instruction": f"Say {i}", "output": f"{i}?"} for i in range(5)])
    run_once(tok, data)  # the file's content changed
    assert tok.calls == 15
    run_once(tok, data, data_cache=False)  # --no-data-cache
    assert tok.calls == 20


def test_unreadable_entry_is_ignored(tmp_path, tokenizer):
    data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "a", "completion": "b"}])
    items, dropped = tokenize_records(tokenizer, load_records(data), 64)
    folder = cache.save(str(tmp_path / "c"), "k", items, dropped)
    with open(os.path.join(folder, "input_ids.npy"), "r+b") as f:
        f.truncate(100)  # cut short
    assert cache.load(str(tmp_path / "c"), "k") is None
    os.unlink(os.path.join(folder, "offsets.npy"))
    assert cache.load(str(tmp_path / "c"), "k") is None
    got, _, hit = cache.cached(str(tmp_path / "c"), "k2", lambda: (items, dropped))
    assert not hit and cache.load(str(tmp_path / "c"), "k2")[0][0].labels == items[0].labels

"""The tokenized-data cache: a second run with the same data, tokenizer, template and settings reads the examples
back without calling the tokenizer; any change to those makes a new entry; a broken entry is ignored."""
import os
from types import SimpleNamespace


from roctune.data import cache
from roctune.data.records import load_records
from roctune.data.render import RenderOptions, iter_tokenized, tokenize_records
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
    items, _ = tokenize_splits(tokenize_records, tok, records, [], cfg, lambda s: None, "example",
                               (settings, iter_tokenized))
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
    assert os.path.getsize(tmp_path / "home" / "cache" / "tokenized" / entries[0] / "input_ids.i32") == 4 * sum(
        len(e.input_ids) for e in first)

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
    with open(os.path.join(folder, "input_ids.i32"), "r+b") as f:
        f.truncate(8)  # cut short
    assert cache.load(str(tmp_path / "c"), "k") is None
    os.unlink(os.path.join(folder, "offsets.i64"))
    assert cache.load(str(tmp_path / "c"), "k") is None
    got, _, hit = cache.cached(str(tmp_path / "c"), "k", lambda: iter(items))  # the broken entry is replaced
    assert not hit and cache.load(str(tmp_path / "c"), "k")[0][0].labels == items[0].labels == got[0].labels


def test_streamed_records_give_the_same_examples_in_chunks(tmp_path, monkeypatch, tokenizer):
    """--streaming: records are read from disk again when tokenized, written a chunk at a time, and the result
    is what the in-memory path gives; an --eval-ratio split is a view of the memory-mapped entry."""
    from roctune.data.records import StreamedRecords
    from roctune.data.split import split_eval

    monkeypatch.setattr(cache, "CHUNK", 3)
    data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": f"q{i}", "completion": f"a{i}"} for i in range(8)])
    streamed = StreamedRecords(data)
    assert len(streamed) == 8 and [r.source for r in streamed] == [r.source for r in load_records(data)]
    items, dropped, hit = cache.cached(str(tmp_path / "c"), "k", lambda: iter_tokenized(tokenizer, streamed, 64))
    expected, _ = tokenize_records(tokenizer, load_records(data), 64)
    assert not hit and dropped == 0
    assert [(e.input_ids, e.labels, e.source) for e in items] == [(e.input_ids, e.labels, e.source) for e in expected]
    train, held = split_eval(items, 0.25, 0)
    assert isinstance(held, cache.CachedExamples) and len(held) == 2 and len(train) == 6
    assert sorted(e.source for e in list(train) + list(held)) == sorted(e.source for e in expected)


def test_streaming_train_run(tmp_path, monkeypatch, tiny_model_dir):
    from roctune.config import TrainConfig
    from roctune.recipes import train

    monkeypatch.setenv("ROCTUNE_HOME", str(tmp_path / "home"))
    data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": f"q{i}", "completion": f"a{i}"} for i in range(6)])
    cfg = TrainConfig(data=[data], output=str(tmp_path / "run"), model=tiny_model_dir, max_steps=2, batch_size=2,
                      grad_accum=1, max_length=64, device="cpu", streaming=True, eval_ratio=0.2)
    lines = []
    summary = train(cfg, log=lines.append, progress=False)
    assert summary["steps"] == 2
    assert os.listdir(tmp_path / "home" / "cache" / "tokenized")

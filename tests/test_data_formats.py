"""Reading every supported dataset format (issue 4): files, LLaMA-Factory directories, mixing, streaming."""
import json

import pytest

from roctune.data import readers
from roctune.data.readers import iter_raw
from roctune.data.records import iter_examples, load_records
from roctune.data.sources import resolve_sources
from roctune.errors import DataError

ALPACA = [{"instruction": "Add 2 and 3", "input": "", "output": "5"},
          {"instruction": "Translate", "input": "bonjour", "output": "hello", "system": "Be brief."}]
USER_ASSISTANT = [{"role": "user", "content": "Add 2 and 3"}, {"role": "assistant", "content": "5"}]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def write_json(path, rows, indent=2):
    path.write_text(json.dumps(rows, ensure_ascii=False, indent=indent), encoding="utf-8")
    return str(path)


def test_alpaca_jsonl(tmp_path):
    recs = load_records(write_jsonl(tmp_path / "a.jsonl", ALPACA))
    assert recs[0].messages == USER_ASSISTANT
    assert recs[1].messages[0] == {"role": "system", "content": "Be brief."}
    assert recs[1].messages[1]["content"] == "Translate\n\nbonjour"
    assert recs[1].source.endswith("a.jsonl:2")


def test_json_array_streamed_across_chunk_boundaries(tmp_path, monkeypatch):
    monkeypatch.setattr(readers, "_CHUNK", 7)  # force records to be split between reads
    rows = [{"instruction": f"q{i} \u4f60\u597d \"quoted\"", "output": f"a{i}", "n": i * 1.5} for i in range(50)]
    path = write_json(tmp_path / "a.json", rows)
    got = list(iter_raw(path))
    assert [o for _, o in got] == rows
    assert got[3][0] == f"{path}: record 3 (line 17)"  # indent=2: each record spans 5 lines after '['


def test_json_array_compact_and_bom(tmp_path):
    p = tmp_path / "a.json"
    p.write_bytes(b"\xef\xbb\xbf" + json.dumps(ALPACA).encode())
    assert [r.messages for r in load_records(str(p))][0] == USER_ASSISTANT


def test_sharegpt_messages_prompt_completion(tmp_path):
    rows = [
        {"conversations": [{"from": "system", "value": "S"}, {"from": "human", "value": "Add 2 and 3"},
                           {"from": "gpt", "value": "5"}]},
        {"messages": [{"role": "user", "content": "Add 2 and 3"}, {"role": "assistant", "content": "5"}]},
        {"prompt": "Add 2 and 3", "completion": "5"},
    ]
    recs = load_records(write_jsonl(tmp_path / "mix.jsonl", rows))
    assert recs[0].messages[0] == {"role": "system", "content": "S"}
    assert recs[0].messages[1:] == USER_ASSISTANT
    assert recs[1].messages == USER_ASSISTANT
    assert recs[2].messages == USER_ASSISTANT


def test_csv_with_quoted_multiline_and_json_cells(tmp_path):
    p = tmp_path / "d.csv"
    p.write_text('instruction,input,output\n"line one\nline two",,ok\nAdd 2 and 3,,5\n', encoding="utf-8")
    recs = load_records(str(p))
    assert recs[0].messages[0]["content"] == "line one\nline two"
    assert recs[1].messages == USER_ASSISTANT
    assert recs[1].source == f"{p}:4"  # the line where the row starts
    q = tmp_path / "m.csv"
    q.write_text('messages\n"[{""role"": ""user"", ""content"": ""Add 2 and 3""}, '
                 '{""role"": ""assistant"", ""content"": ""5""}]"\n', encoding="utf-8")
    assert load_records(str(q))[0].messages == USER_ASSISTANT


def test_tsv(tmp_path):
    p = tmp_path / "d.tsv"
    p.write_text("prompt\tcompletion\nAdd 2 and 3\t5\n", encoding="utf-8")
    assert load_records(str(p))[0].messages == USER_ASSISTANT


def test_parquet_nested_and_scalar_columns(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist([{"id": 7, "messages": USER_ASSISTANT},
                                  {"id": 8, "messages": USER_ASSISTANT}])
    pq.write_table(table, tmp_path / "d.parquet")
    recs = load_records(str(tmp_path / "d.parquet"))
    assert [r.raw["id"] for r in recs] == [7, 8]
    assert recs[1].messages == USER_ASSISTANT
    assert recs[1].source.endswith("d.parquet: row 1")


def _llamafactory_dir(tmp_path):
    d = tmp_path / "lf"
    d.mkdir()
    write_json(d / "qa.json", [{"q": "Add 2 and 3", "ctx": "", "a": "5", "sys": "Be brief.",
                                "hist": [["hi", "hello"]]}])
    write_jsonl(d / "chat.jsonl", [{"dialog": [{"speaker": "me", "text": "Add 2 and 3"},
                                               {"speaker": "bot", "text": "5"}], "sp": "S"}])
    (d / "dataset_info.json").write_text(json.dumps({
        "qa": {"file_name": "qa.json", "formatting": "alpaca",
               "columns": {"prompt": "q", "query": "ctx", "response": "a", "system": "sys", "history": "hist"}},
        "chat": {"file_name": "chat.jsonl", "formatting": "sharegpt",
                 "columns": {"messages": "dialog", "system": "sp"},
                 "tags": {"role_tag": "speaker", "content_tag": "text", "user_tag": "me", "assistant_tag": "bot"}},
        "remote": {"hf_hub_url": "someone/data"},
    }), encoding="utf-8")
    return d


def test_llamafactory_alpaca_column_mapping(tmp_path):
    d = _llamafactory_dir(tmp_path)
    (rec,) = load_records(f"{d}:qa")
    assert rec.messages == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
                            {"role": "assistant", "content": "hello"}] + USER_ASSISTANT


def test_llamafactory_sharegpt_tags_and_mixing(tmp_path):
    d = _llamafactory_dir(tmp_path)
    recs = load_records([f"{d}:chat,qa", write_jsonl(tmp_path / "x.jsonl", ALPACA[:1])])
    assert recs[0].messages == [{"role": "system", "content": "S"}] + USER_ASSISTANT
    assert recs[1].source.startswith(str(d / "qa.json"))
    assert recs[2].messages == USER_ASSISTANT
    assert len(recs) == 3


def test_llamafactory_errors_name_the_users_columns(tmp_path):
    d = _llamafactory_dir(tmp_path)
    write_jsonl(d / "chat.jsonl", [{"dialog": [{"speaker": "them", "text": "x"}]}])
    with pytest.raises(DataError, match=r"chat.jsonl:1: field 'dialog\[0\].speaker' is 'them'"):
        load_records(f"{d}:chat")
    with pytest.raises(DataError, match="no dataset named 'nope'.*chat, qa, remote"):
        resolve_sources(f"{d}:nope")
    with pytest.raises(DataError, match="hf_hub_url datasets are not supported"):
        resolve_sources(f"{d}:remote")
    with pytest.raises(DataError, match="holds several datasets"):
        resolve_sources(str(d))


def test_llamafactory_single_dataset_dir_without_name(tmp_path):
    d = tmp_path / "one"
    d.mkdir()
    write_jsonl(d / "t.jsonl", ALPACA)
    (d / "dataset_info.json").write_text(json.dumps({"t": {"file_name": "t.jsonl"}}))
    assert len(load_records(str(d))) == 2


def test_jsonl_is_streamed_not_read_whole(tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", ALPACA * 3 + [{"bad": 1}])
    it = iter_examples(path)
    assert next(it).messages == USER_ASSISTANT  # the bad last line has not been reached yet
    with pytest.raises(DataError, match=r"a.jsonl:7: unknown record format"):
        list(it)


def test_load_records_limit(tmp_path):
    assert len(load_records(write_jsonl(tmp_path / "a.jsonl", ALPACA * 5), limit=3)) == 3

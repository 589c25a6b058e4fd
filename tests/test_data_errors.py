"""Malformed inputs: one clear error naming the line, a non-zero exit, nothing written (library and CLI)."""
import json
import os

import pytest

from roctune.cli import main
from roctune.data.records import load_records
from roctune.errors import DataError

GOOD = '{"instruction": "q", "output": "a"}\n'


def files_in(d):
    return sorted(os.listdir(d))


@pytest.fixture
def bad_files(tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    (d / "truncated.json").write_text('[\n  {"instruction": "q", "output": "a"},\n  {"instruction": "q2", "out',
                                      encoding="utf-8")
    (d / "badline.jsonl").write_text(GOOD + GOOD + '{"instruction": "q", "output": "a"\n' + GOOD, encoding="utf-8")
    (d / "types.jsonl").write_text(GOOD + '{"instruction": "q", "output": 5}\n', encoding="utf-8")
    (d / "latin1.jsonl").write_bytes(GOOD.encode() * 2 + '{"instruction": "caf\u00e9", "output": "a"}\n'.encode("latin-1"))
    (d / "latin1.json").write_bytes(b'[\n{"instruction": "q", "output": "a"},\n{"instruction": "caf\xe9", "output": "a"}]')
    (d / "empty.jsonl").write_text("", encoding="utf-8")
    (d / "blank.json").write_text("  \n", encoding="utf-8")
    (d / "empty_array.json").write_text("[]", encoding="utf-8")
    (d / "cells.csv").write_text('instruction,output\nq,a\nq,a,extra\n', encoding="utf-8")
    return d


EXPECTED = {
    "truncated.json": r"truncated.json:3: invalid JSON .*record 1.*looks truncated",
    "badline.jsonl": r"badline.jsonl:3: invalid JSON",
    "types.jsonl": r"types.jsonl:2: field 'output' must be a string, got int",
    "latin1.jsonl": r"latin1.jsonl:3: not UTF-8",
    "latin1.json": r"latin1.json:3: not UTF-8",
    "empty.jsonl": r"empty.jsonl: the file is empty",
    "blank.json": r"blank.json: the file is empty",
    "empty_array.json": r"empty_array.json: no examples",
    "cells.csv": r"cells.csv:3: 3 cells but the header has 2 columns",
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_library_error_names_the_line(bad_files, name):
    with pytest.raises(DataError, match=EXPECTED[name]):
        load_records(str(bad_files / name))


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_cli_check_lists_error_and_exits_1(bad_files, name, capsys):
    assert main(["data", "check", str(bad_files / name)]) == 1
    out = capsys.readouterr().out
    assert "Schema errors" in out
    rc = main(["data", "check", "--json", str(bad_files / name)])
    report = json.loads(capsys.readouterr().out)
    assert rc == 1 and report["schema_errors"]["count"] >= 1
    import re
    assert re.search(EXPECTED[name], report["schema_errors"]["first"][0])


@pytest.mark.parametrize("name", ["truncated.json", "badline.jsonl", "latin1.jsonl", "latin1.json", "empty.jsonl",
                                  "cells.csv"])
def test_cli_scrub_fails_and_writes_nothing(bad_files, name, tmp_path, capsys):
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    rc = main(["data", "scrub", str(bad_files / name), str(out_dir / name), "--report", str(out_dir / "r.json")])
    assert rc == 2
    err = capsys.readouterr().err
    assert err.startswith("roctune data: error: ") and err.count("\n") == 1
    assert name.split(".")[0] in err
    assert files_in(out_dir) == []  # no output, no report, no temporary file left behind


@pytest.mark.parametrize("name", ["truncated.json", "badline.jsonl", "types.jsonl", "latin1.jsonl", "empty.jsonl"])
def test_cli_split_fails_and_writes_nothing(bad_files, name, tmp_path, capsys):
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    rc = main(["data", "split", str(bad_files / name), "--eval-ratio", "0.5", "--seed", "1",
               "--out-train", str(out_dir / "t.jsonl"), "--out-eval", str(out_dir / "e.jsonl")])
    assert rc == 2
    assert "roctune data: error:" in capsys.readouterr().err
    assert files_in(out_dir) == []


def test_bad_line_in_the_middle_is_reported_and_the_rest_still_checked(bad_files, capsys):
    assert main(["data", "check", "--json", str(bad_files / "badline.jsonl")]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["records"] == 4 and report["valid"] == 3


def test_load_records_lists_the_first_five_errors_across_files(tmp_path):
    a = tmp_path / "a.jsonl"
    a.write_text(GOOD + '{"instruction": "q"}\n' + "{nope\n" + GOOD, encoding="utf-8")
    b = tmp_path / "b.json"
    b.write_text(json.dumps([{"prompt": "p"}, {"messages": []}, {"output": 1}, {"conversations": [{"from": "x"}]}]),
                 encoding="utf-8")
    with pytest.raises(DataError) as e:
        load_records([str(a), str(b)])
    msg = str(e.value)
    lines = msg.splitlines()
    assert "first 5" in lines[0]
    assert f"{a}:2: missing field 'output'" in lines[1]
    assert f"{a}:3: invalid JSON" in lines[2]
    assert f"{b}: record 0 (line 1): missing field 'completion'" in lines[3]
    assert "record 1" in lines[4] and "'messages'" in lines[4]
    assert "record 2" in lines[5] and "'instruction'" in lines[5]
    assert "record 3" not in msg


def test_missing_file_and_directory(tmp_path, capsys):
    assert main(["data", "check", str(tmp_path / "nope.jsonl")]) == 2
    assert "no such file" in capsys.readouterr().err
    with pytest.raises(DataError, match="directory without dataset_info.json"):
        load_records(str(tmp_path))


def turn(role, content="x"):
    return {"role": role, "content": content}


# Conversations with roles out of order: refused with the record's line and the turn that is wrong. Line 1 is
# a good record each time, so the location is checked, not just the message.
ROLE_ORDER = {
    "two users in a row": ([turn("system"), turn("user"), turn("user"), turn("assistant")],
                           r"d.jsonl:2: messages: roles must alternate user/assistant \(turn 2 is 'user' after 'user'\)"),
    "two answers in a row": ([turn("user"), turn("assistant"), turn("assistant")],
                             r"d.jsonl:2: messages: roles must alternate user/assistant "
                             r"\(turn 2 is 'assistant' after 'assistant'\)"),
    "system in the middle": ([turn("user"), turn("assistant"), turn("system"), turn("user"), turn("assistant")],
                             r"d.jsonl:2: messages: a system turn can only come first \(turn 2 is 'system'\)"),
    "ends with a user turn": ([turn("user"), turn("assistant"), turn("user")],
                              r"d.jsonl:2: messages: the conversation must end with an assistant turn "
                              r"\(turn 2 is 'user'\)"),
}


@pytest.fixture(params=sorted(ROLE_ORDER))
def out_of_order(request, tmp_path):
    msgs, expected = ROLE_ORDER[request.param]
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"messages": [turn("user"), turn("assistant")]}) + "\n"
                    + json.dumps({"messages": msgs}) + "\n", encoding="utf-8")
    return str(path), expected


def test_load_records_refuses_roles_out_of_order(out_of_order):
    path, expected = out_of_order
    with pytest.raises(DataError, match=expected):
        load_records(path)


def test_cli_check_refuses_roles_out_of_order(out_of_order, capsys):
    import re

    path, expected = out_of_order
    assert main(["data", "check", path]) == 1
    assert re.search(expected, capsys.readouterr().out.replace("\n", ""))
    assert main(["data", "check", "--json", path]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["valid"] == 1 and report["schema_errors"]["count"] == 1
    assert re.search(expected, report["schema_errors"]["first"][0])


def test_sharegpt_roles_are_checked_after_mapping(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"conversations": [{"from": "human", "value": "q"}, {"from": "user", "value": "q"},
                                                  {"from": "gpt", "value": "a"}]}) + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"d.jsonl:1: conversations: roles must alternate user/assistant "
                                        r"\(turn 1 is 'user' after 'user'\)"):
        load_records(str(path))


def test_well_ordered_conversations_and_generation_prompts_still_pass(tmp_path):
    from roctune.data.formats import to_messages

    good = [turn("system"), turn("user"), turn("assistant"), turn("user"), turn("assistant")]
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"messages": good}) + "\n"
                    + json.dumps({"messages": good[1:], "system": "be brief"}) + "\n", encoding="utf-8")
    records = load_records(str(path))
    assert [m["role"] for m in records[1].messages] == ["system", "user", "assistant", "user", "assistant"]
    # a prompt read for `roctune generate` may end with the user turn to answer
    assert to_messages({"messages": good[:4]}, "p")[-1]["role"] == "user"

"""`roctune data scrub`: each PII type with true cases and look-alikes that must stay; file formats kept."""
import json
import os

import pytest

from roctune.cli import main
from roctune.errors import ConfigError
from roctune.data.pii import Scrubber, bank_card_valid, id_card_valid, luhn_valid
from roctune.data.scrub import scrub_file

ID_OK = "11010519491231002X"        # check digit X is right
ID_OK2 = "440308199901011234"       # check digit 4 is right
ID_BAD = "110105194912310021"       # wrong check digit
ID_15 = "110105491231002"           # legacy 15-digit (born 1949-12-31)
CARD16 = "6222021234567894"         # passes Luhn
CARD19 = "6222021234567890128"      # passes Luhn
VISA = "4111111111111111"
CARD_BAD = "6222021234567895"       # fails Luhn
ID_OK_FULLWIDTH = ID_OK.translate(str.maketrans("0123456789", "０１２３４５６７８９"))


def test_validators():
    assert id_card_valid(ID_OK) and id_card_valid(ID_OK.lower()) and id_card_valid(ID_OK2) and id_card_valid(ID_15)
    assert not id_card_valid(ID_BAD)
    assert not id_card_valid("991231194912310025")  # no such region
    assert luhn_valid(CARD16) and luhn_valid(CARD19) and not luhn_valid(CARD_BAD)
    assert bank_card_valid("6222 0212 3456 7894") and not bank_card_valid(CARD_BAD)


TRUE_CASES = [
    ("phone", "我的手机是13812345678，请回电", "我的手机是<PHONE>，请回电"),
    ("phone", "call +86 138-1234-5678 now", "call <PHONE> now"),
    ("phone", "tel 86 139 1234 5678", "tel <PHONE>"),
    ("phone", "号码：+8615912345678。", "号码：<PHONE>。"),
    ("phone", "(+86)13812345678", "(+86)<PHONE>"),
    ("phone", "tel:008613812345678", "tel:<PHONE>"),
    ("id_card", f"身份证号{ID_OK}。", "身份证号<ID_CARD>。"),
    ("id_card", f"id: {ID_OK.lower()}", "id: <ID_CARD>"),
    ("id_card", f"ID {ID_OK2}", "ID <ID_CARD>"),
    ("id_card", f"旧身份证{ID_15}", "旧身份证<ID_CARD>"),
    ("bank_card", f"卡号{CARD16}", "卡号<BANK_CARD>"),
    ("bank_card", "card 6222 0212 3456 7894 please", "card <BANK_CARD> please"),
    ("bank_card", "6222-0212-3456-7894", "<BANK_CARD>"),
    ("bank_card", f"19位卡号{CARD19}", "19位卡号<BANK_CARD>"),
    ("bank_card", f"visa {VISA}.", "visa <BANK_CARD>."),
    ("email", "写信到zhang.san+ml@mail.example.com.cn吧", "写信到<EMAIL>吧"),
    ("email", "Contact: Jane_Doe@Example.org.", "Contact: <EMAIL>."),
    ("ip", "服务器192.168.1.20宕机了", "服务器<IP>宕机了"),
    ("ip", "ping 8.8.8.8, then 10.0.0.1", "ping <IP>, then <IP>"),
    ("landline", "电话010-62345678转", "电话<LANDLINE>转"),
    ("landline", "(0755)23456789", "<LANDLINE>"),
    ("landline", "总机 0571 87654321-123", "总机 <LANDLINE>"),
    ("landline", "+86 021-62345678", "<LANDLINE>"),
    # a space inside the subscriber number (4+4, or 3+4 for a 7-digit number)
    ("landline", "电话0755-8888 9999转", "电话<LANDLINE>转"),
    ("landline", "tel 010 6234 5678.", "tel <LANDLINE>."),
    ("landline", "(0755)8888 9999-12", "<LANDLINE>"),
    ("landline", "总机0571-876 5432", "总机<LANDLINE>"),
    # dialled from abroad: +86 and the area code without its leading 0
    ("landline", "北京+86 10 6552 9988", "北京<LANDLINE>"),
    ("landline", "+86-755-88889999", "<LANDLINE>"),
    ("landline", "+86 (21) 62345678", "<LANDLINE>"),
    # full-width digits
    ("phone", "手机１３８００１３８０００。", "手机<PHONE>。"),
    ("phone", "+86 １３８ ００１３ ８０００", "<PHONE>"),
    ("id_card", f"身份证{ID_OK_FULLWIDTH}", "身份证<ID_CARD>"),
    ("bank_card", "卡号６２２２０２１２３４５６７８９４", "卡号<BANK_CARD>"),
    ("landline", "电话０１０-６２３４５６７８", "电话<LANDLINE>"),
    ("ip", "ip １９２.１６８.１.２０ ok", "ip <IP> ok"),
]


@pytest.mark.parametrize("kind,text,expected", TRUE_CASES)
def test_redacts(kind, text, expected):
    s = Scrubber()
    assert s.text(text) == expected
    assert s.counts[kind] == expected.count(f"<{kind.upper()}>") >= 1
    assert sum(s.counts.values()) == s.counts[kind]


LOOKALIKES = [
    "订单号2023100112345678已发货",           # order number (16 digits, fails the card prefix rule)
    "order ORD13812345678 shipped",           # glued to letters
    "order #138123456789",                    # 12 digits, not a phone
    "timestamp 1696118400 / 1696118400123",    # Unix seconds and milliseconds
    "2023-10-01 12:30:45",                     # date and time
    "20231001123045",                          # compact timestamp
    "价格¥13800.00，优惠价13812345678.00元",   # prices
    "version 1.2.3.4, v2.10.0.1 and 版本 3.1.4.1",  # version strings
    "Python 3.12.1 and 1.2.3.4.5",              # version and a 5-part number
    "10.0.0.256 and 010.1.1.1",                 # not valid IPv4 octets
    f"身份证{ID_BAD}",                          # 18 digits, wrong check digit
    f"卡号{CARD_BAD}",                          # card-like, fails Luhn
    "1234567890123456",                         # 16 digits, no card prefix
    "isbn 978-7-111-12345-6 and 0.5-1234",      # other dashes
    "user@localhost and @handle",               # no domain
    "a12345678901 and 12345678901b",            # glued on either side
    "0755-8888 99999 and 0755-8888 999",         # landline-like groups of the wrong length
    "0755-88 889999 and 2023-1234 5678",         # grouped otherwise; no area code
    "+86 10 1234 5678 and +86 12 62345678",      # local numbers start 2-9; no area code 12
    "+86 10 6552 99881 and +86 1065529988",      # too long; area code not set apart
    "编号 10 6552 9988",                          # no +86 before an area code without its 0
    "１３８００１３８０００１ and 订单１２３４５６７８９０１２",  # full-width: 12 digits, an order number
    "价格１３８００元，ＡＢ１３８００１３８０００",        # full-width: a price, glued to full-width letters
]


@pytest.mark.parametrize("text", LOOKALIKES)
def test_keeps_lookalikes(text):
    s = Scrubber()
    assert s.text(text) == text
    assert sum(s.counts.values()) == 0


def test_types_subset_and_unknown_type():
    s = Scrubber(["email"])
    assert s.text("a@b.com 13812345678") == "<EMAIL> 13812345678"
    with pytest.raises(ConfigError, match="unknown type 'passport'"):
        Scrubber(["passport"])


def test_jsonl_keeps_format_and_non_text_fields(tmp_path):
    src = tmp_path / "in.jsonl"
    lines = ['{"id": 1, "score": 0.5, "instruction": "hi", "output": "no pii here"}\n',
             '\n',
             '{"id": 2, "tags": ["a", "b@c.io"], "messages": [{"role": "user", "content": "call 13812345678"}, '
             '{"role": "assistant", "content": "ok"}], "ok": true, "n": null}\n',
             '{"id":3,"instruction":"x","output":"\\u4f60\\u597d"}\n']
    src.write_text("".join(lines), encoding="utf-8")
    before = src.read_bytes()
    out = tmp_path / "out.jsonl"
    report = scrub_file(str(src), str(out))
    assert src.read_bytes() == before
    got = out.read_text(encoding="utf-8").splitlines(keepends=True)
    assert got[0] == lines[0] and got[1] == "\n" and got[3] == lines[3]  # untouched lines stay byte for byte
    rec = json.loads(got[2])
    assert rec == {"id": 2, "tags": ["a", "<EMAIL>"], "messages": [{"role": "user", "content": "call <PHONE>"},
                   {"role": "assistant", "content": "ok"}], "ok": True, "n": None}
    assert report["counts"]["phone"] == 1 and report["counts"]["email"] == 1
    assert report["records"] == 3 and report["records_changed"] == 1


def test_jsonl_full_width_digits_are_found_on_raw_lines(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"instruction": "手机１３８００１３８０００", "output": "价格１３８００元"},
                              ensure_ascii=False) + "\n", encoding="utf-8")
    report = scrub_file(str(src), str(tmp_path / "out.jsonl"))
    assert json.loads((tmp_path / "out.jsonl").read_text(encoding="utf-8")) == {
        "instruction": "手机<PHONE>", "output": "价格１３８００元"}
    assert report["counts"]["phone"] == 1


def test_json_array_csv_parquet_keep_their_format(tmp_path):
    rows = [{"id": 1, "instruction": "mail me at a@b.com", "output": "ok", "score": 1.5},
            {"id": 2, "instruction": "plain", "output": "ip 10.1.2.3", "score": 2.0}]
    (tmp_path / "in.json").write_text(json.dumps(rows, indent=2), encoding="utf-8")
    scrub_file(str(tmp_path / "in.json"), str(tmp_path / "out.json"))
    got = json.loads((tmp_path / "out.json").read_text(encoding="utf-8"))
    assert got[0] == {**rows[0], "instruction": "mail me at <EMAIL>"} and got[1]["output"] == "ip <IP>"

    (tmp_path / "in.csv").write_text("id,instruction,output\n1,\"call 13812345678, now\",ok\n2,x,y\n",
                                     encoding="utf-8")
    scrub_file(str(tmp_path / "in.csv"), str(tmp_path / "out.csv"))
    assert (tmp_path / "out.csv").read_text(encoding="utf-8").splitlines() == [
        "id,instruction,output", '1,"call <PHONE>, now",ok', "2,x,y"]

    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist([{"id": 1, "messages": [{"role": "user", "content": f"卡号{CARD16}"},
                                                         {"role": "assistant", "content": "ok"}], "w": 0.25}])
    pq.write_table(table, tmp_path / "in.parquet")
    report = scrub_file(str(tmp_path / "in.parquet"), str(tmp_path / "out.parquet"))
    out = pq.read_table(tmp_path / "out.parquet")
    assert out.schema == table.schema
    assert out.to_pylist()[0]["messages"][0]["content"] == "卡号<BANK_CARD>"
    assert out.to_pylist()[0]["id"] == 1 and report["counts"]["bank_card"] == 1


def test_cli_report_and_refuses_in_place(tmp_path, capsys):
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"instruction": f"{ID_OK} a@b.com", "output": "010-62345678"}) + "\n")
    assert main(["data", "scrub", str(src), str(tmp_path / "o.jsonl"), "--report", str(tmp_path / "r.json"),
                 "--types", "id_card,email", "landline"]) == 0
    assert "<ID_CARD>" in capsys.readouterr().out
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["counts"] == {"email": 1, "id_card": 1, "landline": 1}
    assert main(["data", "scrub", str(src), str(src)]) == 2
    assert "never edits in place" in capsys.readouterr().err
    assert main(["data", "scrub", str(src), str(tmp_path / "x.jsonl"), "--types", "passport"]) == 2
    assert sorted(os.listdir(tmp_path)) == ["in.jsonl", "o.jsonl", "r.json"]

"""Images in the data (issue 48): the three layouts read into the same conversation, and every refusal as one line
naming the file, line and field, before any model loads (`roctune train` exits 2 and writes nothing): a missing or
unreadable image, a count of <image> tags that differs from the images, an image for a text model, an image too large
in bytes or pixels (a decompression bomb refused from its header), a URL roctune would have to fetch, a broken data
URL, a pipe instead of a file; and truncation that never cuts an image's tokens."""
from __future__ import annotations

import base64
import json
import os
import struct
import zlib

import pytest

from conftest import write_jsonl
from test_hostile import refused

CHAT = "<image>What colour is this?"


def _png(path, size=(40, 36), colour=(200, 20, 20)):
    from PIL import Image

    Image.new("RGB", size, colour).save(path)
    return str(path)


def _forged_png(width: int, height: int) -> bytes:
    """A PNG whose header declares `width` x `height` pixels (valid CRCs, almost no data): a decompression bomb."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")


def _row(images, text=CHAT, answer="Red."):
    return {"messages": [{"role": "user", "content": text}, {"role": "assistant", "content": answer}],
            "images": images}


@pytest.fixture
def place(tmp_path, monkeypatch):
    """A working folder (the current directory) with a good image; `place(name, rows)` writes a data file."""
    monkeypatch.chdir(tmp_path)
    _png(tmp_path / "red.png")
    (tmp_path / "notes.txt").write_text("not an image")
    (tmp_path / "bomb.png").write_bytes(_forged_png(100_000, 100_000))

    def write(name, rows):
        return write_jsonl(tmp_path / name, rows)
    return write


def test_three_layouts_read_into_the_same_conversation(place, tmp_path):
    from roctune.data.records import load_records

    url = "data:image/png;base64," + base64.b64encode((tmp_path / "red.png").read_bytes()).decode()
    parts = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "What colour is this?"}]
    rows = [_row(["red.png"]),
            {"conversations": [{"from": "human", "value": CHAT}, {"from": "gpt", "value": "Red."}],
             "images": ["red.png"]},
            {"messages": [{"role": "user", "content": parts}, {"role": "assistant", "content": "Red."}]},
            {"messages": [{"role": "user", "content": [{"type": "image", "image": "red.png"}, parts[1]]},
                          {"role": "assistant", "content": "Red."}]}]
    records = load_records(place("d.jsonl", rows))
    assert all(r.messages == records[0].messages for r in records)
    assert records[0].messages[0]["content"] == CHAT and "images" not in records[2].messages[0]
    assert [(r.images[0].width, r.images[0].height, r.images[0].format) for r in records] == [(40, 36, "PNG")] * 4
    assert records[2].images[0].path is None and records[2].images[0].data.startswith(b"\x89PNG")


def test_llamafactory_dataset_info_images_column(tmp_path, monkeypatch):
    from roctune.data.records import load_records

    monkeypatch.chdir(tmp_path)
    (tmp_path / "mllm").mkdir()
    _png(tmp_path / "mllm" / "1.png")
    write_jsonl(tmp_path / "demo.json", [{"conversations": [{"from": "human", "value": CHAT},
                                                            {"from": "gpt", "value": "Red."}], "pics": ["mllm/1.png"]}])
    (tmp_path / "dataset_info.json").write_text(json.dumps({"demo": {
        "file_name": "demo.json", "formatting": "sharegpt", "columns": {"messages": "conversations", "images": "pics"}}}))
    [record] = load_records(f"{tmp_path}:demo")
    assert record.images[0].path == str(tmp_path / "mllm" / "1.png")


# (case, rows, what the one line names): each refused by `roctune train` before any model loads
BAD = [
    ("missing", [_row(["nope.png"])], "d.jsonl:1: field 'images[0]': image 'nope.png' not found"),
    ("unreadable", [_row(["notes.txt"])], "d.jsonl:1: field 'images[0]': image"),
    ("fewer-tags", [_row(["red.png", "red.png"])], "d.jsonl:1: field 'images' has 2 image(s) but the turns hold 1"),
    ("more-tags", [_row(["red.png"], "<image><image>Two?")], "the turns hold 2 <image> tag(s)"),
    ("bomb", [_row(["bomb.png"])], "d.jsonl:1: field 'images[0]': image"),
    ("http", [{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {
        "url": "https://example.com/a.png"}}]}, {"role": "assistant", "content": "Red."}]}],
     "d.jsonl:1: messages[0]: field 'content[0]': image URL 'https://example.com/a.png': roctune fetches nothing"),
    ("bad-base64", [{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {
        "url": "data:image/png;base64,@@@@"}}]}, {"role": "assistant", "content": "Red."}]}], "base64 does not decode"),
    ("device", [_row(["/dev/zero"])], "/dev/zero is not a regular file"),
    ("part-type", [{"messages": [{"role": "user", "content": [{"type": "video", "video": "v.mp4"}]},
                                 {"role": "assistant", "content": "Red."}]}], "part type 'video'"),
]


@pytest.mark.parametrize("case,rows,names", BAD, ids=[c[0] for c in BAD])
def test_bad_images_are_refused_in_one_line(case, rows, names, place, tiny_model_dir, capsys):
    place("d.jsonl", rows)
    line = refused(["train", "--model", tiny_model_dir, "--data", "d.jsonl", "--output", "run"], capsys, names)
    if case == "bomb":
        assert "pixels" in line and "scale it down" in line


def test_an_image_over_the_byte_limit_is_refused_before_it_is_read(place, tiny_model_dir, monkeypatch, capsys):
    from roctune.data import images

    monkeypatch.setattr(images, "MAX_IMAGE_BYTES", 100)
    place("d.jsonl", [_row(["red.png"])])
    line = refused(["train", "--model", tiny_model_dir, "--data", "d.jsonl", "--output", "run"], capsys,
                   "d.jsonl:1: field 'images[0]': image")
    assert "more than roctune reads (100 bytes)" in line
    url = "data:image/png;base64," + base64.b64encode(open("red.png", "rb").read()).decode()
    place("u.jsonl", [{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]},
                                    {"role": "assistant", "content": "Red."}]}])
    refused(["train", "--model", tiny_model_dir, "--data", "u.jsonl", "--output", "run"], capsys,
            "u.jsonl:1: messages[0]: field 'content[0]': the data URL holds more than 100 bytes")


def test_data_check_lists_every_bad_image_as_a_schema_error(place, capsys):
    """`data check` reads on past a bad image: each is a schema error with its line (exit 1), the good ones count."""
    from roctune.cli import main

    place("d.jsonl", [_row(["red.png"]), _row(["nope.png"]), _row(["red.png", "red.png"]), _row(["bomb.png"])])
    assert main(["data", "check", "d.jsonl", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert [e.split(": field")[0] for e in report["schema_errors"]["first"]] == [
        f"{os.getcwd()}/d.jsonl:{n}" if report["schema_errors"]["first"][0].startswith("/") else f"d.jsonl:{n}"
        for n in (2, 3, 4)]
    assert report["images"] == {"images": 1, "records_with_images": 1, "max_per_record": 1, "tokens_per_image": None}


def test_one_question_about_different_pictures_is_no_repeat(place, tmp_path, capsys):
    """The pictures belong to the prompt: one question about two different pictures is neither a repeat nor a
    conflict in `data check`, and `data split` keeps both (it dropped all but one as duplicates); the same picture
    under another name is a repeat."""
    from roctune.cli import main

    _png(tmp_path / "blue.png", colour=(20, 20, 200))
    (tmp_path / "red-again.png").write_bytes((tmp_path / "red.png").read_bytes())
    place("d.jsonl", [_row(["red.png"]), _row(["blue.png"], answer="Blue."), _row(["red-again.png"])])
    assert main(["data", "check", "d.jsonl", "--json"]) == 0
    warnings = json.loads(capsys.readouterr().out)["warnings"]
    assert warnings["duplicates"]["count"] == 1 and warnings["duplicates"]["examples"][0].startswith(
        ("d.jsonl:3 repeats d.jsonl:1", f"{tmp_path}/d.jsonl:3 repeats"))
    assert warnings["conflicts"]["count"] == 0
    assert main(["data", "split", "d.jsonl", "--out-train", "t.jsonl", "--out-eval", "e.jsonl",
                 "--eval-ratio", "0.5"]) == 0
    kept = [json.loads(line)["images"] for f in ("t.jsonl", "e.jsonl") for line in open(f, encoding="utf-8")]
    assert sorted(kept) == [["blue.png"], ["red.png"]]


def test_a_pictures_hash_is_taken_when_it_is_read(tmp_path):
    """The duplicate checks' hash of a picture comes from the bytes read to check it: the file is not read again
    (removed after reading, it still hashes), and the same bytes as a file or a data URL hash alike."""
    from roctune.data.images import ImageRef, read_image

    path = _png(tmp_path / "red.png")
    raw = (tmp_path / "red.png").read_bytes()
    from_file = read_image("red.png", [str(tmp_path)], "d.jsonl:1")
    from_url = read_image(f"data:image/png;base64,{base64.b64encode(raw).decode()}", [str(tmp_path)], "d.jsonl:2")
    by_hand = ImageRef(path, 40, 36, "PNG", path=path)  # made without read_image: its file is read to hash it
    assert by_hand.content_hash() == from_file.content_hash()
    os.remove(tmp_path / "red.png")
    assert from_file.content_hash() == from_url.content_hash()
    _png(tmp_path / "blue.png", colour=(20, 20, 200))
    assert read_image("blue.png", [str(tmp_path)], "d.jsonl:3").content_hash() != from_url.content_hash()


def test_the_bundled_vision_example_is_clean(capsys):
    """examples/vision_shapes*.jsonl (scripts/make_vision_example.py): every picture reads, no record repeats
    another or the held-out split, no question has two answers; the training split asks the shape four times in
    five, the held-out split colours and shapes equally."""
    from roctune.cli import main

    examples = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
    train, heldout = (os.path.join(examples, f) for f in ("vision_shapes.jsonl", "vision_shapes_heldout.jsonl"))
    assert main(["data", "check", train, "--eval", heldout, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["valid"] == 1260 and report["schema_errors"]["count"] == 0
    assert {k: w["count"] for k, w in report["warnings"].items()} == {
        "empty_fields": 0, "duplicates": 0, "near_duplicates": 0, "conflicts": 0, "answer_equals_prompt": 0,
        "eval_overlap": 0}
    shapes = {"Circle.", "Square.", "Triangle."}
    for path, share in ((train, 0.8), (heldout, 0.5)):
        answers = [json.loads(line)["messages"][-1]["content"] for line in open(path, encoding="utf-8")]
        assert sum(a in shapes for a in answers) == share * len(answers)


def test_train_refuses_images_for_a_text_model_before_it_loads(place, tiny_model_dir, capsys):
    place("d.jsonl", [_row(["red.png"])])
    refused(["train", "--model", tiny_model_dir, "--data", "d.jsonl", "--output", "run"], capsys,
            "d.jsonl:1: the record has images, but")


def test_train_refuses_a_missing_image_and_vision_flags_on_a_text_model(place, tiny_model_dir, capsys):
    place("d.jsonl", [_row(["nope.png"])])
    refused(["train", "--model", tiny_model_dir, "--data", "d.jsonl", "--output", "run"], capsys,
            "d.jsonl:1: field 'images[0]': image 'nope.png' not found")
    place("t.jsonl", [{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]}])
    refused(["train", "--model", tiny_model_dir, "--data", "t.jsonl", "--output", "run", "--train-projector"], capsys,
            "--train-projector: ")
    assert not os.path.exists("run")

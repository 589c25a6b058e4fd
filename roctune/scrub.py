"""`roctune data scrub`: find personal data in every text field and replace it with a typed placeholder.

Each type is a regular expression for candidates plus a validator, so look-alikes stay: an 18-digit number
must carry a valid GB 11643-1999 check digit (and a real region and birth date) to be an ID card, a card
number must pass the Luhn check, a mobile number must be a whole number starting 13-19, an IPv4 address
must have four octets 0-255 and not be part of a version string. Numbers glued to letters or other digits
(order numbers, hashes, timestamps) never match because every pattern requires a boundary on both sides.
"""
from __future__ import annotations

import datetime
import json
import os
import re
from collections import Counter
from typing import Any

from roctune.datacheck import RecordWriter, atomic_path, iter_raw_records, same_file
from roctune.data import fast_jsonl_object, file_kind, parse_jsonl_line
from roctune.errors import ConfigError, DataError

PLACEHOLDERS = {
    "email": "<EMAIL>",
    "id_card": "<ID_CARD>",
    "bank_card": "<BANK_CARD>",
    "phone": "<PHONE>",
    "landline": "<LANDLINE>",
    "ip": "<IP>",
}
TYPES = tuple(PLACEHOLDERS)

# Every pattern starts with a character class (so the regex engine jumps between candidates in C) and then
# checks with a fixed-width lookbehind that no letter, digit, '_', '.' or '+' came right before it; the
# lookahead _R rejects a letter, digit or '_' right after, and a decimal part.
_X = r"[0-9A-Za-z_.+]"
_R = r"(?![0-9A-Za-z_]|\.[0-9])"
_EMAIL = re.compile(r"[A-Za-z0-9](?<![A-Za-z0-9._%+-][A-Za-z0-9])[A-Za-z0-9._%+-]*"  # local part
                    r"@[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"  # first domain label
                    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*\.[A-Za-z]{2,24}(?![A-Za-z0-9-])")
_LOCAL = r"[2-9][0-9]{6,7}(?:-[0-9]{1,5})?"  # landline local number, optional extension
# One pass finds every numeric candidate (IP addresses included); the named group says which shape
# matched, the validators decide.
_NUMBER = re.compile(
    r"[0-9+(](?<!" + _X + r".)(?:"
    r"(?P<id>(?<=[0-9])[0-9]{14}(?:[0-9][0-9][0-9Xx])?" + _R + r")"
    r"|(?P<bank>(?<=[2-6])[0-9]{3}(?:[ -][0-9]{4}){3}[ -][0-9]{1,3}" + _R
    + r"|(?<=[2-6])[0-9]{3}(?:[ -]?[0-9]{4}){2}[ -]?[0-9]{4,7}" + _R + r")"
    r"|(?P<phone>(?:(?<=\+)86|(?<=0)086|(?<=8)6)[ -]?1[3-9][0-9](?:[ -]?[0-9]{4}){2}" + _R
    + r"|(?<=1)[3-9][0-9](?:[ -]?[0-9]{4}){2}" + _R + r")"
    r"|(?P<ip>(?<=[0-9])[0-9]{0,2}(?:\.[0-9]{1,3}){3}" + _R + r")"
    r"|(?P<landline>(?:(?<=\+)86[ -]?(?:\(0[0-9]{2,3}\)[ -]?|0[0-9]{2,3}[- ])"
    r"|(?<=\()0[0-9]{2,3}\)[ -]?|(?<=0)[0-9]{2,3}[- ])"
    + _LOCAL + _R + r")"
    r")")
_PHONE_15 = re.compile(r"00861[3-9][0-9]{9}")
# Cheap tests (each starts with a class, so the engine scans in C) that a string may hold something at all:
# 7 digits in a row, a grouped number or the start of an IP address.
_HINT = re.compile(r"[0-9](?:[0-9]{6}|[ -][0-9]{4}|\)[0-9]|\.[0-9]{1,3}\.[0-9])")
# The same on a raw JSON Lines line; `_line_may_match` adds '@' (e-mail) and '\u' (an escape could hide anything).
LINE_HINT = re.compile(rb"[0-9](?:[0-9]{6}|[ -][0-9]{4}|\)[0-9]|\.[0-9]{1,3}\.[0-9])")
_VERSION_BEFORE = re.compile(r"(?:\b(?:v|ver|version|release|build|rev)|版本|版本号)[\s:：=]*$", re.IGNORECASE)

_ID_WEIGHTS = (7, 9, 10, 5, 8, 4, 2, 1, 6, 3, 7, 9, 10, 5, 8, 4, 2)
_ID_CHECK = "10X98765432"
_PROVINCES = {11, 12, 13, 14, 15, 21, 22, 23, 31, 32, 33, 34, 35, 36, 37, 41, 42, 43, 44, 45, 46, 50, 51, 52,
              53, 54, 61, 62, 63, 64, 65, 71, 81, 82, 83}


def _valid_date(year: int, month: int, day: int) -> bool:
    try:
        d = datetime.date(year, month, day)
    except ValueError:
        return False
    return d <= datetime.date.today()


def id_card_shape(digits: str) -> bool:
    """A real region code and birth date (what a number needs to look like an ID card at all)."""
    if int(digits[:2]) not in _PROVINCES:
        return False
    if len(digits) == 18:
        return 1900 <= int(digits[6:10]) and _valid_date(int(digits[6:10]), int(digits[10:12]), int(digits[12:14]))
    return _valid_date(1900 + int(digits[6:8]), int(digits[8:10]), int(digits[10:12]))


def id_card_valid(number: str) -> bool:
    """A mainland resident ID: 18 characters with the GB 11643-1999 check digit, or the 15-digit legacy form."""
    number = number.upper()
    if len(number) == 15:
        return number.isdigit() and id_card_shape(number)
    if len(number) != 18 or not number[:17].isdigit() or not id_card_shape(number):
        return False
    total = sum(int(c) * w for c, w in zip(number[:17], _ID_WEIGHTS))
    return _ID_CHECK[total % 11] == number[17]


def luhn_valid(digits: str) -> bool:
    total = 0
    for i, c in enumerate(reversed(digits)):
        d = ord(c) - 48
        if i % 2:
            d *= 2
            if d > 9:
                d -= 9
        total += d
    return total % 10 == 0


def bank_card_valid(number: str) -> bool:
    digits = number.replace(" ", "").replace("-", "")
    if not 16 <= len(digits) <= 19:
        return False
    if digits[0] == "2" and not 2221 <= int(digits[:4]) <= 2720:  # only the Mastercard 2-series starts with 2
        return False
    if not luhn_valid(digits):
        return False
    # An 18-digit number shaped like an ID card but with a wrong check digit is not a card number either.
    return not (len(digits) == 18 and id_card_shape(digits))


class Scrubber:
    """Redacts the chosen types in strings; counts what it replaced in `counts`."""

    def __init__(self, types: list[str] | tuple[str, ...] | None = None):
        types = list(types or TYPES)
        unknown = [t for t in types if t not in PLACEHOLDERS]
        if unknown:
            raise ConfigError(f"--types: unknown type {unknown[0]!r}; choose from {', '.join(TYPES)}")
        self.types = set(types)
        self._numbers = bool(self.types & {"id_card", "bank_card", "phone", "landline", "ip"})
        self.counts: Counter[str] = Counter()

    def _number(self, m: re.Match) -> str:
        text = m.group(0)
        kind = m.lastgroup
        if kind == "id":
            if "id_card" in self.types and id_card_valid(text):
                return self._hit("id_card")
            if len(text) == 18 and "bank_card" in self.types and bank_card_valid(text):
                return self._hit("bank_card")
            if "phone" in self.types and _PHONE_15.fullmatch(text):  # 0086 and a mobile number
                return self._hit("phone")
            return text
        if kind == "bank":
            if "bank_card" not in self.types:
                return text
            sep = text[4] if text[4] in " -" else ""
            if sep and text.count(sep) == 4:  # 4-4-4-4 then a short group: prefer the 16-digit reading
                head, _, tail = text.rpartition(sep)
                if bank_card_valid(head):
                    return self._hit("bank_card") + sep + tail
            return self._hit("bank_card") if bank_card_valid(text) else text
        if kind == "ip":
            return self._ip(m) if "ip" in self.types else text
        return self._hit(kind) if kind in self.types else text

    def _hit(self, kind: str) -> str:
        self.counts[kind] += 1
        return PLACEHOLDERS[kind]

    def _ip(self, m: re.Match) -> str:
        text, start = m.group(0), m.start()
        if any(len(o) > 1 and o[0] == "0" or int(o) > 255 for o in text.split(".")):
            return text
        if _VERSION_BEFORE.search(m.string, max(0, start - 12), start):
            return text
        return self._hit("ip")

    def text(self, s: str) -> str:
        """`s` with every match replaced by its placeholder."""
        types = self.types
        if "@" in s and "email" in types:
            s = _EMAIL.sub(lambda m: self._hit("email"), s)
        if self._numbers and len(s) >= 7 and _HINT.search(s):
            s = _NUMBER.sub(self._number, s)
        return s

    def value(self, v: Any) -> tuple[Any, bool]:
        """A JSON-like value with every string inside redacted (keys and non-text values untouched)."""
        if isinstance(v, str):
            new = self.text(v)
            return new, new != v
        if isinstance(v, dict):
            changed = False
            out = {}
            for k, x in v.items():
                out[k], c = self.value(x)
                changed |= c
            return (out, True) if changed else (v, False)
        if isinstance(v, list):
            changed = False
            out_list = []
            for x in v:
                y, c = self.value(x)
                out_list.append(y)
                changed |= c
            return (out_list, True) if changed else (v, False)
        return v, False


def _line_may_match(line: bytes) -> bool:
    return b"@" in line or b"\\u" in line or LINE_HINT.search(line) is not None


def _scrub_jsonl(inp: str, tmp: str, scrubber: Scrubber) -> tuple[int, int]:
    """Bytes in, bytes out: a line is parsed (to validate it) and re-serialised only if something in it
    was redacted, so every other line is copied exactly."""
    records = changed = 0
    dumps = json.dumps
    with open(inp, "rb", buffering=1 << 20) as f, open(tmp, "wb", buffering=1 << 20) as out:
        for lineno, line in enumerate(f, 1):
            obj = fast_jsonl_object(line)
            if obj is None:
                obj = parse_jsonl_line(line, inp, lineno)  # raises with the line number, or None if blank
                if obj is None:
                    out.write(line)
                    continue
            records += 1
            if not line.endswith(b"\n"):
                line += b"\n"
            if _line_may_match(line):
                new, c = scrubber.value(obj)
                if c:
                    changed += 1
                    line = (dumps(new, ensure_ascii=False) + "\n").encode("utf-8")
            out.write(line)
    return records, changed


def scrub_file(inp: str, out: str, types: list[str] | None = None) -> dict:
    """Write a redacted copy of `inp` to `out` in the same format; returns counts per type.

    Never edits in place; `out` appears only when the whole file was read and written without error.
    """
    kind = file_kind(inp)
    if same_file(inp, out):
        raise DataError(f"{out}: is the input file; scrub never edits in place, give a new output path")
    scrubber = Scrubber(types)
    records = changed = 0
    with atomic_path(out) as tmp:
        if kind == "jsonl":
            records, changed = _scrub_jsonl(inp, tmp, scrubber)
        else:
            fieldnames, schema, delimiter = None, None, ","
            if kind == "csv":
                import csv

                delimiter = "\t" if inp.lower().endswith(".tsv") else ","
                with open(inp, encoding="utf-8-sig", newline="") as f:
                    try:
                        fieldnames = next(csv.reader(f, delimiter=delimiter), None)
                    except UnicodeDecodeError:
                        raise DataError(f"{inp}:1: not UTF-8 text; re-save the file as UTF-8") from None
            elif kind == "parquet":
                import pyarrow.parquet as pq

                schema = pq.ParquetFile(inp).schema_arrow
            writer = RecordWriter(tmp, kind, fieldnames=fieldnames, schema=schema, delimiter=delimiter)
            for _where, _num, obj in iter_raw_records(inp):
                records += 1
                new, c = scrubber.value(obj)
                changed += c
                writer.write(new)
            writer.close()
    counts = {t: scrubber.counts.get(t, 0) for t in TYPES if t in scrubber.types}
    return {"input": inp, "output": out, "format": kind, "records": records, "records_changed": changed,
            "counts": counts, "total": sum(counts.values())}


def write_report(report: dict, path: str) -> None:
    with atomic_path(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(report, f, ensure_ascii=False, indent=2)
            f.write("\n")
    os.chmod(path, 0o644)
